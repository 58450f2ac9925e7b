"""Fixtures; the helpers the tests share are in ``helpers.py``."""

import os

import pytest

from helpers import horovod_installed, unavailable

@pytest.fixture
def horovod_required():
    """Use with ``@pytest.mark.usefixtures("horovod_required")``."""
    if not horovod_installed():
        unavailable("Horovod is not installed: `bash .ci/setup.sh` builds it",
                    deliberate=os.environ.get("HVD_DCASGD_WITHOUT_HOROVOD") == "1")

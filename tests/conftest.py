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


@pytest.fixture(params=["native", "torch-chunks"])
def fused_kernel(request, monkeypatch):
    """Run fused tests with the C kernel and with its torch fallback (on chunks of 1000 elements, so that their
    edges fall inside the vectors)."""
    from hvd_dcasgd.algorithm import dcasgd
    from hvd_dcasgd.common import native

    if request.param == "native":
        assert native.library() is not None, "the C kernel must build here (cc and OpenMP are installed)"
    else:
        monkeypatch.setattr(native, "library", lambda: None)
        monkeypatch.setattr(dcasgd, "FUSED_CHUNK", 1000)
    return request.param

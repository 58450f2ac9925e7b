"""Smoke test: the digits example trains in every mode, and every rank exits 0.

The accuracy floor says the example works end to end; it does not judge the
algorithm (a wrong sign in the compensation still trains digits above it).
The algorithm is judged by numeric references: tests/test_server_step.py,
tests/test_server_state.py and the trace replays of tests/test_training.py."""

import re

import pytest

from helpers import ROOT, mpirun

import hvd_dcasgd

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


@pytest.mark.parametrize("mode", hvd_dcasgd.MODES)
def test_smoke_digits_example_reaches_95_percent(mode, tmp_path):
    result = mpirun(5, ROOT / "examples" / "train_digits.py", "--compensation", mode,
                    "--save", tmp_path / "model.pt", timeout=300)
    assert result.returncode == 0, result.stdout
    found = re.search(r"final test accuracy (\d\.\d+) \(compensation (\w+), 4 workers", result.stdout)
    assert found, result.stdout
    assert found.group(2) == mode
    assert float(found.group(1)) >= 0.95, result.stdout
    assert (tmp_path / "model.pt").exists()

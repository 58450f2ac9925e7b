"""The digits example converges in every mode, and every rank exits 0."""

import re

import pytest

from conftest import ROOT, mpirun

import hvd_dcasgd

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


@pytest.mark.parametrize("mode", hvd_dcasgd.MODES)
def test_digits_example_reaches_95_percent(mode, tmp_path):
    result = mpirun(5, ROOT / "examples" / "train_digits.py", "--compensation", mode,
                    "--save", tmp_path / "model.pt", timeout=300)
    assert result.returncode == 0, result.stdout
    found = re.search(r"final test accuracy (\d\.\d+) \(compensation (\w+), 4 workers", result.stdout)
    assert found, result.stdout
    assert found.group(2) == mode
    assert float(found.group(1)) >= 0.95, result.stdout
    assert (tmp_path / "model.pt").exists()

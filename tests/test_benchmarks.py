"""The benchmark scripts keep working: tiny sizes, no timing asserted."""

import importlib.util
import re

from conftest import ROOT, mpirun, python

BENCH = ROOT / "benchmarks"
RATIO = r"ratio (?:raw/\w+ +)?(\d+\.\d\d)"


def test_apply_benchmark_runs():
    result = python(BENCH / "bench_apply.py", "--numel", 4096, "--repeats", 1, timeout=120)
    assert result.returncode == 0, result.stdout
    assert len(re.findall(RATIO, result.stdout)) == 10, result.stdout


def test_transport_benchmark_runs():
    result = mpirun(2, BENCH / "bench_transport.py", "--numel", 4096, "--repeats", 1, timeout=120)
    assert result.returncode == 0, result.stdout
    assert len(re.findall(RATIO, result.stdout)) == 2, result.stdout


def test_end_to_end_benchmark_runs():
    result = python(BENCH / "bench_end_to_end.py", "--workers", 2, "--numel", 4096, "--steps", 5, timeout=300)
    assert result.returncode == 0, result.stdout
    rows = re.findall(r"^  (\w+) +Horovod (on|off) +[\d.]+ updates/s", result.stdout, re.MULTILINE)
    settings = ["on", "off"] if importlib.util.find_spec("horovod") else ["off"]
    assert rows == [(m, h) for m in ("none", "constant", "adaptive", "sync") for h in settings], result.stdout

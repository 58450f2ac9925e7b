"""Fixtures; the helpers the tests share are in ``helpers.py``."""

import json
import os
import socket
import time
from pathlib import Path

import pytest

from helpers import ROOT, horovod_installed, unavailable

# Horovod's background thread on each worker runs a cycle every HOROVOD_CYCLE_TIME ms (1 by default), idle or
# not: on 2 cores, where a job's ranks share the cores, its polling took 20 to 70% of a core per worker while the
# workers trained (measured, docs/TESTING.md).  The workers' Horovod carries only a script's own collectives here,
# so the suite's jobs run at 5 ms, Horovod's default before 0.21, unless the caller set it.
os.environ.setdefault("HOROVOD_CYCLE_TIME", "5")

#: munged's socket, which Open MPI's PMIx tries on every mpirun where it exists.
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


def pytest_sessionstart(session):
    """Say so, first thing and also under ``-q``, when munged is gone but its
    socket is left (a machine where munged was killed): Open MPI's PMIx then
    retries the socket for about 2.3 s at the start of every mpirun
    (measured: 0.07 s for ``mpirun -np 1 true`` without it, 2.32 s with it),
    which slows every job of the suite."""
    if not MUNGE_SOCKET.exists():
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(MUNGE_SOCKET))
            return
        except OSError:
            pass
    sentence = (f"{MUNGE_SOCKET} is left but munged does not answer: every mpirun waits about 2.3 s for it; "
                f"start munged (bash slurm/local_cluster.sh munge) or remove the socket")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(sentence, yellow=True)


#: Where a run of the whole suite leaves each test's time (``benchmarks/suite_durations.py`` writes
#: the testing page's table of the slowest from it).
DURATIONS = ROOT / "build" / "test-durations.json"
_durations = {}
_started = time.time()


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """After the whole suite (every test collected, none deselected), keep its
    times: once, from the process that ran it or, under pytest-xdist, that
    gathered its test processes' reports."""
    if hasattr(session.config, "workerinput"):
        return
    if session.config.args != [str(ROOT / "tests")] and session.config.args != ["tests"]:
        return
    if session.config.getoption("keyword") or session.config.getoption("markexpr") or not _durations:
        return
    DURATIONS.parent.mkdir(exist_ok=True)
    processes = getattr(session.config.option, "numprocesses", None) or 1
    DURATIONS.write_text(json.dumps({"seconds": time.time() - _started, "status": int(exitstatus),
                                     "processes": processes, "tests": _durations}, indent=1))


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

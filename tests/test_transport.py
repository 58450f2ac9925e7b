"""Each RMA primitive alone, under contention from every rank, on Open MPI's
shared-memory path and on its TCP path (osc/pt2pt, no asynchronous progress)."""

import pytest

from helpers import PROGRAMS, TCP, mpirun

pytestmark = [pytest.mark.mpi]

CHECKS = [
    "ok control words: atomic add",
    "ok control words: store/load_all",
    "ok control words: load_meanwhile",
    "ok control words: post",
    "ok mailboxes: put then get",
    "ok channel: exactly once, in order",
]


@pytest.mark.parametrize("mca", [(), TCP], ids=["shared-memory", "tcp-pt2pt"])
def test_primitives(mca):
    result = mpirun(4, PROGRAMS / "primitives.py", mca=mca, timeout=120)
    assert result.returncode == 0, result.stdout
    assert [line for line in result.stdout.splitlines() if line.startswith("ok ")] == CHECKS, result.stdout

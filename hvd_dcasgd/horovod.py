"""The workers as a Horovod job.

When Horovod is installed, the workers initialise it on their own
communicator (the server rank stays out), so that a script's own Horovod
calls -- ``horovod.torch.allreduce``, ``join``, ... -- work among the workers,
and ``compensation="horovod"`` can run Horovod's own synchronous
``DistributedOptimizer`` as the baseline.  ``HVD_DCASGD_HOROVOD=0`` turns the
integration off; ``=1`` makes a missing Horovod an error.  Under Open MPI's
osc/pt2pt (one-sided over TCP), which refuses ``MPI_THREAD_MULTIPLE``, the
workers run without Horovod.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Optional

from .errors import HvdDcasgdError

#: What to tell a user who asks for Horovod where it is not installed.
INSTALL_HINT = (
    "Horovod 0.28.1 is not installed; `bash .ci/setup.sh` builds it for PyTorch + MPI "
    "(see the README: it must be compiled as C++17 against torch >= 2.1)"
)


def _setting() -> str:
    setting = os.environ.get("HVD_DCASGD_HOROVOD", "auto").strip().lower() or "auto"
    if setting not in ("auto", "0", "1"):
        raise HvdDcasgdError(f"hvd_dcasgd: HVD_DCASGD_HOROVOD={setting!r}; use 0, 1 or auto")
    return setting


def _pt2pt_selected() -> bool:
    """Open MPI's one-sided component over TCP was asked for (``--mca osc
    pt2pt`` reaches the ranks as ``OMPI_MCA_osc``): it refuses the thread
    level Horovod needs."""
    return "pt2pt" in os.environ.get("OMPI_MCA_osc", "").split(",")


def horovod_wanted() -> bool:
    """Whether the workers should become a Horovod job: installed, not turned
    off, and not under Open MPI's osc/pt2pt."""
    setting = _setting()
    if setting == "0":
        return False
    installed = importlib.util.find_spec("horovod") is not None
    if setting == "1" and not installed:
        raise HvdDcasgdError(f"hvd_dcasgd: HVD_DCASGD_HOROVOD=1, but {INSTALL_HINT}.")
    if installed and _pt2pt_selected():
        if setting == "1":
            raise HvdDcasgdError(
                "hvd_dcasgd: HVD_DCASGD_HOROVOD=1, but Open MPI's osc/pt2pt (selected with --mca osc pt2pt) "
                "refuses MPI_THREAD_MULTIPLE, which Horovod needs; use another one-sided component or HVD_DCASGD_HOROVOD=0."
            )
        return False
    return installed


def _warn(reason: str) -> None:
    print(f"hvd_dcasgd: warning: {reason}; the workers run without Horovod.", file=sys.stderr, flush=True)


def start_horovod(mpi: ModuleType, comm: Any) -> Optional[ModuleType]:
    """``horovod.torch`` initialised on ``comm`` (the workers), or ``None``
    with a one-line warning when Horovod is wanted but cannot run."""
    if not horovod_wanted():
        return None
    if mpi.Query_thread() < mpi.THREAD_MULTIPLE:
        _warn(
            "Horovod needs MPI_THREAD_MULTIPLE and MPI was initialised below it "
            "(mpi4py.MPI imported with a lower mpi4py.rc.thread_level, or HVD_DCASGD_THREAD_LEVEL)"
        )
        return None
    try:
        import horovod.torch as horovod
    except Exception as exc:  # a broken build raises ImportError or OSError from its extension
        _warn(f"Horovod is installed but cannot be loaded ({exc})")
        return None
    horovod.init(comm=comm)
    return horovod


def require_horovod(horovod: Optional[ModuleType], what: str) -> ModuleType:
    """``horovod`` itself, or the reason ``what`` cannot run without it."""
    if horovod is None:
        reason = INSTALL_HINT if importlib.util.find_spec("horovod") is None else "Horovod is not running (see the warning above)"
        raise HvdDcasgdError(f"hvd_dcasgd: {what} needs Horovod: {reason}.", collective=True)
    return horovod

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
from types import ModuleType
from typing import Any, Optional, Tuple

from ..common.config import resolve_at_import
from ..common.errors import HvdDcasgdError
from ..common.log import get_logger

log = get_logger("horovod")

#: What to tell a user who asks for Horovod where it is not installed.
INSTALL_HINT = (
    "Horovod 0.28.1 is not installed; `bash .ci/setup.sh` builds it for PyTorch + MPI "
    "(see the README: it must be compiled as C++17 against torch >= 2.1)"
)


def _setting() -> str:
    return resolve_at_import("HVD_DCASGD_HOROVOD")  # also read as the package is imported


def _pt2pt_selected() -> bool:
    """Open MPI's one-sided component over TCP was asked for (``--mca osc
    pt2pt`` reaches the ranks as ``OMPI_MCA_osc``): it refuses the thread
    level Horovod needs."""
    return "pt2pt" in os.environ.get("OMPI_MCA_osc", "").split(",")


def why_not_horovod() -> Optional[str]:
    """``None`` when the workers should become a Horovod job (installed, not
    turned off, not under osc/pt2pt); otherwise why not, in a few words.
    Raises when ``HVD_DCASGD_HOROVOD=1`` asks for what cannot be."""
    setting = _setting()
    if setting == "0":
        return "HVD_DCASGD_HOROVOD=0 turned it off"
    if importlib.util.find_spec("horovod") is None:
        if setting == "1":
            raise HvdDcasgdError(f"hvd_dcasgd: HVD_DCASGD_HOROVOD=1, but {INSTALL_HINT}.")
        return INSTALL_HINT
    if _pt2pt_selected():
        if setting == "1":
            raise HvdDcasgdError(
                "hvd_dcasgd: HVD_DCASGD_HOROVOD=1, but Open MPI's osc/pt2pt (selected with --mca osc pt2pt) "
                "refuses MPI_THREAD_MULTIPLE, which Horovod needs; use another one-sided component or HVD_DCASGD_HOROVOD=0."
            )
        return "Open MPI's osc/pt2pt (--mca osc pt2pt) refuses the MPI_THREAD_MULTIPLE Horovod needs"
    return None


def horovod_wanted() -> bool:
    """Whether the workers should become a Horovod job (see :func:`why_not_horovod`)."""
    return why_not_horovod() is None


def _warn(reason: str) -> None:
    log.warning(f"hvd_dcasgd: {reason}; the workers run without Horovod.")


def _load(mpi: ModuleType) -> Tuple[Optional[ModuleType], Optional[str]]:
    """``horovod.torch`` if this process can start it, else why not."""
    if mpi.Query_thread() < mpi.THREAD_MULTIPLE:
        return None, ("Horovod needs MPI_THREAD_MULTIPLE and MPI was initialised below it "
                      "(mpi4py.MPI imported with a lower mpi4py.rc.thread_level, or HVD_DCASGD_THREAD_LEVEL)")
    try:
        import horovod.torch as horovod
    except Exception as exc:  # a broken build raises ImportError or OSError from its extension
        return None, f"Horovod is installed but cannot be loaded ({exc})"
    return horovod, None


def start_horovod(mpi: ModuleType, comm: Any) -> Tuple[Optional[ModuleType], Optional[str]]:
    """``horovod.torch`` initialised on ``comm`` (the workers), or ``None`` and
    why not.  Collective over ``comm``: Horovod starts on every rank of it or
    on none (a rank that cannot would leave the others waiting in Horovod's
    start-up).  Where Horovod was wanted and cannot run, each rank warns."""
    horovod, reason = None, why_not_horovod()
    wanted = reason is None
    if wanted:
        horovod, reason = _load(mpi)
    if not comm.allreduce(horovod is not None, op=mpi.LAND):
        reason = reason or "another worker cannot run Horovod (see its warning)"
        if wanted:
            _warn(reason)
        return None, reason
    horovod.init(comm=comm)
    return horovod, None


def require_horovod(horovod: Optional[ModuleType], what: str, reason: Optional[str]) -> ModuleType:
    """``horovod`` itself, or an error that says ``what`` needs it and ``reason`` it is not running."""
    if horovod is None:
        raise HvdDcasgdError(f"hvd_dcasgd: {what} needs Horovod, which is not running: {reason}.", collective=True)
    return horovod

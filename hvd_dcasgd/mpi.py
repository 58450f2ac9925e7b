"""Loads mpi4py's ``MPI`` module with the thread level this project needs.

Horovod's background thread calls MPI while the training loop makes its own
one-sided calls, so when the workers run as a Horovod job MPI must start at
``MPI_THREAD_MULTIPLE`` (mpi4py's default).  Without Horovod we initialise MPI
as ``serialized``: Open MPI's one-sided component over TCP (osc/pt2pt) refuses
``MULTIPLE``, and every MPI call of this package comes from one thread.
``HVD_DCASGD_THREAD_LEVEL`` overrides the choice; a user who imported
``mpi4py.MPI`` first keeps the level they chose.
"""

from __future__ import annotations

import sys
from types import ModuleType

from .config import setting
from .errors import HvdDcasgdError
from .horovod import horovod_wanted

INSTALL_HINT = (
    "install Open MPI and mpi4py (Debian: `apt-get install openmpi-bin libopenmpi-dev`, "
    "then `pip install mpi4py`)"
)


class MpiUnavailable(HvdDcasgdError):
    """mpi4py or the MPI library it needs is missing: one process can still train locally."""


def load_mpi() -> ModuleType:
    """Return ``mpi4py.MPI``, or raise a sentence that says what is missing."""
    if "mpi4py.MPI" not in sys.modules:
        try:
            import mpi4py
        except ImportError as exc:
            raise MpiUnavailable(f"hvd_dcasgd needs mpi4py, which is not installed: {INSTALL_HINT}.") from exc
        default = "multiple" if horovod_wanted() else "serialized"
        mpi4py.rc.thread_level = setting("HVD_DCASGD_THREAD_LEVEL") or default
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise MpiUnavailable(
            f"hvd_dcasgd could not load the MPI library ({exc}); {INSTALL_HINT}."
        ) from exc
    return MPI

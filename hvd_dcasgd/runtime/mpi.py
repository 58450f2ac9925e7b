"""Loads mpi4py's ``MPI`` module with the thread level this project needs.

Horovod's background thread calls MPI while the training loop makes its own
one-sided calls, so when the workers run as a Horovod job MPI must start at
``MPI_THREAD_MULTIPLE`` (mpi4py's default).  Without Horovod we initialise MPI
as ``serialized``: Open MPI's one-sided component over TCP (osc/pt2pt) refuses
``MULTIPLE``, and every MPI call of this package comes from one thread.
``HVD_DCASGD_THREAD_LEVEL`` overrides the choice.  The level is set when the
package is imported, so the script may import ``mpi4py.MPI`` itself after
``hvd_dcasgd``; a script that imported ``mpi4py.MPI`` first keeps the level
it chose.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any, Dict

from ..common.config import resolve_at_import
from ..common.errors import HvdDcasgdError
from .horovod import horovod_wanted

INSTALL_HINT = (
    "install Open MPI and mpi4py (Debian: `apt-get install openmpi-bin libopenmpi-dev`, "
    "then `pip install mpi4py`)"
)


class MpiUnavailable(HvdDcasgdError):
    """mpi4py or the MPI library it needs is missing: one process can still train locally."""


#: Whether ``mpi4py.MPI`` was loaded before this package was imported (then
#: its thread level is the script's choice, not ours).
MPI_LOADED_FIRST = "mpi4py.MPI" in sys.modules


def choose_thread_level() -> None:
    """Set mpi4py's thread level for this job, unless MPI is loaded already.
    Run when the package is imported, so that a script that imports
    ``mpi4py.MPI`` after ``hvd_dcasgd`` (to reach ``MPI.COMM_WORLD``) gets a
    level every path can use; mpi4py without MPI is left to :func:`load_mpi`."""
    if "mpi4py.MPI" in sys.modules:
        return
    try:
        import mpi4py
    except ImportError:
        return
    level = resolve_at_import("HVD_DCASGD_THREAD_LEVEL")
    mpi4py.rc.thread_level = level if level != "auto" else "multiple" if horovod_wanted() else "serialized"


def load_mpi() -> ModuleType:
    """Return ``mpi4py.MPI``, or raise a sentence that says what is missing."""
    if "mpi4py.MPI" not in sys.modules:
        try:
            import mpi4py  # noqa: F401
        except ImportError as exc:
            raise MpiUnavailable(f"hvd_dcasgd needs mpi4py, which is not installed: {INSTALL_HINT}.") from exc
        choose_thread_level()
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise MpiUnavailable(
            f"hvd_dcasgd could not load the MPI library ({exc}); {INSTALL_HINT}."
        ) from exc
    return MPI


#: Open MPI's parameters that choose how one-sided operations travel, as
#: ``mpirun --mca NAME VALUE`` hands them to every rank (``OMPI_MCA_NAME``).
ONE_SIDED_PARAMETERS = ("osc", "pml", "btl")


def transport(mpi: Any) -> Dict[str, str]:
    """How this rank's one-sided operations travel, for the server's summary:
    the MPI library, the Open MPI components the launch chose (``default``
    where it chose none: Open MPI picks by itself) and the thread level MPI
    started at."""
    levels = {mpi.THREAD_SINGLE: "single", mpi.THREAD_FUNNELED: "funneled",
              mpi.THREAD_SERIALIZED: "serialized", mpi.THREAD_MULTIPLE: "multiple"}
    described = {"library": mpi.Get_library_version().strip("\0").splitlines()[0].split(",")[0].strip()}
    if "Open MPI" in described["library"]:
        described.update({name: os.environ.get(f"OMPI_MCA_{name}", "default") for name in ONE_SIDED_PARAMETERS})
    described["thread_level"] = levels.get(mpi.Query_thread(), str(mpi.Query_thread()))
    return described

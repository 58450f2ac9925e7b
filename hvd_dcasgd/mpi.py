"""Loads mpi4py's ``MPI`` module with the thread level this project needs.

Open MPI's one-sided component over TCP (osc/pt2pt) refuses
``MPI_THREAD_MULTIPLE``, mpi4py's default, so unless the user already imported
``mpi4py.MPI`` we initialise MPI as ``serialized``: every MPI call of this
package comes from the thread that runs the training loop or the server.
``HVD_DCASGD_THREAD_LEVEL`` overrides the choice.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from .errors import HvdDcasgdError

INSTALL_HINT = (
    "install Open MPI and mpi4py (Debian: `apt-get install openmpi-bin libopenmpi-dev`, "
    "then `pip install mpi4py`)"
)


def load_mpi() -> ModuleType:
    """Return ``mpi4py.MPI``, or raise a sentence that says what is missing."""
    if "mpi4py.MPI" not in sys.modules:
        try:
            import mpi4py
        except ImportError as exc:
            raise HvdDcasgdError(f"hvd_dcasgd needs mpi4py, which is not installed: {INSTALL_HINT}.") from exc
        mpi4py.rc.thread_level = os.environ.get("HVD_DCASGD_THREAD_LEVEL", "serialized")
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise HvdDcasgdError(
            f"hvd_dcasgd could not load the MPI library ({exc}); {INSTALL_HINT}."
        ) from exc
    return MPI

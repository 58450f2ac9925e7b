"""The package's messages, through :mod:`logging`.

Every message goes to ``logging.getLogger("hvd_dcasgd")`` or one of its
children (``hvd_dcasgd.server``, ``hvd_dcasgd.metrics``, ...), so a script
routes, filters and silences them the usual way::

    logging.getLogger("hvd_dcasgd").setLevel(logging.WARNING)

Until the script configures logging itself (a handler on the root logger or
on ``hvd_dcasgd``), a default handler prints each message on standard error,
as the package always did, behind the rank that says it: ``[rank 0]
hvd_dcasgd server: ...``.  ``HVD_DCASGD_LOG_LEVEL`` sets the level (default
``info``, or the level a script gave the logger before).  Every record carries the rank as ``record.rank`` (an integer;
``None`` outside a launcher), for a format such as ``"[%(rank)s] %(message)s"``.

:mod:`warnings` stays for what the user's own code should change; those
point at the user's line (see :func:`.errors.warn`).  Standard library only.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

from .config import resolve_at_import

__all__ = ["LOGGER", "get_logger", "launcher_rank"]

#: The package's logger: every other one is its child.
LOGGER = logging.getLogger("hvd_dcasgd")

#: Variables a launcher sets to a process's world rank (mpirun, Open MPI, MPICH/Hydra, SLURM).
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def launcher_rank() -> Optional[int]:
    """This process's world rank as its launcher says, without MPI; ``None``
    outside one."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


class _Rank(logging.Filter):
    """Stamps each record with the rank that made it (``record.rank``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            record.rank = launcher_rank()
        return True


class _DefaultHandler(logging.Handler):
    """Standard error (the current ``sys.stderr``), ``[rank r] message``, for
    as long as the script has not configured logging itself (checked at each
    message, so a script may configure it after importing the package)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(rank_prefix)s%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or any(h is not self for h in LOGGER.handlers):
            return  # the script's handlers have it
        rank = getattr(record, "rank", None)
        record.rank_prefix = "" if rank is None else f"[rank {rank}] "
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _set_up() -> None:
    if any(isinstance(h, _DefaultHandler) for h in LOGGER.handlers):
        return
    LOGGER.addFilter(_Rank())
    LOGGER.addHandler(_DefaultHandler())
    level = resolve_at_import("HVD_DCASGD_LOG_LEVEL")
    if os.environ.get("HVD_DCASGD_LOG_LEVEL", "").strip() or LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(getattr(logging, level.upper()))  # a level the script set before stays, unless the variable says


def get_logger(name: str = "") -> logging.Logger:
    """``hvd_dcasgd`` (``name`` empty) or its child ``hvd_dcasgd.<name>``,
    with the rank on every record."""
    _set_up()
    if not name:
        return LOGGER
    logger = logging.getLogger(f"{LOGGER.name}.{name}")
    if not any(isinstance(f, _Rank) for f in logger.filters):
        logger.addFilter(_Rank())  # a logger's filters see only its own records
    return logger

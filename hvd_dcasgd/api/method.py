"""Which method a job runs and with which constants: ``DistributedOptimizer``'s
``compensation``, ``schedule`` and ``backend`` with their shorthands, and each
compensation constant from its argument or its variable, resolved the same
way on every rank."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..algorithm.compensation import SCHEDULES
from ..algorithm.rules import COMPENSATIONS, MODES
from ..common.config import resolve, setting
from ..common.errors import HvdDcasgdValueError

__all__ = ["BACKENDS", "CONSTANT_VARIABLES", "METHODS", "constants", "method_name", "resolve_method"]

#: Every training method by its short name: the server's modes (``none`` is
#: ASGD, ``sync`` is SSGD, ``constant``/``adaptive`` are DC-ASGD-c/-a) and
#: ``horovod``, Horovod's own synchronous allreduce among the workers.
METHODS = MODES + ("horovod",)
#: Where training runs: the parameter server, or Horovod's allreduce among the workers.
BACKENDS = ("server", "horovod")


#: Each compensation constant's variable.
CONSTANT_VARIABLES = {"lambda_0": "HVD_DCASGD_LAMBDA", "bound": "HVD_DCASGD_BOUND",
                      "mean_square_momentum": "HVD_DCASGD_MEAN_SQUARE_MOMENTUM", "eps": "HVD_DCASGD_EPS",
                      "gamma": "HVD_DCASGD_GAMMA", "gap_eps": "HVD_DCASGD_GAP_EPS"}


def constants(**arguments: Optional[float]) -> Dict[str, Optional[float]]:
    """The compensation's constants: each variable when set, else the script's argument, else ``None`` (the
    compensation's own default; the table's default for a constant the compensation does not use would be an
    error)."""
    found = {}
    for name, value in arguments.items():
        env = setting(CONSTANT_VARIABLES[name])
        found[name] = value if env is None else env
    return found


def resolve_method(compensation: Optional[str], schedule: Optional[str], backend: Optional[str]) -> Tuple[str, str, str]:
    """(compensation, schedule, backend) from the three settings, each
    overridden by its environment variable; ``compensation="sync"`` and
    ``"horovod"`` are shorthands for ``none`` on the sync schedule and for the
    Horovod backend."""
    compensation = resolve("HVD_DCASGD_COMPENSATION", compensation)
    # unset: as the compensation's shorthand says, else the table's default
    schedule = setting("HVD_DCASGD_SCHEDULE") or schedule
    backend = setting("HVD_DCASGD_BACKEND") or backend
    if compensation == "horovod":
        compensation, backend = "none", backend or "horovod"
    elif compensation == "sync":
        compensation, schedule = "none", schedule or "sync"
    schedule, backend = resolve("HVD_DCASGD_SCHEDULE", schedule), resolve("HVD_DCASGD_BACKEND", backend)
    if compensation not in COMPENSATIONS:
        raise HvdDcasgdValueError(f"hvd_dcasgd: unknown compensation {compensation!r}; choose one of "
                                  f"{', '.join(METHODS)}")
    if schedule not in SCHEDULES:
        raise HvdDcasgdValueError(f"hvd_dcasgd: unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if backend not in BACKENDS:
        raise HvdDcasgdValueError(f"hvd_dcasgd: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return compensation, schedule, backend


def method_name(compensation: str, schedule: str, backend: str) -> str:
    """The short name of a method (one of :data:`METHODS` for the built-in
    ones): ``horovod``, ``sync``, or the compensation's name."""
    if backend == "horovod":
        return "horovod"
    if schedule == "sync":
        return "sync" if compensation == "none" else f"sync+{compensation}"
    return compensation

"""hvd_dcasgd: asynchronous SGD with delay compensation (DC-ASGD) for PyTorch,
as a Horovod-style plugin over an MPI one-sided-window parameter server.

    import hvd_dcasgd as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

Launch with one rank more than workers: rank 0 is the parameter server.

The names below load their module on first use (PEP 562), so that importing
the package -- or its launcher, :mod:`hvd_dcasgd.launch` -- costs nothing
until something is asked of it.
"""

from importlib import import_module
from typing import Any, Dict

__version__ = "0.1.0"

#: Public name -> the submodule that defines it.
_EXPORTS: Dict[str, str] = {
    **dict.fromkeys(
        ["Adasum", "Average", "Max", "Min", "Sum", "allgather", "allreduce", "allreduce_", "broadcast",
         "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "join"],
        "collectives",
    ),
    **dict.fromkeys(["COMPENSATIONS", "MODES", "SCHEDULES", "Compensation", "CompensationRule",
                     "dcasgd_", "register_compensation"], "compensation"),
    "Compression": "compression",
    **dict.fromkeys(["HvdDcasgdError", "HvdDcasgdValueError", "HvdDcasgdWarning"], "errors"),
    **dict.fromkeys(["BACKENDS", "METHODS", "DistributedOptimizer"], "optimizer"),
    **dict.fromkeys(["init", "is_initialized", "is_server", "local_rank", "local_size", "rank", "shutdown", "size"],
                    "runtime"),
    "simulate": "simulator",
    "update_": "update",
}

__all__ = sorted(_EXPORTS)

# MPI's thread level is fixed when mpi4py.MPI loads: choose it now, before a
# script's own `from mpi4py import MPI` can (standard library and mpi4py's
# top-level package only: no MPI, no torch).
import_module(".mpi", __name__).choose_thread_level()


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'hvd_dcasgd' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))

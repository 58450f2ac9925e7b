"""hvd_dcasgd: asynchronous SGD with delay compensation (DC-ASGD) for PyTorch,
as a Horovod-style plugin over an MPI one-sided-window parameter server.

    import hvd_dcasgd as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

Launch with one rank more than workers: rank 0 is the parameter server.

The names below load their module on first use (PEP 562), so that importing
the package -- or its launcher, :mod:`hvd_dcasgd.launcher` -- costs nothing
until something is asked of it.

Importing it sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` unless the environment
sets it: ``torch.cuda.is_available()``, which Horovod's scripts ask before
``hvd.init()``, then counts the GPUs through NVML instead of starting CUDA, so
that ``init()`` can still choose the GPUs this rank sees (docs/GPU.md).
"""

import os as _os
from importlib import import_module
from typing import TYPE_CHECKING, Any, Dict

_os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

#: The package's version, the one place it is written (pyproject.toml reads it).
__version__ = "0.3.0"

#: Public name -> the submodule that defines it: every public name of
#: ``horovod.torch`` 0.28.1, and this package's own.
_EXPORTS: Dict[str, str] = {
    **dict.fromkeys(
        ["Adasum", "Average", "Max", "Min", "Product", "Sum", "allgather", "allgather_async", "allreduce",
         "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast",
         "broadcast_", "broadcast_async", "broadcast_async_", "grouped_allgather", "grouped_allgather_async",
         "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
         "grouped_reducescatter", "grouped_reducescatter_async", "poll", "reducescatter", "reducescatter_async",
         "sparse_allreduce_async", "synchronize"],
        "api.mpi_ops",
    ),
    **dict.fromkeys(["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
                     "join"], "api.collectives"),
    **dict.fromkeys(["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"], "api.process_sets"),
    **dict.fromkeys(["HorovodInternalError", "ccl_built", "check_extension", "cross_rank", "cross_size",
                     "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "is_homogeneous", "mpi_built",
                     "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built", "start_timeline",
                     "stop_timeline"], "api.basics"),
    "SyncBatchNorm": "api.sync_batch_norm",
    **dict.fromkeys(["COMPENSATIONS", "MODES", "CompensationRule", "register_compensation"], "algorithm.rules"),
    **dict.fromkeys(["SCHEDULES", "Compensation"], "algorithm.compensation"),
    "dcasgd_": "algorithm.dcasgd",
    "LR_SCALINGS": "algorithm.update",
    "Compression": "api.compression",
    **dict.fromkeys(["HvdDcasgdError", "HvdDcasgdValueError", "HvdDcasgdWarning"], "common.errors"),
    **dict.fromkeys(["BACKENDS", "METHODS", "DistributedOptimizer"], "api.optimizer"),
    **dict.fromkeys(["init", "is_initialized", "is_server", "local_rank", "local_size", "rank", "shutdown", "size"],
                    "runtime.roles"),
    "simulate": "algorithm.simulator",
}

#: Horovod's submodules by the names scripts reach them with, and ours.
_SUBMODULES = {"functions": "api.collectives", "mpi_ops": "api.mpi_ops", "sync_batch_norm": "api.sync_batch_norm",
               "compression": "api.compression", "optimizer": "api.optimizer", "elastic": "api.elastic"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


if TYPE_CHECKING:  # what IDEs and type checkers see; at run time __getattr__ below loads each on first use
    from .algorithm.compensation import SCHEDULES, Compensation
    from .algorithm.dcasgd import dcasgd_
    from .algorithm.rules import COMPENSATIONS, MODES, CompensationRule, register_compensation
    from .algorithm.simulator import simulate
    from .algorithm.update import LR_SCALINGS
    from .api import collectives as functions
    from .api import compression, elastic, mpi_ops, optimizer, sync_batch_norm
    from .api.basics import (HorovodInternalError, ccl_built, check_extension, cross_rank, cross_size, cuda_built,
                             ddl_built, gloo_built, gloo_enabled, is_homogeneous, mpi_built, mpi_enabled,
                             mpi_threads_supported, nccl_built, rocm_built, start_timeline, stop_timeline)
    from .api.collectives import (allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
                                  join)
    from .api.compression import Compression
    from .api.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async, allreduce,
                              allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                              broadcast, broadcast_, broadcast_async, broadcast_async_, grouped_allgather,
                              grouped_allgather_async, grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                              grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async, poll,
                              reducescatter, reducescatter_async, sparse_allreduce_async, synchronize)
    from .api.optimizer import BACKENDS, METHODS, DistributedOptimizer
    from .api.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
    from .api.sync_batch_norm import SyncBatchNorm
    from .common.errors import HvdDcasgdError, HvdDcasgdValueError, HvdDcasgdWarning
    from .runtime.roles import init, is_initialized, is_server, local_rank, local_size, rank, shutdown, size

# MPI's thread level is fixed when mpi4py.MPI loads: choose it now, before a
# script's own `from mpi4py import MPI` can (standard library and mpi4py's
# top-level package only: no MPI, no torch).
import_module(".runtime.mpi", __name__).choose_thread_level()


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = import_module(f".{_SUBMODULES[name]}", __name__)
    elif name == "mpi_lib_v2":
        from .common.errors import HvdDcasgdError

        raise HvdDcasgdError("hvd_dcasgd: mpi_lib_v2 is Horovod's compiled extension; this package has none: "
                             "its calls are hvd_dcasgd's own functions of the same names")
    else:
        raise AttributeError(f"module 'hvd_dcasgd' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

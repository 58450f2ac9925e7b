"""Horovod's questions about the job and its build, answered for this one.

``cross_rank``/``cross_size`` are the node's index among the nodes and the
number of nodes (for this worker's node-local rank), as Horovod defines
them; the ``*_built``/``*_enabled`` answers describe this package: its
collectives and its parameter server run over MPI, never NCCL, Gloo, DDL,
oneCCL or ROCm, and nothing of it is built for CUDA (a GPU server stages
its tensors through host memory).
"""

from __future__ import annotations

from typing import Any

from ..common.errors import HvdDcasgdError
from ..runtime.roles import WORKER, runtime

__all__ = [
    "HorovodInternalError", "ccl_built", "check_extension", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "gloo_built", "gloo_enabled", "is_homogeneous", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "rocm_built", "start_timeline", "stop_timeline",
]


class HorovodInternalError(HvdDcasgdError):
    """Horovod's name for a failed collective, for scripts that catch it."""


def cross_rank() -> int:
    """This worker's node, by index among the nodes (0 on the server and locally)."""
    rt = runtime()
    return rt.cross.Get_rank() if rt.role == WORKER else 0


def cross_size() -> int:
    """How many nodes hold a worker with this worker's node-local rank (1 on the server and locally)."""
    rt = runtime()
    return rt.cross.Get_size() if rt.role == WORKER else 1


def is_homogeneous() -> bool:
    """Whether every node holds the same number of workers."""
    rt = runtime()
    if rt.role != WORKER:
        return True
    sizes = rt.workers.allgather(rt.local_size)
    return len(set(sizes)) == 1


def mpi_built(verbose: bool = False) -> bool:
    return True


def mpi_enabled() -> bool:
    return True


def mpi_threads_supported() -> bool:
    """Whether MPI runs at thread level MULTIPLE (other threads may call MPI too)."""
    rt = runtime()
    return rt.mpi is not None and rt.mpi.Query_thread() == rt.mpi.THREAD_MULTIPLE


def gloo_built(verbose: bool = False) -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built(verbose: bool = False) -> int:
    """0: no NCCL (Horovod answers with NCCL's version number, or 0)."""
    return 0


def ddl_built(verbose: bool = False) -> bool:
    return False


def ccl_built(verbose: bool = False) -> bool:
    return False


def cuda_built(verbose: bool = False) -> bool:
    return False


def rocm_built(verbose: bool = False) -> bool:
    return False


def check_extension(ext_name: Any = None, ext_env_var: Any = None, pkg_path: Any = None, *args: Any) -> None:
    """Nothing to check: this package has no compiled framework extension."""


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's timeline records Horovod's own collectives: it runs when the
    workers are a Horovod job; the parameter server's own record is its trace."""
    horovod = runtime().horovod
    if horovod is None:
        raise HvdDcasgdError(
            "hvd_dcasgd: start_timeline records Horovod's collectives, and Horovod is not running here; the "
            "parameter server's record of every gradient it applies is its trace (HVD_DCASGD_TRACE=path)"
        )
    horovod.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    horovod = runtime().horovod
    if horovod is not None:
        horovod.stop_timeline()

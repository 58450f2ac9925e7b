"""hvd_dcasgd: asynchronous SGD with delay compensation (DC-ASGD) for PyTorch,
as a Horovod-style plugin over an MPI one-sided-window parameter server.

    import hvd_dcasgd as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

Launch with one rank more than workers: rank 0 is the parameter server.
"""

from .collectives import (
    Adasum,
    Average,
    Max,
    Min,
    Sum,
    allgather,
    allreduce,
    allreduce_,
    broadcast,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    join,
)
from .compensation import MODES, Compensation, dcasgd_
from .compression import Compression
from .errors import HvdDcasgdError
from .optimizer import METHODS, DistributedOptimizer
from .runtime import init, is_initialized, is_server, local_rank, local_size, rank, shutdown, size
from .simulator import simulate

__version__ = "0.1.0"

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "allgather",
    "broadcast",
    "Compensation",
    "Compression",
    "DistributedOptimizer",
    "HvdDcasgdError",
    "METHODS",
    "MODES",
    "Sum",
    "allreduce",
    "allreduce_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "dcasgd_",
    "init",
    "join",
    "is_initialized",
    "is_server",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "simulate",
    "size",
]

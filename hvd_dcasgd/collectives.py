"""Horovod's collective helpers, among the workers (the server takes no part).

``allreduce`` averages metrics over the workers; ``broadcast_parameters`` and
``broadcast_optimizer_state`` copy worker ``root_rank``'s values to the other
workers.  Every worker starts from the server's weights anyway; called after
``DistributedOptimizer`` the broadcasts also reach the server, so that
Horovod's checkpoint-restore idiom works.  On the server and when training
locally they do nothing.  They run over MPI with or without Horovod and give
the same answers as Horovod's own calls among the workers; ``join`` is
Horovod's own when Horovod is running.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Tuple, Union

import torch

from .errors import HvdDcasgdError
from .tensors import broadcast_, byte_view
from .runtime import WORKER, runtime

#: Reduction operations, by Horovod's names.
Average, Sum, Min, Max, Adasum = "average", "sum", "min", "max", "adasum"


def _worker_comm():
    rt = runtime()
    return rt.workers if rt.role == WORKER else None


def allreduce(
    tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None, op: str = Average
) -> torch.Tensor:
    """A new tensor: ``tensor`` summed or averaged over the workers."""
    if average is not None:
        op = Average if average else Sum
    if op not in (Average, Sum, Min, Max):
        raise HvdDcasgdError(f"hvd_dcasgd: allreduce supports Average, Sum, Min and Max, not {op!r}")
    result = tensor.detach().to("cpu", copy=True).contiguous()
    comm = _worker_comm()
    if comm is not None:
        mpi = runtime().mpi
        reduction = {Average: mpi.SUM, Sum: mpi.SUM, Min: mpi.MIN, Max: mpi.MAX}[op]
        comm.Allreduce(mpi.IN_PLACE, result.numpy(), op=reduction)
        if op == Average:
            result = result / comm.Get_size() if result.is_floating_point() else result // comm.Get_size()
    return result.to(tensor.device)


def allgather(tensor: torch.Tensor, name: Optional[str] = None) -> torch.Tensor:
    """Every worker's ``tensor`` concatenated along the first dimension."""
    comm = _worker_comm()
    if comm is None:
        return tensor.clone()
    parts = comm.allgather(tensor.detach().cpu())
    return torch.cat([p.reshape(-1, *tensor.shape[1:]) for p in parts]).to(tensor.device)


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    """A new tensor holding worker ``root_rank``'s ``tensor``."""
    result = tensor.detach().to("cpu", copy=True).contiguous()
    comm = _worker_comm()
    if comm is not None:
        comm.Bcast(byte_view(result), root=root_rank)
    return result.to(tensor.device)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None, op: str = Average) -> torch.Tensor:
    """In-place :func:`allreduce`."""
    return tensor.copy_(allreduce(tensor, average, name, op))


def broadcast_parameters(
    params: Union[Dict[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]], root_rank: int = 0
) -> None:
    """Copy worker ``root_rank``'s tensors into every worker's, in place.

    While training (after ``DistributedOptimizer``), the server takes them
    too -- Horovod's restore idiom: load a checkpoint on one worker, then
    broadcast -- and tensors of the state dict that the optimizer does not
    train (BatchNorm statistics) are combined over the workers at the end.
    """
    comm = _worker_comm()
    if comm is None:
        return
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    session = runtime().session
    if session is not None and session.server_holds_weights:
        comm.Barrier()  # every worker is here, so no push is in flight while the server changes
        if comm.Get_rank() == root_rank:
            session.restore_on_server(items)
        session.register_buffers([t for _, t in items])
    broadcast_(comm, [t for _, t in items], root_rank)


def join(device: int = -1) -> int:
    """Wait until every worker has called ``join``; return the rank of the
    worker that joined last (Horovod's ``join``, for uneven data)."""
    rt = runtime()
    if rt.role != WORKER:
        return 0
    if rt.horovod is not None:
        return rt.horovod.join(device)
    if rt.join_counter is None:
        raise HvdDcasgdError("hvd_dcasgd: join() without Horovod needs MPI one-sided windows, which could not be created")
    arrival = rt.join_counter.next()
    last = rt.worker_rank if arrival % rt.num_workers == rt.num_workers - 1 else -1
    return rt.workers.allreduce(last, op=rt.mpi.MAX)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """Worker ``root_rank``'s ``obj`` (pickled), on every worker."""
    comm = _worker_comm()
    return obj if comm is None else comm.bcast(obj, root=root_rank)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Load worker ``root_rank``'s optimizer state on every worker.

    While training, the state that matters is the server's (its optimizer is
    the one that steps): a ``DistributedOptimizer`` forwards ``load_state_dict``
    to the server and answers ``state_dict()`` from it, so here the workers
    only wait for each other."""
    comm = _worker_comm()
    if comm is None:
        return
    if runtime().session is not None and getattr(optimizer, "_session", None) is not None:
        comm.Barrier()
        return
    optimizer.load_state_dict(broadcast_object(optimizer.state_dict(), root_rank))

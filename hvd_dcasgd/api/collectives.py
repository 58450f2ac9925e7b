"""Horovod's helper functions, among the workers (the server takes no part).

``broadcast_parameters`` and ``broadcast_optimizer_state`` copy worker
``root_rank``'s values to the other workers.  Every worker starts from the
server's weights anyway; called after ``DistributedOptimizer`` the broadcasts
also reach the server, so that Horovod's checkpoint-restore idiom works.
``broadcast_object``/``allgather_object`` carry any picklable object; ``join``
is Horovod's own when Horovod is running.  On the server and when training
locally they do nothing (or answer as one worker would).  The tensor
collectives are in :mod:`.mpi_ops`.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

from ..common.errors import HvdDcasgdError
from ..common.tensors import broadcast_
from ..runtime.roles import WORKER, runtime
from .process_sets import ProcessSet, communicator, global_process_set

def broadcast_parameters(
    params: Union[Dict[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]], root_rank: int = 0
) -> None:
    """Copy worker ``root_rank``'s tensors into every worker's, in place.

    While training (after ``DistributedOptimizer``), the server takes them
    too -- Horovod's restore idiom: load a checkpoint on one worker, then
    broadcast -- and tensors of the state dict that the optimizer does not
    train (BatchNorm statistics) are combined over the workers at the end.
    """
    comm = communicator(global_process_set)
    if comm is None:
        return
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    session = runtime().session
    if session is not None and session.server_holds_weights:
        comm.Barrier()  # every worker is here, so no push is in flight while the server changes
        if comm.Get_rank() == root_rank:
            session.restore_on_server(items)
        session.register_untrained_state([t for _, t in items])
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


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Worker ``root_rank``'s ``obj`` (pickled), on every worker."""
    comm = communicator(process_set)
    return obj if comm is None else comm.bcast(obj, root=root_rank)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> List[Any]:
    """Every worker's ``obj`` (pickled), in rank order, on every worker."""
    comm = communicator(process_set)
    return [obj] if comm is None else comm.allgather(obj)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Load worker ``root_rank``'s optimizer state on every worker.

    While training, the state that matters is the server's (its optimizer is
    the one that steps): a ``DistributedOptimizer`` forwards ``load_state_dict``
    to the server and answers ``state_dict()`` from it, so here the workers
    only wait for each other."""
    comm = communicator(global_process_set)
    if comm is None:
        return
    if runtime().session is not None and getattr(optimizer, "_session", None) is not None:
        comm.Barrier()
        return
    optimizer.load_state_dict(broadcast_object(optimizer.state_dict(), root_rank))

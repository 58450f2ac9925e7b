"""Horovod's tensor collectives, among the workers (the server takes no part).

Every call of ``horovod.torch``'s ``mpi_ops`` with its signature: allreduce,
allgather, broadcast, alltoall, reducescatter, their grouped, in-place and
asynchronous forms, ``synchronize``/``poll``, ``barrier``.  They run over MPI
on the workers' communicator (or a process set's), with or without Horovod,
and give Horovod's answers.  On the server rank and when training locally
they answer as a job of one worker would.

The asynchronous forms complete before they return (a handle then holds the
result): these calls serve metrics and bookkeeping, not gradients, which go
to the parameter server, so there is nothing to overlap.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..common.errors import HvdDcasgdValueError
from ..common.tensors import byte_view
from ..runtime.roles import runtime
from .compression import Compression
from .process_sets import ProcessSet, communicator, global_process_set

#: Reduction operations, by Horovod's names.
Average, Sum, Min, Max, Product, Adasum = "average", "sum", "min", "max", "product", "adasum"


def _reduction(op: Optional[str], average: Optional[bool]) -> str:
    if average is not None:
        if op is not None:
            raise HvdDcasgdValueError("hvd_dcasgd: give op or average, not both")
        return Average if average else Sum
    op = Average if op is None else op
    if op not in (Average, Sum, Min, Max, Product):
        raise HvdDcasgdValueError(f"hvd_dcasgd: the collectives support Average, Sum, Min, Max and Product, not "
                                  f"{op!r} (Adasum needs Horovod's own allreduce)")
    return op


def _host(tensor: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return tensor.detach().to("cpu", dtype=dtype or tensor.dtype, copy=True).contiguous()


def _reduce(comm: Any, host: torch.Tensor, op: str) -> torch.Tensor:
    """``host`` reduced over ``comm`` in place; Average divides by its size."""
    if comm is None:
        return host
    mpi = runtime().mpi
    reduction = {Average: mpi.SUM, Sum: mpi.SUM, Min: mpi.MIN, Max: mpi.MAX, Product: mpi.PROD}[op]
    comm.Allreduce(mpi.IN_PLACE, host.numpy(), op=reduction)
    if op == Average:
        size = comm.Get_size()
        host = host / size if host.is_floating_point() else host // size
    return host


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: type = Compression.none, op: Optional[str] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """A new tensor: ``tensor`` reduced over the workers (``op``, default Average)."""
    op = _reduction(op, average)
    wire = compression.wire(tensor.dtype) if tensor.is_floating_point() else tensor.dtype
    host = _host(tensor, wire)
    if prescale_factor != 1.0:
        host.mul_(prescale_factor)
    if wire in (torch.float16, torch.bfloat16):  # MPI has no 16-bit float reduction: add in float32, round once
        host = _reduce(communicator(process_set), host.float(), op).to(wire)
    else:
        host = _reduce(communicator(process_set), host, op)
    if postscale_factor != 1.0:
        host.mul_(postscale_factor)
    return host.to(tensor.device, tensor.dtype)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[str] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place :func:`allreduce`."""
    return tensor.copy_(allreduce(tensor, average, name, Compression.none, op, prescale_factor, postscale_factor,
                                  process_set))


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                      compression: type = Compression.none, op: Optional[str] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """:func:`allreduce` of each tensor."""
    return [allreduce(t, average, name, compression, op, prescale_factor, postscale_factor, process_set)
            for t in tensors]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                       op: Optional[str] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """In-place :func:`grouped_allreduce`."""
    return [allreduce_(t, average, name, op, prescale_factor, postscale_factor, process_set) for t in tensors]


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every worker's ``tensor`` concatenated along the first dimension (which may differ between workers)."""
    comm = communicator(process_set)
    if comm is None:
        return tensor.detach().clone()
    parts = comm.allgather(_host(tensor))
    return torch.cat([p.reshape(-1, *tensor.shape[1:]) for p in parts]).to(tensor.device)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """:func:`allgather` of each tensor."""
    return [allgather(t, name, process_set) for t in tensors]


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """A new tensor holding worker ``root_rank``'s ``tensor``."""
    host = _host(tensor)
    comm = communicator(process_set)
    if comm is not None:
        comm.Bcast(byte_view(host), root=root_rank)
    return host.to(tensor.device)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place :func:`broadcast`."""
    with torch.no_grad():
        return tensor.copy_(broadcast(tensor, root_rank, name, process_set))


def _even_splits(rows: int, parts: int) -> List[int]:
    return [rows // parts + (1 if r < rows % parts else 0) for r in range(parts)]


def alltoall(tensor: torch.Tensor, splits: Optional[torch.Tensor] = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Send ``splits[r]`` rows of ``tensor`` (first dimension, in order) to
    worker r; return the rows received, concatenated in rank order, and, when
    ``splits`` was given, how many came from each worker."""
    comm = communicator(process_set)
    size = 1 if comm is None else comm.Get_size()
    counts = _even_splits(tensor.shape[0], size) if splits is None else [int(s) for s in splits]
    if len(counts) != size or sum(counts) != tensor.shape[0]:
        raise HvdDcasgdValueError(f"hvd_dcasgd: alltoall splits {counts} do not add up to {tensor.shape[0]} rows "
                                  f"into {size} parts")
    pieces = list(torch.split(_host(tensor), counts))
    received = pieces if comm is None else comm.alltoall(pieces)
    output = torch.cat([p.reshape(-1, *tensor.shape[1:]) for p in received]).to(tensor.device)
    if splits is None:
        return output
    return output, torch.tensor([p.shape[0] for p in received], dtype=torch.int32)


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, compression: type = Compression.none,
                  op: str = Average, process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """``tensor`` reduced over the workers, then split along the first
    dimension: worker r keeps the r-th part (the first parts one row longer
    where the rows do not divide evenly)."""
    comm = communicator(process_set)
    reduced = allreduce(tensor, None, name, compression, op, prescale_factor, postscale_factor, process_set)
    if comm is None:
        return reduced
    counts = _even_splits(tensor.shape[0], comm.Get_size())
    return torch.split(reduced, counts)[comm.Get_rank()].clone()


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression: type = Compression.none, op: str = Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """:func:`reducescatter` of each tensor."""
    return [reducescatter(t, name, compression, op, process_set, prescale_factor, postscale_factor) for t in tensors]


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every worker (of ``process_set``) has called ``barrier``."""
    comm = communicator(process_set)
    if comm is not None:
        comm.Barrier()


# --- asynchronous forms: handles ---------------------------------------------
_results: Dict[int, Any] = {}
_handles = itertools.count(1)


def _handle(result: Any) -> int:
    handle = next(_handles)
    _results[handle] = result
    return handle


def poll(handle: int) -> bool:
    """Whether the operation of ``handle`` has completed (always, here)."""
    return handle in _results


def synchronize(handle: int) -> Any:
    """The result of the operation of ``handle`` (``None`` for an unknown one, as Horovod's)."""
    return _results.pop(handle, None)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    return _handle(allreduce(tensor, average, name, Compression.none, op, prescale_factor, postscale_factor,
                             process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    return _handle(allreduce_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set) -> int:
    return _handle(grouped_allreduce(tensors, average, name, Compression.none, op, prescale_factor,
                                     postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set) -> int:
    return _handle(grouped_allreduce_(tensors, average, name, op, prescale_factor, postscale_factor, process_set))


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    return _handle(allgather(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    return _handle(grouped_allgather(tensors, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    return _handle(broadcast(tensor, root_rank, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    return _handle(broadcast_(tensor, root_rank, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """As Horovod's: :func:`synchronize` gives (output, received splits)."""
    result = alltoall(tensor, torch.tensor(_even_splits(tensor.shape[0], _size(process_set)))
                      if splits is None else splits, name, process_set)
    return _handle(result)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    return _handle(reducescatter(tensor, name, Compression.none, op, process_set, prescale_factor, postscale_factor))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0) -> int:
    return _handle(grouped_reducescatter(tensors, name, Compression.none, op, process_set, prescale_factor,
                                         postscale_factor))


def sparse_allreduce_async(tensor: torch.Tensor, name: Optional[str], op: Optional[str],
                           process_set: ProcessSet = global_process_set) -> int:
    """A sparse tensor's allreduce, as Horovod does it: every worker's indices
    and values gathered into one (uncoalesced) sparse tensor, divided by the
    number of workers for Average."""
    op = _reduction(op, None)
    if op not in (Average, Sum):
        raise HvdDcasgdValueError("hvd_dcasgd: sparse allreduce supports Average and Sum")
    sparse = tensor.coalesce()
    indices = allgather(sparse.indices().t().contiguous(), name, process_set).t()
    values = allgather(sparse.values(), name, process_set)
    if op == Average:
        values = values / _size(process_set)
    return _handle(torch.sparse_coo_tensor(indices, values, tensor.shape))


def _size(process_set: ProcessSet) -> int:
    comm = communicator(process_set)
    return 1 if comm is None else comm.Get_size()


__all__ = [
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "allgather", "allgather_async", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "poll", "reducescatter", "reducescatter_async",
    "sparse_allreduce_async", "synchronize",
]

"""The bytes one call reads and writes, counted from the transfers it makes.

:func:`count` runs a call once and adds up the memory each of its operations
touches: every torch operation it dispatches (seen through a
``TorchDispatchMode``: the tensors an operation takes are read, those it
returns or writes in place are written; views move nothing), and every pass of
the C kernel (:func:`hvd_dcasgd.common.native.dcasgd_f32`, whose streams
:func:`hvd_dcasgd.common.native.dcasgd_f32_streams` names from the variant it
runs).  A byte touched twice counts twice, as two passes over memory cost
twice.  The benchmarks divide these counts by the time of the same call to
state every rate as bytes per second, against a copy measured in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hvd_dcasgd.common import native

#: In-place operations that overwrite their first argument without reading it.
OVERWRITES = {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_"}
#: Operations that allocate without writing.
ALLOCATES = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


@dataclass
class Traffic:
    """Bytes read and written."""

    read: int = 0
    written: int = 0

    @property
    def total(self) -> int:
        return self.read + self.written


def _tensors(values: Iterable[Any]) -> List[torch.Tensor]:
    return [t for t in tree_leaves(list(values)) if isinstance(t, torch.Tensor)]


class _Counter(TorchDispatchMode):
    def __init__(self, traffic: Traffic):
        super().__init__()
        self.traffic = traffic

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.is_view or name in ALLOCATES or name in ("detach", "alias", "_local_scalar_dense"):
            return out
        schema = func._schema.arguments
        written, read = [], []
        values = list(args) + [kwargs.get(a.name) for a in schema[len(args):]]
        for argument, value in zip(schema, values):
            tensors = _tensors([value])
            if argument.alias_info is not None and argument.alias_info.is_write:
                written += tensors
                if argument.kwarg_only or name in OVERWRITES:  # an out= argument, or overwritten whole
                    continue
            read += tensors
        if not any(a.alias_info is not None and a.alias_info.is_write for a in schema):
            written += _tensors([out])  # a new tensor
        self.traffic.read += sum(t.nbytes for t in read)
        self.traffic.written += sum(t.nbytes for t in written)
        return out


def count(call: Callable[[], Any]) -> Traffic:
    """Run ``call`` once; the bytes its torch operations and C kernel passes read and write."""
    traffic = Traffic()
    kernel = native.dcasgd_f32

    def counted_kernel(*args, **kwargs):
        ran = kernel(*args, **kwargs)
        if ran:
            reads, writes = native.dcasgd_f32_streams(*args, **kwargs)
            traffic.read += sum(t.nbytes for t in reads)
            traffic.written += sum(t.nbytes for t in writes)
        return ran

    native.dcasgd_f32 = counted_kernel
    try:
        with _Counter(traffic):
            call()
    finally:
        native.dcasgd_f32 = kernel
    return traffic

"""How S parameter servers split the model: contiguous slices of the flat
parameter vector, balanced by bytes.

DC-ASGD's arithmetic is element-wise (the Taylor term, MeanSquare, SGD's and
Adam's steps), so a server that owns a slice -- its weights, its backups, its
compensation state and its optimizer state -- computes exactly what one
server would on those elements.  A slice may end inside a parameter: every
element-wise optimizer is exact under any partition.  An optimizer whose step
looks at a whole tensor at once (LARS/LAMB-style trust ratios, Adafactor's
factored moments, Shampoo) is exact only when every parameter lies in one
slice, so for those (and for any optimizer class this module does not know)
the cuts go on parameter boundaries.  An optimizer that needs every
parameter at once (L-BFGS) cannot be sharded.

Every slice has one dtype (the layout has one), so bytes are proportional to
elements; the cuts are in elements.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from .errors import HvdDcasgdValueError

__all__ = ["ELEMENTWISE", "TOLERANCE", "check_shardable", "is_elementwise", "partition"]

#: A cut may move to the nearest parameter boundary when every slice then
#: stays within this fraction of an even share.
TOLERANCE = 0.03
#: A cut inside a parameter is rounded to this many elements (64 bytes of
#: float32: a cache line, so two servers never write one line).
ALIGN_ELEMENTS = 16

#: torch.optim classes whose step is element-wise (their state is shaped like
#: the parameter, or a step count every element shares): exact under any cut.
ELEMENTWISE = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam,
    torch.optim.RMSprop, torch.optim.Rprop, torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.ASGD,
)
#: Optimizers that need every parameter at once: no partition is exact.
UNSHARDABLE = (torch.optim.LBFGS, torch.optim.SparseAdam)


def is_elementwise(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer``'s step is exact under any cut (its exact class
    is one of :data:`ELEMENTWISE`: a subclass may look at whole tensors)."""
    return type(optimizer) in ELEMENTWISE


def check_shardable(optimizer: torch.optim.Optimizer, servers: int) -> None:
    """Refuse, with a sentence, an optimizer that ``servers`` > 1 cannot run exactly."""
    if servers > 1 and isinstance(optimizer, UNSHARDABLE):
        raise HvdDcasgdValueError(
            f"hvd_dcasgd: {type(optimizer).__name__} needs every parameter at once, so it cannot run on "
            f"{servers} servers; use one server")


def partition(offsets: Sequence[int], servers: int, whole_tensors: bool = False,
              tolerance: float = TOLERANCE) -> List[Tuple[int, int]]:
    """``servers`` contiguous (start, end) slices of the flat vector whose
    parameter boundaries are ``offsets`` (0, ..., numel), in elements.

    Cut k goes to the parameter boundary nearest to k * numel / servers when
    every slice then stays within ``tolerance`` of an even share; otherwise
    at the even share itself (rounded to :data:`ALIGN_ELEMENTS`), inside a
    parameter.  With ``whole_tensors`` every cut is on a boundary, balanced
    as well as the parameters allow; a slice left empty is an error.

    Arguments:
        offsets: the flat vector's parameter boundaries, ascending, from 0 to
            its number of elements (``ModelLayout.offsets``).
        servers: the number of slices, at least 1.
        whole_tensors: cut only between parameters (an optimizer that is not
            :func:`is_elementwise`).
        tolerance: how far from an even share a slice may be for the cuts to
            stay on parameter boundaries.
    """
    numel = offsets[-1]
    if servers < 1:
        raise HvdDcasgdValueError(f"hvd_dcasgd: the number of servers must be at least 1, not {servers}")
    if servers == 1:
        return [(0, numel)]
    share = numel / servers
    on_boundaries = _nearest_boundaries(offsets, servers)
    sizes = [b - a for a, b in zip(on_boundaries, on_boundaries[1:])]
    if whole_tensors or all(abs(size - share) <= tolerance * share for size in sizes):
        cuts = on_boundaries
    else:
        cuts = [0, *(min(numel, round(k * share / ALIGN_ELEMENTS) * ALIGN_ELEMENTS) for k in range(1, servers)),
                numel]
    slices = list(zip(cuts, cuts[1:]))
    empty = [s for s, (a, b) in enumerate(slices) if a >= b]
    if empty:
        why = (f"the model's {len(offsets) - 1} parameters cannot be split whole into {servers} non-empty slices"
               if whole_tensors else f"{numel} elements cannot be split into {servers} slices of at least "
               f"{ALIGN_ELEMENTS}")
        raise HvdDcasgdValueError(f"hvd_dcasgd: {why}; use fewer servers (server {empty[0]} would hold nothing)")
    return slices


def _nearest_boundaries(offsets: Sequence[int], servers: int) -> List[int]:
    """Cuts at the parameter boundaries nearest to the even shares, each
    after the one before and leaving a boundary for every cut after it (so
    that with enough parameters no slice is empty)."""
    numel, last = offsets[-1], len(offsets) - 1
    cuts, index = [0], 0
    for k in range(1, servers):
        target = k * numel / servers
        choices = range(index + 1, last - (servers - k) + 1)
        if not choices:
            return [*cuts, *[numel] * (servers - k), numel]  # too few parameters: the empty slices are refused
        index = min(choices, key=lambda i: (abs(offsets[i] - target), i))
        cuts.append(offsets[index])
    return [*cuts, numel]

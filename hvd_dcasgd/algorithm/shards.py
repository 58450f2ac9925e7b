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
the splits go on parameter boundaries.  An optimizer that needs every
parameter at once (L-BFGS) cannot be sharded.

Every slice has one dtype (the layout has one), so bytes are proportional to
elements; the splits are in elements.

A server sees its slice as a model of its own (:func:`shard_layout`): one
*piece* per parameter it holds some of, the whole parameter or, where a split
falls inside it, a flat run of its elements.  :func:`shard_optimizer` builds
the same optimizer over the pieces; :func:`shard_state` and
:func:`merge_states` move an optimizer's state between the model's
parameters and the pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

import torch

from ..common.errors import HvdDcasgdValueError
from ..protocol.layout import ModelLayout, TensorSpec, trained_parameters

__all__ = ["ELEMENTWISE", "TOLERANCE", "Piece", "check_shardable", "is_elementwise", "merge_states", "partition",
           "shard_layout", "shard_optimizer", "shard_state", "shard_tensors"]

#: A split may move to the nearest parameter boundary when every slice then
#: stays within this fraction of an even share.
TOLERANCE = 0.03
#: A split inside a parameter is rounded to this many elements (64 bytes of
#: float32: a cache line, so two servers never write one line).
ALIGN_ELEMENTS = 16

#: torch.optim classes whose step is element-wise (their state is shaped like
#: the parameter, or a step count every element shares): exact under any split.
ELEMENTWISE = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam,
    torch.optim.RMSprop, torch.optim.Rprop, torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.ASGD,
)
#: Optimizers that need every parameter at once: no partition is exact.
UNSHARDABLE = (torch.optim.LBFGS, torch.optim.SparseAdam)


def is_elementwise(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer``'s step is exact under any split (its exact class
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

    Split k goes to the parameter boundary nearest to k * numel / servers when
    every slice then stays within ``tolerance`` of an even share; otherwise
    at the even share itself (rounded to :data:`ALIGN_ELEMENTS`), inside a
    parameter.  With ``whole_tensors`` every split is on a boundary, balanced
    as well as the parameters allow; a slice left empty is an error.

    Arguments:
        offsets: the flat vector's parameter boundaries, ascending, from 0 to
            its number of elements (``ModelLayout.offsets``).
        servers: the number of slices, at least 1.
        whole_tensors: split only between parameters (an optimizer that is not
            :func:`is_elementwise`).
        tolerance: how far from an even share a slice may be for the splits to
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
        splits = on_boundaries
    else:
        splits = [0, *(min(numel, round(k * share / ALIGN_ELEMENTS) * ALIGN_ELEMENTS) for k in range(1, servers)),
                numel]
    slices = list(zip(splits, splits[1:]))
    empty = [s for s, (a, b) in enumerate(slices) if a >= b]
    if empty:
        why = (f"the model's {len(offsets) - 1} parameters cannot be split whole into {servers} non-empty slices"
               if whole_tensors else f"{numel} elements cannot be split into {servers} slices of at least "
               f"{ALIGN_ELEMENTS}")
        raise HvdDcasgdValueError(f"hvd_dcasgd: {why}; use fewer servers (server {empty[0]} would hold nothing)")
    return slices


def _nearest_boundaries(offsets: Sequence[int], servers: int) -> List[int]:
    """Splits at the parameter boundaries nearest to the even shares, each
    after the one before and leaving a boundary for every split after it (so
    that with enough parameters no slice is empty)."""
    numel, last = offsets[-1], len(offsets) - 1
    splits, index = [0], 0
    for k in range(1, servers):
        target = k * numel / servers
        choices = range(index + 1, last - (servers - k) + 1)
        if not choices:
            return [*splits, *[numel] * (servers - k), numel]  # too few parameters: the empty slices are refused
        index = min(choices, key=lambda i: (abs(offsets[i] - target), i))
        splits.append(offsets[index])
    return [*splits, numel]


@dataclass(frozen=True)
class Piece:
    """The part of parameter ``index`` (in the model's layout, of param group
    ``group``) a slice holds: its flat elements ``start:end``, ``whole`` when
    that is all of them."""

    index: int
    group: int
    start: int
    end: int
    whole: bool


def pieces(layout: ModelLayout, start: int, end: int) -> List[Piece]:
    """The pieces of the flat slice ``start:end`` of ``layout``, in order."""
    groups = [g for g, size in enumerate(layout.group_sizes) for _ in range(size)]
    found = []
    for i, (a, b) in enumerate(zip(layout.offsets, layout.offsets[1:])):
        lo, hi = max(a, start), min(b, end)
        if lo < hi or (a == b and (start <= a < end or a == end == layout.numel)):  # an empty one: where it starts
            found.append(Piece(i, groups[i], lo - a, hi - a, lo == a and hi == b))
    return found


def shard_layout(layout: ModelLayout, start: int, end: int) -> Tuple[ModelLayout, List[Piece]]:
    """The layout a server holding ``start:end`` serves (a whole parameter
    keeps its name and shape; a part of one is ``name[a:b]``, flat), with
    every param group (some perhaps empty, so that the learning rates in a
    push line up), the model's buffers, and the pieces."""
    found = pieces(layout, start, end)
    specs = []
    for piece in found:
        spec = layout.params[piece.index]
        specs.append(spec if piece.whole else
                     TensorSpec(f"{spec.name}[{piece.start}:{piece.end}]", (piece.end - piece.start,), spec.dtype))
    sizes = [sum(1 for piece in found if piece.group == g) for g in range(len(layout.group_sizes))]
    return ModelLayout(specs, sizes, list(layout.untrained_state)), found


def shard_tensors(tensors: Dict[int, torch.Tensor], found: Sequence[Piece]) -> Dict[int, torch.Tensor]:
    """Tensors of the model's parameters (by index in its layout) as the
    pieces of one slice (by index among the pieces)."""
    return {j: (tensors[p.index] if p.whole else tensors[p.index].reshape(-1)[p.start:p.end])
            for j, p in enumerate(found) if p.index in tensors}


def _piece_of(value: Any, piece: Piece, shape: Tuple[int, ...]) -> Any:
    """A piece's part of one optimizer state entry, a copy: the elements of
    a tensor shaped like the parameter; anything else (a step count) whole."""
    if not torch.is_tensor(value):
        return value
    if piece.whole or tuple(value.shape) != tuple(shape):
        return value.clone()
    return value.reshape(-1)[piece.start:piece.end].clone()


def shard_state(state: Dict[str, Any], layout: ModelLayout, found: Sequence[Piece]) -> Dict[str, Any]:
    """An optimizer ``state_dict()`` of the whole model as the state of the
    optimizer over one slice's pieces (:func:`shard_optimizer`)."""
    entries = state.get("state", {})
    sliced = {}
    for j, piece in enumerate(found):
        entry = entries.get(piece.index)
        if entry is not None:
            sliced[j] = {k: _piece_of(v, piece, layout.params[piece.index].shape) for k, v in entry.items()}
    groups, j = [], 0
    for g, group in enumerate(state["param_groups"]):
        n = sum(1 for piece in found if piece.group == g)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": list(range(j, j + n))})
        j += n
    return {"state": sliced, "param_groups": groups}


def merge_states(states: Sequence[Dict[str, Any]], layout: ModelLayout,
                 found: Sequence[Sequence[Piece]]) -> Dict[str, Any]:
    """The optimizer ``state_dict()`` of the whole model from each slice's
    (``states[s]`` over the pieces ``found[s]``): a parameter's tensors put
    together from its pieces, its other entries (a step count) from its
    first piece.  A parameter some slice has not stepped yet has no state."""
    parts: Dict[int, List[Tuple[Piece, Any]]] = {}
    for state, slice_pieces in zip(states, found):
        for j, piece in enumerate(slice_pieces):
            parts.setdefault(piece.index, []).append((piece, state["state"].get(j)))
    merged = {}
    for i, entries in sorted(parts.items()):
        if any(entry is None for _, entry in entries):
            continue
        if len(entries) == 1:
            merged[i] = entries[0][1]
            continue
        shape = layout.params[i].shape
        first = entries[0][1]
        merged[i] = {k: (torch.cat([e[k].reshape(-1) for _, e in entries]).view(shape)
                         if torch.is_tensor(v) and v.dim() == 1 and v.numel() == entries[0][0].end - entries[0][0].start
                         else v) for k, v in first.items()}
    groups, i = [], 0
    for group, size in zip(states[0]["param_groups"], layout.group_sizes):
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": list(range(i, i + size))})
        i += size
    return {"state": merged, "param_groups": groups}


def shard_optimizer(optimizer: torch.optim.Optimizer, layout: ModelLayout,
                    found: Sequence[Piece]) -> torch.optim.Optimizer:
    """``optimizer``'s class, hyperparameters and state over one slice's
    pieces: a whole parameter is the model's own tensor, a part of one a new
    flat tensor holding its elements."""
    params = trained_parameters(optimizer)
    tensors = [params[p.index] if p.whole else
               params[p.index].detach().reshape(-1)[p.start:p.end].clone().requires_grad_(params[p.index].requires_grad)
               for p in found]
    groups = [{**{k: v for k, v in group.items() if k != "params"},
               "params": [t for t, p in zip(tensors, found) if p.group == g]}
              for g, group in enumerate(optimizer.param_groups)]
    try:
        sharded = type(optimizer)(groups, **optimizer.defaults)
    except (TypeError, ValueError) as exc:
        raise HvdDcasgdValueError(f"hvd_dcasgd: {type(optimizer).__name__} cannot be built again over one server's "
                                  f"slice of the parameters ({exc}); use one server") from None
    sharded.load_state_dict(shard_state(optimizer.state_dict(), layout, found))
    return sharded

"""How a model travels: one flat buffer for the weights, one message per push.

Parameters are laid out in the optimizer's order, group after group, so each
param group is one contiguous range of the flat buffer.  A push message is one
contiguous byte buffer: a float64 header (the pushing worker's learning rate
for each param group) followed by the gradient in the wire dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..common.errors import HvdDcasgdError

HEADER_ALIGN = 64


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: Tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _spec(name: str, t: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, tuple(t.shape), str(t.dtype).replace("torch.", ""))


def trained_parameters(optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
    """The optimizer's parameters, group after group: the flat buffer's order."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def untrained_state(model: torch.nn.Module, trained: Sequence[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The entries of ``model``'s state the optimizer does not train: buffers
    (BatchNorm statistics) and frozen parameters, by name."""
    trained_ids = {id(p) for p in trained}
    return {n: t for n, t in model.state_dict(keep_vars=True).items() if id(t) not in trained_ids}


class ModelLayout:
    """Names, shapes and dtypes of the trained parameters and of the rest of
    the model's state (:func:`untrained_state`: buffers and frozen parameters)."""

    def __init__(self, params: List[TensorSpec], group_sizes: List[int], untrained_state: List[TensorSpec]):
        self.params = params
        self.group_sizes = group_sizes
        self.untrained_state = untrained_state
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise HvdDcasgdError(
                f"hvd_dcasgd: every trained parameter must have one dtype, found {sorted(dtypes)}"
            )
        self.dtype = getattr(torch, params[0].dtype) if params else torch.float32
        if not self.dtype.is_floating_point:
            raise HvdDcasgdError(f"hvd_dcasgd: parameters must be floating point, found {self.dtype}")
        self.numel = sum(p.numel for p in params)
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel)

    @classmethod
    def of(
        cls,
        optimizer: torch.optim.Optimizer,
        named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
        model: Optional[torch.nn.Module] = None,
    ) -> "ModelLayout":
        """Describe what ``optimizer`` trains (names from ``named_parameters``
        or ``model``) and the rest of ``model``'s state."""
        if named_parameters is None and model is not None:
            named_parameters = model.named_parameters()
        names: Dict[int, str] = {}
        if named_parameters is not None:
            named = list(named_parameters)
            names = {id(p): n for n, p in named}
        params, group_sizes = [], []
        for g, group in enumerate(optimizer.param_groups):
            group_sizes.append(len(group["params"]))
            for i, p in enumerate(group["params"]):
                params.append(_spec(names.get(id(p), f"group{g}.param{i}"), p))
        if named_parameters is not None:
            missing = [s.name for s in params if s.name.startswith("group")]
            if missing:
                raise HvdDcasgdError(
                    f"hvd_dcasgd: named_parameters does not name {len(missing)} of the optimizer's parameters "
                    f"(first: {missing[0]}); pass model.named_parameters() of the model the optimizer trains"
                )
        trained = trained_parameters(optimizer)
        untrained = [_spec(n, t) for n, t in untrained_state(model, trained).items()] if model is not None else []
        return cls(params, group_sizes, untrained)

    def group_ranges(self) -> List[Tuple[int, int]]:
        """(start, end) of each param group in the flat buffer."""
        ranges, index = [], 0
        for size in self.group_sizes:
            ranges.append((self.offsets[index], self.offsets[index + size]))
            index += size
        return ranges

    def views(self, flat: torch.Tensor) -> List[torch.Tensor]:
        """One view of ``flat`` per parameter, shaped like it."""
        return [flat[self.offsets[i] : self.offsets[i + 1]].view(p.shape) for i, p in enumerate(self.params)]

    def mismatch(self, other: "ModelLayout") -> Optional[str]:
        """A phrase naming the first way ``other`` (a worker's) differs from
        this layout (the server's), or None."""
        if self.group_sizes != other.group_sizes:
            return (
                f"its optimizer's param groups hold {other.group_sizes} parameters, "
                f"the server's hold {self.group_sizes}"
            )
        for kind, kinds, mine, theirs in (
            ("parameter", "parameters", self.params, other.params),
            ("buffer or frozen parameter", "buffers and frozen parameters", self.untrained_state,
             other.untrained_state),
        ):
            if len(mine) != len(theirs):
                return f"it has {len(theirs)} {kinds}, the server has {len(mine)}"
            for a, b in zip(mine, theirs):
                if a != b:
                    return (
                        f"its {kind} {b.name!r} is {list(b.shape)} {b.dtype}, "
                        f"the server's {a.name!r} is {list(a.shape)} {a.dtype}"
                    )
        return None


class PushMessage:
    """A worker's push: learning rates, then the gradient, in one byte buffer.

    ``storage`` lets the server lay the same structure over an inbox.
    """

    def __init__(self, layout: ModelLayout, wire_dtype: torch.dtype, storage: Optional[torch.Tensor] = None):
        groups = len(layout.group_sizes)
        self.header_bytes = self._header_bytes(layout)
        self.nbytes = self.size(layout, wire_dtype)
        self.bytes = torch.zeros(self.nbytes, dtype=torch.uint8) if storage is None else storage[: self.nbytes]
        self.lrs = self.bytes[: groups * 8].view(torch.float64)
        self.gradient = self.bytes[self.header_bytes :].view(wire_dtype)

    @staticmethod
    def _header_bytes(layout: ModelLayout) -> int:
        return (len(layout.group_sizes) * 8 + HEADER_ALIGN - 1) // HEADER_ALIGN * HEADER_ALIGN

    @staticmethod
    def size(layout: ModelLayout, wire_dtype: torch.dtype) -> int:
        """Bytes of a push message (the size of an inbox)."""
        return PushMessage._header_bytes(layout) + layout.numel * wire_dtype.itemsize


def flatten_into(flat: torch.Tensor, views: Sequence[torch.Tensor], tensors: Sequence[Optional[torch.Tensor]]) -> None:
    """Copy ``tensors`` into ``views`` of ``flat`` (zeros for ``None``)."""
    for view, t in zip(views, tensors):
        if t is None:
            view.zero_()
        else:
            view.copy_(t)

"""Small tensor helpers shared by the sessions and the user-facing collectives."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import torch

from . import native

__all__ = ["all_finite", "broadcast_", "byte_view", "copy_checked_", "snapshot", "to_cpu"]


def all_finite(t: torch.Tensor) -> bool:
    """True when ``t`` holds no NaN or Inf.  A sum is a fast test (NaN and Inf
    propagate); only when it is not finite -- a NaN, an Inf, or a sum that
    merely overflowed -- is every element checked."""
    return math.isfinite(t.sum().item()) or bool(torch.isfinite(t).all())


def copy_checked_(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Copy ``src`` into ``dst``; return whether ``dst`` then holds no NaN or
    Inf (in ``dst``'s dtype, so a value the cast overflows counts).  One pass
    over memory with the C kernel (contiguous float32 on the CPU, both sides),
    otherwise a copy and then :func:`all_finite`."""
    finite = native.pack_f32(src, dst) if src.shape == dst.shape else None
    if finite is None:
        dst.copy_(src)
        finite = all_finite(dst)
    return finite


def byte_view(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor, as a numpy array MPI can use."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def broadcast_(comm: Any, tensors: Iterable[torch.Tensor], root: int) -> None:
    """Broadcast ``tensors`` (any device) in place from ``root`` of ``comm``."""
    for tensor in tensors:
        host = tensor.detach().to("cpu", copy=True).contiguous()
        comm.Bcast(byte_view(host), root=root)
        with torch.no_grad():
            tensor.copy_(host)


def _map_tensors(value: Any, fn) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


def to_cpu(value: Any) -> Any:
    """``value`` (a state dict) with every tensor moved to the CPU (CPU
    tensors as they are: the result may share memory with ``value``)."""
    return _map_tensors(value, lambda t: t.detach().cpu())


def snapshot(value: Any) -> Any:
    """A copy of ``value`` (a state dict) on the CPU that shares no memory
    with it: later updates do not reach the copy."""
    return _map_tensors(value, lambda t: t.detach().to("cpu", copy=True))

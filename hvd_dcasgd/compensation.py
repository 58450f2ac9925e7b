"""Delay compensation for stale gradients (DC-ASGD, Zheng et al., ICML 2017).

The functional core of the project, shaped like ``torch.optim.sgd``: one
function, :func:`dcasgd_`, with a single-tensor reference that reads like the
paper's Eq. 10, a multi-tensor (``foreach``) implementation, and a fused
implementation (a C kernel, or torch ops on cache-sized chunks where it cannot
be built) so that the whole server update costs one pass over memory.

For a gradient ``g`` computed by worker m on the weights ``w_bak(m)`` and
applied to the current weights ``w``::

    g_c = g + lambda_t * g * g * (w - w_bak(m))

with ``lambda_t = lambda_0`` (DC-ASGD-c) or, when a ``mean_square`` tensor is
given, ``lambda_t = lambda_0 / sqrt(MeanSquare + eps)`` element-wise after
``MeanSquare = m * MeanSquare + (1 - m) * g * g`` (DC-ASGD-a).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from . import native

__all__ = ["Compensation", "MODES", "dcasgd_"]

#: Every training mode a server understands.  ``none`` is plain ASGD, ``sync``
#: is synchronous SGD (the paper's SSGD baseline); neither compensates.
MODES = ("none", "constant", "adaptive", "sync")

#: Elements per chunk of the fused implementation: four such float32 chunks
#: (w, w_bak, g and one temporary) stay inside a core's L2/L3 cache.
FUSED_CHUNK = 262144


@dataclass(frozen=True)
class Compensation:
    """What the server does to a stale gradient before the optimizer sees it.

    ``lambda_0`` defaults to the paper's CIFAR-10 values: 0.04 for
    ``constant``, 2.0 for ``adaptive``.  ``per_worker_mean_square`` keeps one
    MeanSquare per worker (the authors' code) instead of the paper's global one.
    """

    mode: str = "adaptive"
    lambda_0: Optional[float] = None
    mean_square_momentum: float = 0.95
    eps: float = 1e-7
    per_worker_mean_square: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(
                f"hvd_dcasgd: unknown compensation {self.mode!r}; choose one of {', '.join(MODES)}"
            )
        if self.lambda_0 is None:
            object.__setattr__(self, "lambda_0", {"constant": 0.04, "adaptive": 2.0}.get(self.mode, 0.0))
        if not (self.lambda_0 >= 0.0 and math.isfinite(self.lambda_0)):
            raise ValueError(f"hvd_dcasgd: lambda_0 must be a finite number >= 0, got {self.lambda_0}")
        if not 0.0 <= self.mean_square_momentum < 1.0:
            raise ValueError("hvd_dcasgd: mean_square_momentum must lie in [0, 1)")

    @property
    def compensates(self) -> bool:
        """True when the mode applies the Taylor correction at all."""
        return self.mode in ("constant", "adaptive") and self.lambda_0 > 0.0

    @property
    def adaptive(self) -> bool:
        return self.mode == "adaptive"


def dcasgd_(
    grads: Sequence[Tensor],
    weights: Sequence[Tensor],
    backups: Sequence[Tensor],
    mean_squares: Optional[Sequence[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float = 0.95,
    eps: float = 1e-7,
    lr: Optional[float] = None,
    foreach: Optional[bool] = None,
    fused: Optional[bool] = None,
) -> None:
    """Delay-compensate ``grads`` against ``weights - backups``, in place.

    Without ``lr``, each gradient is replaced by its compensated value, ready
    for any optimizer.  With ``lr``, the function instead performs the whole
    plain-SGD server update of the paper's Algorithm 2 -- ``w -= lr * g_c``,
    then ``w_bak = w`` -- and leaves ``grads`` as they came in, so that the
    fused implementation reads w, w_bak, g and writes w, w_bak exactly once.
    ``mean_squares`` (adaptive mode) are updated in place; pass ``None`` for a
    constant lambda.  ``foreach``/``fused`` pick the implementation; by default
    the fused one is used for contiguous CPU float tensors.
    """
    if not (len(grads) == len(weights) == len(backups)):
        raise ValueError("hvd_dcasgd: grads, weights and backups must have the same length")
    if mean_squares is not None and len(mean_squares) != len(grads):
        raise ValueError("hvd_dcasgd: one mean_square tensor per gradient is needed")
    if fused is None and foreach is None:
        fused = all(t.device.type == "cpu" and t.is_contiguous() for t in (*grads, *weights, *backups))
        foreach = not fused
    if fused:
        impl = _fused_dcasgd
    elif foreach:
        impl = _multi_tensor_dcasgd
    else:
        impl = _single_tensor_dcasgd
    impl(
        list(grads),
        list(weights),
        list(backups),
        None if mean_squares is None else list(mean_squares),
        lambda_0=lambda_0,
        mean_square_momentum=mean_square_momentum,
        eps=eps,
        lr=lr,
    )


def _single_tensor_dcasgd(
    grads: List[Tensor],
    weights: List[Tensor],
    backups: List[Tensor],
    mean_squares: Optional[List[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float,
    eps: float,
    lr: Optional[float],
) -> None:
    """Reference implementation: the paper's formulas, one tensor at a time."""
    for i, (g, w, w_bak) in enumerate(zip(grads, weights, backups)):
        g = g.to(w.dtype)
        if mean_squares is None:
            lambda_t = lambda_0
        else:
            mean_square = mean_squares[i]
            mean_square.mul_(mean_square_momentum).add_((1 - mean_square_momentum) * g * g)
            lambda_t = lambda_0 / torch.sqrt(mean_square + eps)
        compensated = g + lambda_t * g * g * (w - w_bak)
        if lr is None:
            grads[i].copy_(compensated)
        else:
            w.sub_(lr * compensated)
            w_bak.copy_(w)


def _multi_tensor_dcasgd(
    grads: List[Tensor],
    weights: List[Tensor],
    backups: List[Tensor],
    mean_squares: Optional[List[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float,
    eps: float,
    lr: Optional[float],
) -> None:
    """The same arithmetic with ``torch._foreach`` ops over the whole list."""
    if not grads:
        return
    g = [t.to(w.dtype) for t, w in zip(grads, weights)]
    gap = torch._foreach_sub(weights, backups)
    correction = torch._foreach_mul(g, g)
    torch._foreach_mul_(correction, gap)
    if mean_squares is None:
        torch._foreach_mul_(correction, lambda_0)
    else:
        torch._foreach_mul_(mean_squares, mean_square_momentum)
        torch._foreach_addcmul_(mean_squares, g, g, value=1 - mean_square_momentum)
        denom = torch._foreach_add(mean_squares, eps)
        torch._foreach_sqrt_(denom)
        torch._foreach_div_(correction, denom)
        torch._foreach_mul_(correction, lambda_0)
    torch._foreach_add_(correction, g)
    if lr is None:
        for dst, src in zip(grads, correction):
            dst.copy_(src)
    else:
        torch._foreach_add_(weights, correction, alpha=-lr)
        for w_bak, w in zip(backups, weights):
            w_bak.copy_(w)


def _fused_dcasgd(
    grads: List[Tensor],
    weights: List[Tensor],
    backups: List[Tensor],
    mean_squares: Optional[List[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float,
    eps: float,
    lr: Optional[float],
) -> None:
    """One pass over memory (read g, w, w_bak; write w, w_bak or g): the C
    kernel of :mod:`native` for float32, else torch ops on cache-sized chunks,
    so that each chunk's temporaries never leave the cache."""
    for i, (grad, weight, backup) in enumerate(zip(grads, weights, backups)):
        g_all, w_all, b_all = grad.view(-1), weight.view(-1), backup.view(-1)
        ms_all = None if mean_squares is None else mean_squares[i].view(-1)
        if native.dcasgd_f32(g_all, w_all, b_all, ms_all, lambda_0, mean_square_momentum, eps, lr):
            continue
        numel = w_all.numel()
        if numel == 0:
            continue
        chunk = min(FUSED_CHUNK, numel)
        scratch = torch.empty(3 * chunk, dtype=w_all.dtype, device=w_all.device)
        for start in range(0, numel, chunk):
            end = min(start + chunk, numel)
            n = end - start
            w, w_bak = w_all[start:end], b_all[start:end]
            g = g_all[start:end]
            cast = g.dtype != w.dtype
            if cast:
                g = scratch[2 * chunk : 2 * chunk + n].copy_(g)
            if lr is not None and lambda_0 == 0.0 and ms_all is None:
                w.add_(g, alpha=-lr)  # plain ASGD: nothing to compensate
                w_bak.copy_(w)
                continue
            correction = torch.sub(w, w_bak, out=scratch[:n]).mul_(g).mul_(g)  # g * g * (w - w_bak)
            # without lr: g += lambda_t * correction; with lr: w -= lr * (g + lambda_t * correction)
            target, scale = (g, lambda_0) if lr is None else (w.add_(g, alpha=-lr), -lr * lambda_0)
            if ms_all is None:
                target.add_(correction, alpha=scale)
            else:  # lambda_t = lambda_0 / sqrt(MeanSquare + eps)
                ms = ms_all[start:end]
                ms.mul_(mean_square_momentum).addcmul_(g, g, value=1 - mean_square_momentum)
                target.addcdiv_(correction, torch.add(ms, eps, out=scratch[chunk : chunk + n]).sqrt_(), value=scale)
            if lr is not None:
                w_bak.copy_(w)
            elif cast:
                g_all[start:end].copy_(g)

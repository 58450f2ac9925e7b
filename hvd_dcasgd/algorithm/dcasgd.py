"""DC-ASGD's formula, functional (Zheng et al., ICML 2017, Eq. 10): the
stale gradient ``g``, computed on ``w_bak(m)``, corrected towards the current
weights ``w``, ``g + clamp(lambda_t * g * g * (w - w_bak(m)), -bound * |g|,
bound * |g|)``, with ``lambda_t = lambda_0`` (DC-ASGD-c) or, after
``MeanSquare = m * MeanSquare + (1 - m) * g * g``, ``lambda_0 / sqrt(MeanSquare
+ eps)`` (DC-ASGD-a).  ``bound=math.inf`` is the paper's rule exactly.

Shaped like ``torch.optim.sgd``: :func:`dcasgd_`, the one entry point, picks
the implementation and dispatches to a single-tensor reference that reads
like Eq. 10, a multi-tensor (``foreach``) implementation, and a fused one (the
C kernel of :mod:`hvd_dcasgd.common.native`, or torch ops on cache-sized
chunks where it cannot be built) that reads and writes each element once;
:func:`clamp_correction_` is the bound, with the C kernel's arithmetic.  No
registry and no settings here: the ``constant`` and ``adaptive`` rules of
:mod:`hvd_dcasgd.algorithm.rules` call :func:`dcasgd_`.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from ..common.config import VARIABLES
from ..common.errors import HvdDcasgdValueError
from ..common import native

__all__ = ["clamp_correction_", "dcasgd_"]

#: Elements per chunk of the fused implementation: four such float32 chunks
#: (w, w_bak, g and one temporary) stay inside a core's L2/L3 cache.
FUSED_CHUNK = 262144


def dcasgd_(
    grads: Sequence[Tensor],
    weights: Sequence[Tensor],
    backups: Sequence[Tensor],
    mean_squares: Optional[Sequence[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float = VARIABLES["HVD_DCASGD_MEAN_SQUARE_MOMENTUM"].default,
    eps: float = VARIABLES["HVD_DCASGD_EPS"].default,
    bound: float = math.inf,
    foreach: Optional[bool] = None,
    fused: Optional[bool] = None,
) -> None:
    """Delay-compensate ``grads`` against ``weights - backups``, in place:
    each gradient is replaced by its compensated value, ready for any
    optimizer.  ``mean_squares`` (adaptive) are updated in place; pass
    ``None`` for a constant lambda.  ``bound`` limits the correction, element
    by element, to ``bound * |g|`` (``math.inf``, the default here: the
    paper's formula).  ``foreach``/``fused`` pick the implementation; by
    default the fused one is used for contiguous CPU tensors (one pass over
    memory), ``foreach`` elsewhere (a GPU).
    """
    if not (len(grads) == len(weights) == len(backups)):
        raise HvdDcasgdValueError("hvd_dcasgd: grads, weights and backups must have the same length")
    if mean_squares is not None and len(mean_squares) != len(grads):
        raise HvdDcasgdValueError("hvd_dcasgd: one mean_square tensor per gradient is needed")
    if not (bound > 0):
        raise HvdDcasgdValueError(f"hvd_dcasgd: bound must be a number > 0, or inf, got {bound!r}")
    # The path is chosen here and nowhere else.  Fused reads and writes each element once, what a CPU's
    # memory bandwidth rewards, but views each tensor flat, so it needs contiguous ones; elsewhere (a GPU)
    # foreach, a few kernels over the whole list rather than one per chunk.
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
        bound=bound,
    )


def clamp_correction_(correction: Tensor, g: Tensor, bound: float) -> Tensor:
    """``correction`` limited to ``[-bound * |g|, bound * |g|]``, in place;
    nothing with ``bound`` infinite.  The C kernel's arithmetic, bit for bit:
    ``lim = bound * |g|``, then ``c > lim ? lim : c < -lim ? -lim : c`` (NaN
    stays NaN, a zero keeps its sign)."""
    if math.isinf(bound):
        return correction
    lim = torch.abs(g).mul_(bound)
    low = torch.neg(lim)
    return correction.copy_(torch.where(correction > lim, lim, torch.where(correction < low, low, correction)))


def _single_tensor_dcasgd(
    grads: List[Tensor],
    weights: List[Tensor],
    backups: List[Tensor],
    mean_squares: Optional[List[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float,
    eps: float,
    bound: float,
) -> None:
    """Reference implementation: the paper's formulas, one tensor at a time,
    the correction then bounded."""
    for i, (g, w, w_bak) in enumerate(zip(grads, weights, backups)):
        g = g.to(w.dtype)
        if mean_squares is None:
            lambda_t = lambda_0
        else:
            mean_square = mean_squares[i]
            mean_square.mul_(mean_square_momentum).add_((1 - mean_square_momentum) * g * g)
            lambda_t = lambda_0 / torch.sqrt(mean_square + eps)
        correction = lambda_t * g * g * (w - w_bak)
        grads[i].copy_(g + clamp_correction_(correction, g, bound))


def _multi_tensor_dcasgd(
    grads: List[Tensor],
    weights: List[Tensor],
    backups: List[Tensor],
    mean_squares: Optional[List[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float,
    eps: float,
    bound: float,
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
    for c, gradient in zip(correction, g):
        clamp_correction_(c, gradient, bound)
    torch._foreach_add_(correction, g)
    for dst, src in zip(grads, correction):
        dst.copy_(src)


def _fused_dcasgd(
    grads: List[Tensor],
    weights: List[Tensor],
    backups: List[Tensor],
    mean_squares: Optional[List[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float,
    eps: float,
    bound: float,
) -> None:
    """One pass over memory (read g, w, w_bak; write g): the C kernel of
    :mod:`hvd_dcasgd.common.native` for float32, else torch ops on
    cache-sized chunks, so that each chunk's temporaries never leave the
    cache."""
    for i, (grad, weight, backup) in enumerate(zip(grads, weights, backups)):
        g_all, w_all, b_all = grad.view(-1), weight.view(-1), backup.view(-1)
        ms_all = None if mean_squares is None else mean_squares[i].view(-1)
        if native.dcasgd_f32(g_all, w_all, b_all, ms_all, lambda_0, mean_square_momentum, eps, lr=None,
                             bound=bound):
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
            if ms_all is None:
                lambda_t = lambda_0
            else:  # lambda_t = lambda_0 / sqrt(MeanSquare + eps), the reference's rounding
                ms = ms_all[start:end]
                ms.mul_(mean_square_momentum).add_(torch.mul(g, 1 - mean_square_momentum, out=scratch[:n]).mul_(g))
                lambda_t = torch.add(ms, eps, out=scratch[chunk : chunk + n]).sqrt_().reciprocal_().mul_(lambda_0)
            correction = torch.mul(g, lambda_t, out=scratch[:n]).mul_(g)  # lambda_t * g * g * (w - w_bak)
            correction.mul_(torch.sub(w, w_bak, out=scratch[chunk : chunk + n]))
            g.add_(clamp_correction_(correction, g, bound))
            if cast:
                g_all[start:end].copy_(g)

"""A staged server's update, split into chunks and pipelined with its copies.

A GPU server's update is bound by its host link: the gradient comes in from
window memory and the weights go out to it.  Where the update is element
by element -- ``torch.optim.SGD`` (momentum, Nesterov, weight decay) after a
compensation the C kernel computes -- it can run chunk by chunk, so
:class:`~hvd_dcasgd.protocol.staging.Staging` copies chunk k+1 in while chunk k is
updated and chunk k-1 copied out (:func:`~hvd_dcasgd.protocol.staging.pipeline`).
Each chunk runs the C kernel's arithmetic (``dcasgd_kernel.c``, the
``fused_sgd`` path) as torch operations on the device.  :func:`pipelined`
decides, in one place, and says why.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..protocol.layout import trained_parameters
from ..protocol.staging import Staging
from .dcasgd import clamp_correction_
from .update import FlatMomentum, ServerUpdate, is_sgd


def pipelined(update: ServerUpdate, staging: Optional[Staging]) -> Tuple[bool, str]:
    """Whether the staged server's update runs in chunks pipelined with its
    copies, and why: it needs staging, ``torch.optim.SGD`` itself, a
    compensation the C kernel computes (so it is element by element), no
    frozen parameter (torch skips those) and no path chosen by the caller."""
    if staging is None:
        return False, "the server's model lives in window memory: nothing to stage"
    if update.requested_path is not None:
        return False, f"the caller chose the {update.requested_path!r} path"
    if not is_sgd(update.optimizer):
        return False, f"{type(update.optimizer).__name__} is not torch.optim.SGD: its step runs whole"
    if update.compensation.rule.kernel(update.compensation) is None:
        return False, f"the {update.compensation.mode!r} compensation is not computed element by element here"
    if not all(p.requires_grad for p in trained_parameters(update.optimizer)):
        return False, "a frozen parameter must not move, which only torch's step knows"
    return True, "torch.optim.SGD after an element-wise compensation: copies and update pipelined in chunks"


def sgd_slice_(grad: Tensor, w: Tensor, w_bak: Tensor, mean_square: Optional[Tensor], buffer: Optional[Tensor], *,
               lambda_0: float, keep: float, blend: float, eps: float, bound: float, lr: float,
               weight_decay: float, momentum: float, carry: float, undamped: float, nesterov: bool) -> None:
    """The C kernel's step on one slice, in torch operations in its order:
    compensate ``grad`` against ``w - w_bak`` (MeanSquare when given; the
    correction bounded by ``bound * |g|``), SGD's step (weight decay, momentum
    ``buffer = carry * buffer + undamped * d``, Nesterov), then ``w_bak = w``;
    ``grad`` is left as it is."""
    g = grad
    if mean_square is not None:
        mean_square.mul_(keep).add_((blend * g) * g)
        lambda_t = torch.sqrt(mean_square + eps).reciprocal_().mul_(lambda_0)
        d = g + clamp_correction_(lambda_t * g * g * (w - w_bak), g, bound)
    elif lambda_0 != 0.0:
        d = g + clamp_correction_(lambda_0 * g * g * (w - w_bak), g, bound)
    else:
        d = g
    if weight_decay != 0.0:
        d = d + weight_decay * w
    if buffer is not None:
        buffer.mul_(carry).add_(undamped * d)
        d = d + momentum * buffer if nesterov else buffer
    w.sub_(lr * d)
    w_bak.copy_(w)


class PipelinedUpdate:
    """The update of :class:`ServerUpdate` (its optimizer, compensation and
    state) run chunk by chunk inside the staging's pipeline."""

    def __init__(self, update: ServerUpdate, staging: Staging):
        self.update = update
        self.staging = staging
        self.call = update.compensation.rule.kernel(update.compensation)
        self._momentum: Optional[FlatMomentum] = None

    def momentum(self) -> Optional[FlatMomentum]:
        """Flat momentum buffers whose views are the optimizer's (made again
        after the optimizer's state was loaded: a restore)."""
        optimizer = self.update.optimizer
        if not any(g["momentum"] != 0 for g in optimizer.param_groups):
            return None
        flat = self._momentum
        if flat is not None:
            views = iter(flat.views)
            for g, group in enumerate(optimizer.param_groups):
                for p in group["params"]:
                    view = next(views)
                    if flat.started[g] and optimizer.state.get(p, {}).get("momentum_buffer") is not view:
                        flat = None
                        break
                if flat is None:
                    break
        if flat is None:
            flat = self._momentum = FlatMomentum(optimizer, self.update.layout, self.update.weights)
        return flat

    def __call__(self, wire_host: Tensor, wire_device: Tensor, backup: Tensor, outbox: Tensor, worker: int,
                 lrs: Sequence[float]) -> None:
        """Apply the gradient ``wire_host`` (an inbox's view) pushed by
        ``worker`` at learning rates ``lrs``: copied into ``wire_device``,
        applied to the weights and to ``backup`` (w_bak(worker), which then
        holds the new weights), which is copied into ``outbox``."""
        update, call = self.update, self.call
        optimizer, weights, grad = update.optimizer, update.weights, update.grad
        state = update.state.of(worker)
        mean_square = None if call.mean_square is None else state[call.mean_square]
        momentum = self.momentum()
        groups = []  # per group: its range, hyperparameters, momentum buffer and whether this is its first step
        for g, (group, (start, end), lr) in enumerate(zip(optimizer.param_groups, update.group_ranges, lrs)):
            buffer = momentum.buffer if momentum is not None and group["momentum"] != 0 else None
            first = buffer is not None and not momentum.started[g]
            groups.append((start, end, buffer, first, dict(
                lambda_0=call.lambda_0, keep=call.mean_square_momentum, blend=1 - call.mean_square_momentum,
                eps=call.eps, bound=call.bound, lr=lr * update.lr_factor, weight_decay=group["weight_decay"],
                momentum=group["momentum"], carry=0.0 if first else group["momentum"],
                undamped=1.0 if first else 1 - group["dampening"], nesterov=group["nesterov"])))
        parts = self.staging.parts
        converted = wire_device.dtype != weights.dtype

        def chunk(k: int) -> None:
            part = parts[k]
            for start, end, buffer, _, hyper in groups:
                lo, hi = max(part.start, start), min(part.stop, end)
                if lo >= hi:
                    continue
                g = grad[lo:hi].copy_(wire_device[lo:hi]) if converted else wire_device[lo:hi]
                sgd_slice_(g, weights[lo:hi], backup[lo:hi],
                           None if mean_square is None else mean_square[lo:hi],
                           None if buffer is None else buffer[lo:hi], **hyper)

        self.staging.run(wire_host, wire_device, chunk, backup, outbox)
        first_param = 0
        for g, (group, (_, _, _, first, _)) in enumerate(zip(optimizer.param_groups, groups)):
            if first:
                momentum.start(g, first_param)
            first_param += len(group["params"])
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr  # the optimizer's state shows the rate the worker set, as ServerUpdate leaves it


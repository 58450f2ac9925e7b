"""Batch normalisation over every worker's batch, as Horovod's ``SyncBatchNorm``.

In training, each forward pass reduces the per-channel count, sum and sum of
squares over the workers (one allreduce), normalises with the statistics of
the union of their batches, and each backward pass reduces the two sums the
input's gradient needs (a second allreduce).  So every worker waits for the
others in every forward and backward pass -- the one synchronous step in an
otherwise asynchronous job; use it where small per-worker batches make
BatchNorm's statistics too noisy, not by default.  It runs on the CPU too
(Horovod's refuses CPU tensors).  The weight and bias gradients stay local:
the parameter server receives each worker's own.  In evaluation, or with one
worker, it is ``torch.nn.BatchNorm``.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..runtime.roles import runtime
from .process_sets import ProcessSet, communicator, global_process_set

__all__ = ["SyncBatchNorm"]


def _sum_over_workers(comm: Any, *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """The tensors summed over ``comm`` in float64, in one allreduce."""
    flat = torch.cat([t.detach().to("cpu", torch.float64).reshape(-1) for t in tensors])
    mpi = runtime().mpi
    comm.Allreduce(mpi.IN_PLACE, flat.numpy(), op=mpi.SUM)
    return tuple(part.view_as(t) for part, t in zip(torch.split(flat, [t.numel() for t in tensors]), tensors))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, comm):
        dims = [0, *range(2, x.dim())]
        count = torch.tensor([x.numel() / x.shape[1]], dtype=torch.float64)
        n, total, squares = _sum_over_workers(comm, count, x.sum(dims), (x * x).sum(dims))
        mean = total / n
        var = (squares / n - mean * mean).clamp_(min=0)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean))
                running_var.mul_(1 - momentum).add_(momentum * (var * n / max(n.item() - 1, 1)).to(running_var))
        shape = [1, -1] + [1] * (x.dim() - 2)
        invstd = (var + eps).rsqrt().to(x.dtype)
        xhat = (x - mean.to(x.dtype).view(shape)) * invstd.view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.comm, ctx.count, ctx.dims, ctx.shape = comm, n.item(), dims, shape
        out = xhat if weight is None else xhat * weight.view(shape)
        return out if bias is None else out + bias.view(shape)

    @staticmethod
    def backward(ctx, grad_out):
        xhat, weight, invstd = ctx.saved_tensors
        dims, shape = ctx.dims, ctx.shape
        sum_dy, sum_dy_xhat = grad_out.sum(dims), (grad_out * xhat).sum(dims)
        all_dy, all_dy_xhat = _sum_over_workers(ctx.comm, sum_dy, sum_dy_xhat)
        scale = invstd if weight is None else weight * invstd
        grad_x = scale.view(shape) * (grad_out - (all_dy.to(grad_out) / ctx.count).view(shape)
                                      - xhat * (all_dy_xhat.to(grad_out) / ctx.count).view(shape))
        grad_weight = sum_dy_xhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_dy if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.BatchNorm1d/2d/3d`` with statistics over every worker's batch.

    Arguments:
        num_features, eps, momentum, affine, track_running_stats: as
            ``torch.nn.BatchNorm2d``'s.
        process_set: the workers whose batches are normalised together.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_set: ProcessSet = global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative average, as torch's BatchNorm
                factor = 1.0 / float(self.num_batches_tracked)
        comm = communicator(self.process_set) if self.training else None
        if comm is None or comm.Get_size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training or not self.track_running_stats, factor, self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.running_mean, self.running_var,
                                            self.eps, factor, comm)

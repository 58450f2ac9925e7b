"""The server's update: compensate the stale gradient, then step.

Shaped like ``torch.optim.sgd``: :class:`ServerUpdate` is a thin class that
gathers the state one update needs (the optimizer, its param groups as ranges
of the flat buffers, the compensation and its state, the path chosen) and
calls :func:`_update`, the one functional entry point (internal: the
public functional API is the compensation's, :func:`.dcasgd.dcasgd_`),
which dispatches to

* ``reference``: the compensation's reference implementation (for the
  built-in ones, the paper's Eq. 10 one tensor at a time), then the user's
  ``optimizer.step()``;
* ``foreach``: the compensation with torch's multi-tensor ops, then the step;
* ``fused``: the compensation in one pass over memory (the C kernel, or
  cache-sized chunks), then the step;
* ``fused_sgd``: compensation *and* ``torch.optim.SGD``'s step (weight decay,
  momentum, dampening, Nesterov) in one pass of the C kernel per param group.

Every path ends with ``w_bak(m) = w``.  :func:`default_update_path` makes
the choice, in one place, and says why; a path the caller forces is checked
against the tensors and the optimizer it will see (:func:`check_update_path`),
and an update that cannot run raises a sentence rather than doing nothing.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..common.errors import HvdDcasgdError, HvdDcasgdValueError
from ..common.tensors import snapshot
from ..protocol.layout import ModelLayout, trained_parameters
from ..common import native
from .compensation import Compensation, CompensationState
from .rules import Push

__all__ = ["FUSED", "FUSED_SGD", "FOREACH", "LR_SCALINGS", "PATHS", "REFERENCE", "ServerUpdate", "check_update_path",
           "default_update_path", "is_sgd", "lr_factor"]

REFERENCE, FOREACH, FUSED, FUSED_SGD = "reference", "foreach", "fused", "fused_sgd"
PATHS = (REFERENCE, FOREACH, FUSED, FUSED_SGD)

#: What a worker's learning rate means: ``DistributedOptimizer``'s
#: ``lr_scaling``, resolved from ``HVD_DCASGD_LR_SCALING`` and the table's
#: one default (``horovod``) by :func:`hvd_dcasgd.common.config.resolve`.
#: ``horovod``: Horovod's convention, the rate for the average of
#: ``hvd.size()`` gradients (scripts scale it by ``hvd.size()``), so on the
#: ``async`` schedule each worker's gradient is applied at ``lr / size()`` and
#: a round of M updates moves the weights as far as one Horovod step.
#: ``none``: the rate as given, for every gradient (the paper's setting: the
#: same rate as sequential SGD).  The ``sync`` schedule applies the average of
#: M gradients, as Horovod does, so the rate is applied as given under both.
#: The server's update only sees the factor, :func:`lr_factor`.
LR_SCALINGS = ("horovod", "none")


def lr_factor(lr_scaling: str, schedule: str, num_workers: int) -> float:
    """What each pushed learning rate is multiplied by (see :data:`LR_SCALINGS`)."""
    if lr_scaling not in LR_SCALINGS:
        raise HvdDcasgdValueError(f"hvd_dcasgd: unknown lr_scaling {lr_scaling!r}; choose one of "
                                  f"{', '.join(LR_SCALINGS)}")
    return 1.0 / num_workers if lr_scaling == "horovod" and schedule == "async" else 1.0


def is_sgd(optimizer: torch.optim.Optimizer) -> bool:
    """True for ``torch.optim.SGD`` itself (not a subclass), descending: the
    step the C kernel implements, momentum, Nesterov and weight decay included."""
    return type(optimizer) is torch.optim.SGD and not any(g.get("maximize", False) for g in optimizer.param_groups)


def _why_not_fused_sgd(optimizer: torch.optim.Optimizer, compensation: Compensation, tensors: Sequence[Tensor],
                       staged: bool) -> Optional[str]:
    """Why the ``fused_sgd`` path cannot compute this update, or ``None``."""
    on_cpu = all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)
    if not is_sgd(optimizer):
        return f"{type(optimizer).__name__} is not torch.optim.SGD"
    if compensation.rule.kernel(compensation) is None:
        return f"the C kernel does not compute the {compensation.mode!r} compensation"
    if staged:
        return "the server stages its tensors through host buffers (a GPU's path)"
    if not (on_cpu and all(t.dtype == torch.float32 for t in tensors)):
        return "the C kernel takes contiguous float32 CPU tensors"
    if not all(p.requires_grad for p in trained_parameters(optimizer)):
        return "a frozen parameter must not move, which only torch's step knows"
    if native.library() is None:
        return "the C kernel is unavailable"
    return None


def default_update_path(optimizer: torch.optim.Optimizer, compensation: Compensation, tensors: Sequence[Tensor],
                        staged: bool) -> Tuple[str, str]:
    """The path :func:`_update` takes by default, and why, in a few words.

    The fewest passes over memory that compute exactly this update: the
    server is memory-bound, so each pass saved is time saved.

    * ``fused_sgd`` needs the C kernel (built, not switched off), an optimizer
      whose step it implements (:func:`is_sgd`), a compensation it computes,
      float32 tensors it can read (contiguous, on the CPU), and no frozen
      parameter (torch skips those even under weight decay; the kernel does
      not).  A staged server stands for a GPU one, so it never takes it.
    * otherwise the compensation runs ``fused`` where every tensor is
      contiguous on the CPU, and ``foreach`` elsewhere (a GPU), as torch's
      ``_default_to_fused_or_foreach`` prefers its multi-tensor kernels there;
      the user's optimizer then steps in its own way.
    """
    reason = _why_not_fused_sgd(optimizer, compensation, tensors, staged)
    if reason is None:
        return FUSED_SGD, "torch.optim.SGD on float32 CPU memory: the C kernel compensates and steps in one pass"
    path = FUSED if all(t.device.type == "cpu" and t.is_contiguous() for t in tensors) else FOREACH
    return path, f"{reason}: the compensation runs {path}, then the optimizer steps"


def check_update_path(path: str, optimizer: torch.optim.Optimizer, compensation: Compensation,
                      tensors: Sequence[Tensor], staged: bool) -> None:
    """Raise a sentence unless ``path`` (one of :data:`PATHS`) can compute
    this update on ``tensors`` with ``optimizer``: a forced path is checked
    before the first push, not found doing nothing at it."""
    if path not in PATHS:
        raise HvdDcasgdValueError(f"hvd_dcasgd: unknown update path {path!r}; choose one of {', '.join(PATHS)}")
    if path == FUSED_SGD:
        reason = _why_not_fused_sgd(optimizer, compensation, tensors, staged)
        if reason is not None:
            raise HvdDcasgdValueError(f"hvd_dcasgd: the update cannot take the {FUSED_SGD!r} path: {reason}; "
                                      f"leave the path to the default, or choose one of {REFERENCE}, {FOREACH}, "
                                      f"{FUSED}")


class FlatMomentum:
    """``torch.optim.SGD``'s momentum buffers as views of one flat tensor, so
    the C kernel updates them in its pass and ``state_dict()`` shows them.
    A group's buffers start from the first gradient, as torch's do; buffers
    the optimizer already holds (a restore) are taken over as they are."""

    def __init__(self, optimizer: torch.optim.Optimizer, layout: ModelLayout, like: Tensor):
        self.optimizer = optimizer
        self.buffer = torch.zeros_like(like)
        self.views = layout.views(self.buffer)
        self.started: List[bool] = []
        views = iter(self.views)
        for group in optimizer.param_groups:
            pairs = [(p, next(views)) for p in group["params"]]
            existing = [optimizer.state.get(p, {}).get("momentum_buffer") for p, _ in pairs]
            started = bool(pairs) and all(b is not None for b in existing)
            if started:
                for (p, view), buffer in zip(pairs, existing):
                    view.copy_(buffer)
                    optimizer.state[p]["momentum_buffer"] = view
            self.started.append(started)

    def start(self, group_index: int, first_param: int) -> None:
        """After a group's first step: its buffers become the optimizer's state."""
        self.started[group_index] = True
        group = self.optimizer.param_groups[group_index]
        for i, p in enumerate(group["params"]):
            self.optimizer.state[p]["momentum_buffer"] = self.views[first_param + i]


def _update(
    weights: Tensor,
    grad: Tensor,
    backup: Tensor,
    state: Mapping[str, Tensor],
    *,
    compensation: Compensation,
    optimizer: torch.optim.Optimizer,
    lrs: Sequence[float],
    group_ranges: Sequence[Tuple[int, int]],
    path: str,
    momentum: Optional[FlatMomentum] = None,
    staleness: int = 0,
) -> None:
    """One server update for a gradient ``grad`` computed on ``backup``
    (w_bak(m)): compensate it against ``weights - backup``, step, and set
    ``backup = weights``.

    ``optimizer``'s parameters are views of ``weights`` and, except on the
    ``fused_sgd`` path, its gradients are views of ``grad``, which the
    compensation overwrites.  ``lrs`` are the pushing worker's learning rates,
    one per param group; ``state`` the compensation's state for this worker;
    ``momentum`` the flat momentum buffers of the ``fused_sgd`` path;
    ``staleness`` the updates applied since ``backup`` was sent (the
    compensation gets it, with ``lrs`` and ``group_ranges``, as a
    :class:`~hvd_dcasgd.algorithm.rules.Push`).
    """
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    if path == FUSED_SGD:
        _fused_sgd_update(weights, grad, backup, state, compensation=compensation, optimizer=optimizer,
                          group_ranges=group_ranges, momentum=momentum)
    elif path in (REFERENCE, FOREACH, FUSED):
        push = Push(staleness, tuple(lrs), tuple(group_ranges))
        _compensate_then_step(weights, grad, backup, state, compensation=compensation, optimizer=optimizer, impl=path,
                              push=push)
    else:
        raise HvdDcasgdValueError(f"hvd_dcasgd: unknown update path {path!r}; choose one of {', '.join(PATHS)}")


def _compensate_then_step(weights: Tensor, grad: Tensor, backup: Tensor, state: Mapping[str, Tensor], *,
                          compensation: Compensation, optimizer: torch.optim.Optimizer, impl: str,
                          push: Push) -> None:
    """The compensation rule's own implementation ``impl``, then the user's step."""
    compensation.rule.run_([grad], [weights], [backup], {k: [v] for k, v in state.items()}, compensation,
                           impl=impl, push=push)
    optimizer.step()
    backup.copy_(weights)


def _fused_sgd_update(weights: Tensor, grad: Tensor, backup: Tensor, state: Mapping[str, Tensor], *,
                      compensation: Compensation, optimizer: torch.optim.Optimizer,
                      group_ranges: Sequence[Tuple[int, int]], momentum: Optional[FlatMomentum]) -> None:
    """Compensation and torch.optim.SGD's step in one pass of the C kernel
    per param group (each group has its own hyperparameters)."""
    call = compensation.rule.kernel(compensation)
    mean_square = None if call.mean_square is None else state[call.mean_square]
    first_param = 0
    for g, (group, (start, end)) in enumerate(zip(optimizer.param_groups, group_ranges)):
        buffer = momentum.buffer[start:end] if group["momentum"] != 0 else None
        first_step = buffer is not None and not momentum.started[g]
        ran = native.dcasgd_f32(
            grad[start:end], weights[start:end], backup[start:end],
            None if mean_square is None else mean_square[start:end],
            call.lambda_0, call.mean_square_momentum, call.eps, group["lr"],
            weight_decay=group["weight_decay"], momentum=group["momentum"], dampening=group["dampening"],
            nesterov=group["nesterov"], momentum_buffer=buffer, first_step=first_step, bound=call.bound,
        )
        if not ran:  # checked before the first push (check_update_path); said, never skipped
            raise HvdDcasgdError(f"hvd_dcasgd: the {FUSED_SGD!r} update did not run on param group {g}: the C "
                                 "kernel is unavailable or a tensor is not contiguous float32 on the CPU; the "
                                 "weights are unchanged")
        if first_step:
            momentum.start(g, first_param)
        first_param += len(group["params"])


class ServerUpdate:
    """The update as the server runs it, push after push: the optimizer (its
    parameters views of ``weights``, their gradients views of ``grad``), the
    compensation with its state, and the path :func:`default_update_path`
    chose (again after the optimizer's state is loaded).  ``lr_factor``
    multiplies every pushed learning rate (:func:`lr_factor`; 1: the rate as
    given)."""

    def __init__(self, optimizer: torch.optim.Optimizer, layout: ModelLayout, compensation: Compensation,
                 weights: Tensor, grad: Tensor, num_workers: int, staged: bool, path: Optional[str] = None,
                 lr_factor: float = 1.0):
        self.optimizer = optimizer
        self.layout = layout
        self.compensation = compensation
        self.weights, self.grad = weights, grad
        self.staged = staged
        self.requested_path = path
        self.group_ranges = layout.group_ranges()
        self.state = CompensationState(compensation, weights, num_workers, num_groups=len(self.group_ranges))
        self.lr_factor = lr_factor
        self.choose_path()

    def choose_path(self) -> None:
        """Choose the path (``path`` given to the constructor, else the
        default) and, for ``fused_sgd`` with momentum, take the optimizer's
        momentum buffers into one flat tensor."""
        tensors = [self.weights, self.grad, *(t for ts in self.state.tensors.values() for t in ts)]
        self.path, self.why = default_update_path(self.optimizer, self.compensation, tensors, self.staged)
        if self.requested_path is not None:
            check_update_path(self.requested_path, self.optimizer, self.compensation, tensors, self.staged)
            self.path, self.why = self.requested_path, "chosen by the caller"
        self.momentum = None
        if self.path == FUSED_SGD and any(g["momentum"] != 0 for g in self.optimizer.param_groups):
            self.momentum = FlatMomentum(self.optimizer, self.layout, self.weights)

    def __call__(self, gradient: Tensor, backup: Tensor, worker: int, lrs: Sequence[float],
                 staleness: int = 0) -> None:
        """Apply ``gradient`` (as pushed: maybe a view of an inbox, maybe of
        a narrower dtype), computed by ``worker`` on ``backup``, which was
        sent ``staleness`` updates ago (a rule that reads it takes the
        default, 0, as a fresh gradient)."""
        if self.path != FUSED_SGD or gradient.dtype != self.weights.dtype:
            gradient = self.grad if gradient is self.grad else self.grad.copy_(gradient)
        _update(self.weights, gradient, backup, self.state.of(worker), compensation=self.compensation,
                optimizer=self.optimizer, lrs=[lr * self.lr_factor for lr in lrs], group_ranges=self.group_ranges,
                path=self.path, momentum=self.momentum, staleness=staleness)
        if self.lr_factor != 1.0:  # the optimizer's state shows the rate the workers set, as a checkpoint must
            for group, lr in zip(self.optimizer.param_groups, lrs):
                group["lr"] = lr

    def load_optimizer_state(self, state: Dict) -> None:
        """Load the optimizer's state (a restore), then choose the path again.
        All or nothing: a state that cannot be loaded (or that the chosen path
        cannot take, such as a momentum buffer of the wrong shape) raises and
        leaves the optimizer as it was."""
        before = snapshot(self.optimizer.state_dict())
        try:
            self.optimizer.load_state_dict(state)
            self.choose_path()
        except Exception as exc:
            self.optimizer.load_state_dict(before)
            self.choose_path()
            raise HvdDcasgdValueError(f"hvd_dcasgd: the optimizer's state cannot be loaded ({exc})") from exc

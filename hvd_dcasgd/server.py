"""The parameter server: the paper's Algorithm 2 over the worker mailboxes.

The server owns the model w (the user's model on rank 0, its parameters made
views of one flat buffer) and, for every worker m, the backup w_bak(m): the
weights last sent to m.  On the CPU the backup *is* m's outbox in the window,
so recording the backup and sending the weights are one and the same write.

On a push g from worker m the server compensates g against w - w_bak(m),
lets the user's own optimizer step with it at the learning rate m's optimizer
has, then writes w into m's outbox (w_bak(m) = w) and answers.  In ``sync``
mode it waits for one push from every active worker, averages, and steps once.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import torch

from . import native
from .channel import ServerChannel
from .compensation import Compensation, dcasgd_
from .layout import ModelLayout, PushMessage, flatten_into, trained_parameters
from .staging import Staging
from .telemetry import Telemetry
from .transport import Backoff, Mailboxes


def is_sgd(optimizer: torch.optim.Optimizer) -> bool:
    """True for ``torch.optim.SGD`` (descending): the C kernel takes its step
    itself, momentum, Nesterov and weight decay included."""
    return type(optimizer) is torch.optim.SGD and not any(g.get("maximize", False) for g in optimizer.param_groups)


def is_plain_sgd(optimizer: torch.optim.Optimizer) -> bool:
    """True for SGD without momentum or weight decay: the update every
    implementation of ``dcasgd_`` can take by itself, in one pass."""
    return is_sgd(optimizer) and all(g["momentum"] == 0 and g["weight_decay"] == 0 for g in optimizer.param_groups)


class ParameterServer:
    """Applies pushed gradients to the model and answers each worker."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        layout: ModelLayout,
        compensation: Compensation,
        mailboxes: Mailboxes,
        channel: ServerChannel,
        wire_dtype: torch.dtype,
        device: torch.device,
        telemetry: Telemetry,
        staged: Optional[bool] = None,
        extras: Optional[Dict[str, torch.Tensor]] = None,
    ):
        """``extras`` is the rest of the model's state by name (buffers, frozen
        parameters), which a restore from a worker may set.  ``staged`` keeps
        the model and the backups on ``device`` and moves messages through
        bounce buffers; the default, and the only way on a GPU, is to stage
        exactly when ``device`` is not the CPU."""
        self.optimizer = optimizer
        self.layout = layout
        self.compensation = compensation
        self.channel = channel
        self.device = device
        self.telemetry = telemetry
        num_workers = channel.num_workers
        params = trained_parameters(optimizer)
        self.weights = torch.empty(layout.numel, dtype=layout.dtype, device=device)
        flatten_into(self.weights, layout.views(self.weights), [p.detach() for p in params])
        self.grad = torch.zeros_like(self.weights)
        for p, weight, grad in zip(params, layout.views(self.weights), layout.views(self.grad)):
            p.data = weight
            p.grad = grad if p.requires_grad else None  # torch's optimizers skip frozen parameters
        self.messages = [PushMessage(layout, wire_dtype, mailboxes.inbox(m)) for m in range(num_workers)]
        self.outboxes = [mailboxes.outbox(m).view(layout.dtype) for m in range(num_workers)]
        if staged if staged is not None else device.type != "cpu":
            self.staging: Optional[Staging] = Staging(layout.numel, wire_dtype, layout.dtype, device)
            self.backups = [self.weights.clone() for _ in range(num_workers)]
            self.wire_gradient = torch.empty(layout.numel, dtype=wire_dtype, device=device)
        else:
            self.staging = None
            self.backups = self.outboxes
        self.sent_at = [0] * num_workers
        self.updates = 0
        for m in range(num_workers):
            self.backups[m].copy_(self.weights)
            self._send(m)
        if compensation.adaptive:
            count = num_workers if compensation.per_worker_mean_square else 1
            self.mean_squares = [torch.zeros_like(self.weights) for _ in range(count)]
        native.library()  # build the kernel now, not inside the first update
        self._choose_update_path()
        self.group_ranges = layout.group_ranges()
        self.extras = extras or {}

    # --- one update -----------------------------------------------------
    def _wire_gradient(self, worker: int) -> torch.Tensor:
        """Worker's pushed gradient, as sent (wire dtype), on the server device:
        a view of the inbox on the CPU, a staged copy on a GPU."""
        wire = self.messages[worker].gradient
        if self.staging is None:
            return wire
        self.staging.upload(wire, self.wire_gradient)
        return self.wire_gradient

    def _mean_square(self, worker: int) -> Optional[List[torch.Tensor]]:
        if not self.compensation.adaptive:
            return None
        return [self.mean_squares[worker if self.compensation.per_worker_mean_square else 0]]

    def _send(self, worker: int) -> None:
        """Make w_bak(worker) visible in worker's outbox."""
        if self.staging is not None:
            self.staging.download(self.backups[worker], self.outboxes[worker])
        self.sent_at[worker] = self.updates

    def _choose_update_path(self) -> None:
        """One pass over memory where possible: the C kernel for SGD on window
        memory in float32 (``native_sgd``; its momentum buffers become the
        optimizer's state), ``dcasgd_`` with ``lr`` for plain SGD elsewhere;
        otherwise the compensated gradient goes to the user's optimizer (which
        also is what skips frozen parameters under weight decay or momentum)."""
        self.native_sgd = (
            is_sgd(self.optimizer) and self.staging is None and self.weights.dtype == torch.float32
            and all(p.requires_grad for p in trained_parameters(self.optimizer)) and native.library() is not None
        )
        self.fused_sgd = self.native_sgd or is_plain_sgd(self.optimizer)
        self.momentum_buffer = None
        if not self.native_sgd or all(g["momentum"] == 0 for g in self.optimizer.param_groups):
            return
        self.momentum_buffer = torch.zeros_like(self.weights)
        self.momentum_started = []
        views = iter(self.layout.views(self.momentum_buffer))
        for group in self.optimizer.param_groups:
            pairs = [(p, next(views)) for p in group["params"]]
            existing = [self.optimizer.state.get(p, {}).get("momentum_buffer") for p, _ in pairs]
            started = all(b is not None for b in existing) and bool(pairs)
            for (p, view), buffer in zip(pairs, existing):
                if started:
                    view.copy_(buffer)
                    self.optimizer.state[p]["momentum_buffer"] = view
            self.momentum_started.append(started)

    def _native_step(self, gradient, backup, mean_square, lambda_0: float) -> None:
        """The whole update -- compensation and torch.optim.SGD's step -- in
        one pass of the C kernel per param group."""
        comp = self.compensation
        views = self.layout.views(self.momentum_buffer) if self.momentum_buffer is not None else None
        index = 0
        for g, (group, (start, end)) in enumerate(zip(self.optimizer.param_groups, self.group_ranges)):
            momentum = group["momentum"]
            buffer = self.momentum_buffer[start:end] if momentum != 0 else None
            native.dcasgd_f32(
                gradient[start:end], self.weights[start:end], backup[start:end],
                None if mean_square is None else mean_square[0][start:end],
                lambda_0, comp.mean_square_momentum, comp.eps, group["lr"],
                weight_decay=group["weight_decay"], momentum=momentum, dampening=group["dampening"],
                nesterov=group["nesterov"], momentum_buffer=buffer,
                first_step=buffer is not None and not self.momentum_started[g],
            )
            if buffer is not None and not self.momentum_started[g]:
                self.momentum_started[g] = True
                for i, p in enumerate(group["params"]):
                    self.optimizer.state[p]["momentum_buffer"] = views[index + i]
            index += len(group["params"])

    def _step(self, gradient: torch.Tensor, worker: int, lrs: Sequence[float]) -> None:
        """w <- optimizer step with the compensated gradient; w_bak(worker) <- w."""
        comp = self.compensation
        lambda_0 = comp.lambda_0 if comp.compensates else 0.0
        mean_square = self._mean_square(worker)
        backup = self.backups[worker]
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        if self.native_sgd:
            self._native_step(gradient, backup, mean_square, lambda_0)
            return
        if self.fused_sgd:
            for (start, end), lr in zip(self.group_ranges, lrs):
                dcasgd_(
                    [gradient[start:end]],
                    [self.weights[start:end]],
                    [backup[start:end]],
                    None if mean_square is None else [mean_square[0][start:end]],
                    lambda_0=lambda_0,
                    mean_square_momentum=comp.mean_square_momentum,
                    eps=comp.eps,
                    lr=lr,
                )
            return
        if gradient is not self.grad:
            self.grad.copy_(gradient)
        if lambda_0 > 0:
            dcasgd_(
                [self.grad],
                [self.weights],
                [backup],
                mean_square,
                lambda_0=lambda_0,
                mean_square_momentum=comp.mean_square_momentum,
                eps=comp.eps,
            )
        self.optimizer.step()
        backup.copy_(self.weights)

    def apply(self, worker: int) -> None:
        """Apply worker's pending push as one server update (ASGD / DC-ASGD)."""
        self.telemetry.record(self.updates, worker, self.updates - self.sent_at[worker])
        gradient = self._wire_gradient(worker)
        if not self.fused_sgd or gradient.dtype != self.weights.dtype:
            gradient = self.grad.copy_(gradient)
        self._step(gradient, worker, self.messages[worker].lrs.tolist())
        self.updates += 1
        self._send(worker)

    def apply_round(self, workers: Sequence[int]) -> None:
        """Average one push from each of ``workers`` into one update (SSGD)."""
        for i, m in enumerate(workers):
            self.telemetry.record(self.updates, m, self.updates - self.sent_at[m])
            gradient = self._wire_gradient(m)
            if i == 0:
                self.grad.copy_(gradient)
            else:
                self.grad.add_(gradient)
        self.grad.div_(len(workers))
        first = workers[0]
        self._step(self.grad, first, self.messages[first].lrs.tolist())
        self.updates += 1
        for m in workers:
            if m != first:
                self.backups[m].copy_(self.weights)
            self._send(m)

    def set_state(self, params: Dict[int, torch.Tensor], extras: Dict[str, torch.Tensor]) -> None:
        """Overwrite trained parameters (by index in the layout) and the rest
        of the model's state (by name): a checkpoint restored on a worker.
        Every worker is about to hold these weights, so they become every
        backup.  All or nothing: a wrong index, name or shape changes nothing."""
        views = self.layout.views(self.weights)
        targets = [(views[i], t, self.layout.params[i].name) for i, t in params.items() if 0 <= i < len(views)]
        targets += [(self.extras[n], t, n) for n, t in extras.items() if n in self.extras]
        if len(targets) != len(params) + len(extras):
            raise ValueError("hvd_dcasgd: the server's model has no such parameter or buffer")
        for target, value, name in targets:
            if target.shape != value.shape:
                raise ValueError(f"hvd_dcasgd: {name!r} is {list(value.shape)}, the server's is {list(target.shape)}")
        with torch.no_grad():
            for target, value, _ in targets:
                target.copy_(value)
        if params:
            for m in range(self.channel.num_workers):
                self.backups[m].copy_(self.weights)
                self._send(m)

    def load_optimizer_state(self, state: Dict) -> None:
        """Load a worker's optimizer state (a restored checkpoint) into the
        optimizer that steps."""
        self.optimizer.load_state_dict(state)
        self._choose_update_path()

    # --- the loop ---------------------------------------------------------
    def serve(self, between_polls: Callable[[], None] = lambda: None) -> None:
        """Answer pushes until every worker has left, then close the session.
        ``between_polls`` runs on every turn of the loop (control requests)."""
        synchronous = self.compensation.mode == "sync"
        backoff = Backoff(max_sleep=1e-4)
        while True:
            between_polls()
            ready, left = self.channel.poll()
            if synchronous:
                active = [m for m in range(self.channel.num_workers) if not left[m]]
                if active and all(m in ready for m in active):
                    self.apply_round(active)
                    for m in active:
                        self.channel.reply(m)
                else:
                    ready = []
            else:
                for m in ready:
                    self.apply(m)
                    self.channel.reply(m)
            if ready:
                backoff.reset()
            elif all(left):
                break
            else:
                backoff.wait()
        self.channel.close()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

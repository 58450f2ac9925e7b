"""The parameter server: the paper's Algorithm 2 over the worker mailboxes.

The server owns the model w (the user's model on rank 0, its parameters made
views of one flat buffer) and, for every worker m, the backup w_bak(m): the
weights last sent to m.  On the CPU the backup *is* m's outbox in the window,
so recording the backup and sending the weights are one and the same write.

On a push g from worker m the server runs one update (:mod:`.update`:
compensate g against w - w_bak(m), then the user's optimizer steps at the
learning rates m's optimizer has, and w_bak(m) = w), then makes w visible in
m's outbox and answers.  On the ``sync`` schedule it waits for one push from
every active worker, averages, and steps once.  Everything the server holds
-- weights, the optimizer's and the compensation's state, every backup, the
counters -- is in :meth:`ParameterServer.state_dict`.

This is the algorithm and its state only.  When to poll, answer, drop a
silent worker, checkpoint or stop is the serving loop's (:mod:`.serving`),
which asks a coordination (:mod:`.coordination`) what to do.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any, Dict, Optional, Sequence

import torch

from ..common.config import resolve
from ..common.errors import HvdDcasgdError, HvdDcasgdValueError
from ..common.tensors import all_finite, snapshot
from ..observability.telemetry import Telemetry
from ..protocol.channel import ServerChannel
from ..protocol.layout import ModelLayout, PushMessage, flatten_into, trained_parameters
from ..protocol.staging import Staging, choose_staging
from .compensation import CONSTANTS, Compensation
from .pipelined import PipelinedUpdate, pipelined
from .membership import resized_state
from .rules import COMPENSATIONS, PER_GROUP, PER_WORKER, Push
from .update import ServerUpdate, lr_factor

#: The version of :meth:`ParameterServer.state_dict`'s format.
STATE_FORMAT = 2


#: Elements of the flat vector a compensation_ratio sample compensates (every k-th, k = numel // SAMPLE).
SAMPLE = 65536


class ParameterServer:
    """Applies pushed gradients to the model and answers each worker."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        layout: ModelLayout,
        compensation: Compensation,
        channel: ServerChannel,
        wire_dtype: torch.dtype,
        device: torch.device,
        telemetry: Telemetry,
        staged: Optional[bool] = None,
        untrained_state: Optional[Dict[str, torch.Tensor]] = None,
        update_path: Optional[str] = None,
        checked_by_workers: Optional[Sequence[bool]] = None,
        lr_factor: float = 1.0,
    ):
        """``channel`` (and the windows it owns) becomes the server's.
        ``untrained_state`` is the rest of the model's state by name (buffers,
        frozen parameters: :func:`.layout.untrained_state`), which a restore
        from a worker may set.  ``staged`` keeps
        the model and the backups on ``device`` and moves messages through
        bounce buffers; the default, and the only way on a GPU, is to stage
        exactly when ``device`` is not the CPU.  ``update_path`` overrides
        the update's path (see :func:`.update.default_update_path`).
        ``checked_by_workers[m]`` says that worker m refuses non-finite
        gradients itself before sending (``check_finite``, the default): the
        server then spares the extra pass over its gradients; it checks
        every learning rate, and every other worker's gradients.
        ``lr_factor`` multiplies every pushed learning rate (see
        :func:`.update.lr_factor`; 1: the rate as given)."""
        self.optimizer = optimizer
        self.layout = layout
        self.compensation = compensation
        self.channel = channel
        self.device = device
        self.telemetry = telemetry
        self.wire_dtype = wire_dtype
        mailboxes = channel.mailboxes
        num_workers = channel.num_workers
        params = trained_parameters(optimizer)
        self.weights = torch.empty(layout.numel, dtype=layout.dtype, device=device)
        flatten_into(self.weights, layout.views(self.weights), [p.detach() for p in params])
        self.grad = torch.zeros_like(self.weights)
        for p, weight, grad in zip(params, layout.views(self.weights), layout.views(self.grad)):
            p.data = weight
            p.grad = grad if p.requires_grad else None  # torch's optimizers skip frozen parameters
        self.messages = [PushMessage(layout, wire_dtype, mailboxes.inbox(m)) for m in range(num_workers)]
        telemetry.note_sizes(self.messages[0].nbytes, mailboxes.outbox(0).numel())
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
        # pushes taken before the number of workers last changed, and each worker's even share of them
        # (its data position's start, :mod:`.membership`); zero in a job that never changed it
        self.before = {"applied": 0, "refused": 0}
        self.base = 0
        for m in range(num_workers):
            self.backups[m].copy_(self.weights)
            self._fill_outbox(m)
        self.update = ServerUpdate(optimizer, layout, compensation, self.weights, self.grad, num_workers,
                                   staged=self.staging is not None, path=update_path, lr_factor=lr_factor)
        chunked, self.pipelined_why = pipelined(self.update, self.staging)
        self.pipelined = PipelinedUpdate(self.update, self.staging) if chunked else None
        self._note_update_path()
        self.untrained_state = untrained_state or {}
        self.checked_by_workers = list(checked_by_workers or [False] * num_workers)

    def _note_update_path(self) -> None:
        """Tell the telemetry which update path runs, how messages reach the
        model and whether the update is pipelined with its copies, and why
        (the summary says so)."""
        staging = (self.staging.path, self.staging.why) if self.staging else choose_staging(self.weights.device)
        pipelined = ("pipelined: " if self.pipelined else "not pipelined: ") + self.pipelined_why
        self.telemetry.note_update_path(self.update.path, self.update.why, *staging, pipelined)

    # --- one update -----------------------------------------------------
    def _wire_gradient(self, worker: int) -> torch.Tensor:
        """Worker's pushed gradient, as sent (wire dtype), on the server device:
        a view of the inbox on the CPU, a staged copy on a GPU."""
        wire = self.messages[worker].gradient
        if self.staging is None:
            return wire
        self.staging.upload(wire, self.wire_gradient)
        return self.wire_gradient

    def staleness(self, worker: int) -> int:
        """Server updates since ``worker`` was sent the weights its pending
        push was computed on: that push's delay (0: computed on the current
        weights, nothing to compensate)."""
        return self.updates - self.sent_at[worker]

    def _fill_outbox(self, worker: int, copied: bool = False) -> None:
        """Make w_bak(worker) visible in worker's outbox (a copy when staged,
        unless ``copied``: it is already; on the CPU the backup is the
        outbox) and note the update it holds; the serving loop's reply is
        what tells the worker."""
        if self.staging is not None and not copied:
            self.staging.download(self.backups[worker], self.outboxes[worker])
        self.sent_at[worker] = self.updates

    # --- what the server will not apply --------------------------------------
    def _problem(self, worker: int) -> Optional[str]:
        """Why worker's pending push must not be applied, or ``None``: the
        server checks whatever the workers' settings (a worker's own check
        can be off, and its learning rate is its script's)."""
        message = self.messages[worker]
        for group, lr in enumerate(message.lrs.tolist()):
            if not (math.isfinite(lr) and lr >= 0):
                return f"its learning rate for param group {group} is {lr}, not a finite number >= 0"
        if not self.checked_by_workers[worker] and not all_finite(message.gradient):
            return (f"its gradient holds NaN or Inf (the weights likely diverged: "
                    f"{self.compensation.divergence_advice()})")
        return None

    def _skip_if_bad(self, worker: int) -> bool:
        """Check worker's pending push; whether it was skipped.  A bad one raises a sentence naming the
        worker and what is wrong, the weights untouched; with
        ``HVD_DCASGD_SKIP_BAD_PUSHES=1`` it is skipped and counted instead,
        and the worker gets the current weights back."""
        problem = self._problem(worker)
        if problem is None:
            return False
        push = self.telemetry.pushes[worker] + self.telemetry.refused[worker]
        where = f"worker {worker} (MPI rank {worker + 1}), push {push}"
        if resolve("HVD_DCASGD_SKIP_BAD_PUSHES") != "1":
            raise HvdDcasgdError(f"hvd_dcasgd: the server refused {where}: {problem}; the weights are unchanged "
                                 "and no worker received anything of it (HVD_DCASGD_SKIP_BAD_PUSHES=1 skips such "
                                 "pushes instead).")
        self.telemetry.refused[worker] += 1
        self.backups[worker].copy_(self.weights)
        self._fill_outbox(worker)
        return True

    def apply(self, worker: int) -> None:
        """Apply worker's pending push as one server update (ASGD / DC-ASGD)."""
        if self._skip_if_bad(worker):
            return
        self.telemetry.record(self.updates, worker, self.staleness(worker))
        start = time.perf_counter()
        if self.pipelined is not None:  # copies and update chunk by chunk: the outbox is written when it returns
            self.pipelined(self.messages[worker].gradient, self.wire_gradient, self.backups[worker],
                           self.outboxes[worker], worker, self.messages[worker].lrs.tolist())
        else:
            self.update(self._wire_gradient(worker), self.backups[worker], worker,
                        self.messages[worker].lrs.tolist(), staleness=self.staleness(worker))
        self.telemetry.apply_seconds += time.perf_counter() - start
        self.updates += 1
        self._fill_outbox(worker, copied=self.pipelined is not None)

    def compensation_ratio(self, worker: int, scratch: Dict[str, torch.Tensor]) -> Optional[float]:
        """``worker``'s waiting push compensated as its update will compensate it, on copies of every k-th element
        of the gradient, the weights, the backup and the rule's state (about :data:`SAMPLE` elements, an even
        sample of every layer, in ``scratch``, kept from one sample to the next): mean |compensated g - g| / mean |g|."""
        server = self
        update, numel = server.update, server.weights.numel()
        k = max(1, numel // SAMPLE)

        def copy(name: str, t: torch.Tensor) -> torch.Tensor:
            if name not in scratch or scratch[name].shape != t.shape or scratch[name].dtype != t.dtype:
                scratch[name] = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            return scratch[name].copy_(t)

        with torch.no_grad():
            g = copy("g", server.messages[worker].gradient[::k].to(server.weights.device, server.weights.dtype))
            compensated = copy("compensated", g)
            weights, backup = copy("weights", server.weights[::k]), copy("backup", server.backups[worker][::k])
            state = {name: [copy(name, t if update.state.scopes[name] == PER_GROUP else t[::k])]
                     for name, t in update.state.of(worker).items()}
            push = Push(staleness=server.staleness(worker),
                        lrs=[lr * update.lr_factor for lr in server.messages[worker].lrs.tolist()],
                        group_ranges=[(-(-start // k), -(-end // k)) for start, end in update.group_ranges])
            # the implementation the update's path uses where it is one of the rule's own (fused_sgd compensates
            # in the C kernel's step: the rule's fused implementation, the same kernel's arithmetic, stands for it)
            impl = update.path if update.path in ("reference", "foreach", "fused") else "fused"
            server.compensation.rule.run_([compensated], [weights], [backup], state, server.compensation, impl=impl,
                                          push=push)
            size = torch.linalg.vector_norm(g, 1).item()
            ratio = torch.linalg.vector_norm(compensated.sub_(g), 1).item() / size if size > 0 else math.nan
            return ratio if math.isfinite(ratio) else None

    def apply_round(self, ready: Sequence[int]) -> None:
        """Average one push from each of the ``ready`` workers into one update (SSGD);
        a refused push leaves the round to the others."""
        ready = [m for m in ready if not self._skip_if_bad(m)]
        if not ready:
            return
        for i, m in enumerate(ready):
            self.telemetry.record(self.updates, m, self.staleness(m))
            gradient = self._wire_gradient(m)
            if i == 0:
                self.grad.copy_(gradient)
            else:
                self.grad.add_(gradient)
        self.grad.div_(len(ready))
        first = ready[0]
        start = time.perf_counter()
        self.update(self.grad, self.backups[first], first, self.messages[first].lrs.tolist(),
                    staleness=self.staleness(first))
        self.telemetry.apply_seconds += time.perf_counter() - start
        self.updates += 1
        for m in ready:
            if m != first:
                self.backups[m].copy_(self.weights)
            self._fill_outbox(m)

    def set_state(self, params: Dict[int, torch.Tensor], untrained_state: Dict[str, torch.Tensor]) -> None:
        """Overwrite trained parameters (by index in the layout) and the rest
        of the model's state (by name): a checkpoint restored on a worker.
        Every worker is about to hold these weights, so they become every
        backup.  All or nothing: a wrong index, name or shape changes nothing."""
        views = self.layout.views(self.weights)
        targets = [(views[i], t, self.layout.params[i].name) for i, t in params.items() if 0 <= i < len(views)]
        targets += [(self.untrained_state[n], t, n) for n, t in untrained_state.items() if n in self.untrained_state]
        if len(targets) != len(params) + len(untrained_state):
            raise HvdDcasgdValueError("hvd_dcasgd: the server's model has no such parameter, buffer or frozen "
                                      "parameter")
        for target, value, name in targets:
            if target.shape != value.shape:
                raise HvdDcasgdValueError(f"hvd_dcasgd: {name!r} is {list(value.shape)}, the server's is {list(target.shape)}")
        with torch.no_grad():
            for target, value, _ in targets:
                target.copy_(value)
        if params:
            for m in range(self.channel.num_workers):
                self.backups[m].copy_(self.weights)
                self._fill_outbox(m)

    def load_optimizer_state(self, state: Dict) -> None:
        """Load a worker's optimizer state (a restored checkpoint) into the
        optimizer that steps."""
        self.update.load_optimizer_state(state)

    # --- state ------------------------------------------------------------
    def settings(self) -> Dict[str, Any]:
        """What the server was started with, as plain values."""
        return {
            "compensation": asdict(self.compensation),
            "lr_factor": self.update.lr_factor,
            "num_workers": self.channel.num_workers,
            "parameters": [[p.name, list(p.shape), p.dtype] for p in self.layout.params],
            "group_sizes": list(self.layout.group_sizes),
            "untrained_state": sorted(self.untrained_state),
            "wire_dtype": str(self.wire_dtype).replace("torch.", ""),
        }

    def state_dict(self) -> Dict[str, Any]:
        """A copy of everything the server holds, on the CPU, made of tensors
        and plain values only (``torch.load(..., weights_only=True)`` reads
        it): the weights and the rest of the model's state, the optimizer's
        state, the compensation's state, every worker's backup, the update
        and push counters, the settings, and the format version."""
        return {
            "format": STATE_FORMAT,
            "settings": self.settings(),
            "weights": snapshot(self.weights),
            "untrained_state": snapshot(dict(self.untrained_state)),
            "optimizer": snapshot(self.optimizer.state_dict()),
            "compensation_state": self.update.state.state_dict(),
            "backups": [snapshot(b) for b in self.backups],
            "updates": self.updates,
            "sent_at": list(self.sent_at),
            "pushes": list(self.telemetry.pushes),
            "refused": list(self.telemetry.refused),
            "before": dict(self.before),
            "base": self.base,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (another server's :meth:`state_dict`):
        the next pushes are applied exactly as that server would have.  A
        state of another number of workers is taken on as
        :func:`.membership.resized_state` says.  All or nothing: a state of
        another format, settings or shape raises and changes nothing."""
        state = self._resized(_state_read(state))
        self._check_state(state)
        self.update.load_optimizer_state(state["optimizer"])  # checks its own groups first
        self._note_update_path()  # the path is chosen again with the optimizer's state
        with torch.no_grad():
            self.weights.copy_(state["weights"])
            for name, value in state["untrained_state"].items():
                self.untrained_state[name].copy_(value)
        self.update.state.load_state_dict(state["compensation_state"])
        for m, backup in enumerate(state["backups"]):
            self.backups[m].copy_(backup)
            self._fill_outbox(m)
        self.updates = int(state["updates"])
        self.sent_at = [int(n) for n in state["sent_at"]]
        self.telemetry.pushes = [int(n) for n in state["pushes"]]
        self.telemetry.refused = [int(n) for n in state["refused"]]
        self.telemetry.updates = self.updates
        before = state.get("before") or {}
        self.before = {"applied": int(before.get("applied", 0)), "refused": int(before.get("refused", 0))}
        self.base = int(state.get("base", 0))

    def _resized(self, state: Any) -> Any:
        """``state`` for this server's number of workers (:func:`.membership.resized_state`);
        anything that is not a server state of format 2 is left to :meth:`_check_state` to refuse."""
        if not (isinstance(state, dict) and state.get("format") == STATE_FORMAT
                and isinstance(state.get("settings"), dict) and isinstance(state["settings"].get("num_workers"), int)
                and state["settings"]["num_workers"] >= 1):
            return state
        per_worker = {name: scope == PER_WORKER for name, scope in self.update.state.scopes.items()}
        try:
            return resized_state(state, self.channel.num_workers, self.update.lr_factor, per_worker)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            raise HvdDcasgdValueError(f"hvd_dcasgd: the state saved by a job of {state['settings']['num_workers']} "
                                      f"workers cannot be taken on by this one of {self.channel.num_workers}: it "
                                      f"lacks or misshapes a part ({type(exc).__name__}: {exc})") from None

    def position(self, worker: int) -> int:
        """Worker ``worker``'s data position: the batches of its shard taken, this job and the ones it
        resumes -- after a change of the number of workers, the even share of everyone's pushes before it
        (``base``) plus its own since (:mod:`.membership`)."""
        return self.base + self.applied(worker)

    def _check_state(self, state: Dict[str, Any]) -> None:
        state = _state_read(state)
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            found = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise HvdDcasgdValueError(f"hvd_dcasgd: not a server state of format {STATE_FORMAT} (found {found!r})")
        mine, theirs = self.settings(), state["settings"]
        different = [k for k in mine if k != "wire_dtype" and mine[k] != theirs.get(k)]
        if different:
            key = different[0]
            raise HvdDcasgdValueError(f"hvd_dcasgd: the state was saved by a server with {key} {theirs.get(key)!r}; "
                                      f"this one has {mine[key]!r}")
        shapes = [tuple(state["weights"].shape), *(tuple(b.shape) for b in state["backups"])]
        if shapes != [tuple(self.weights.shape)] * (1 + len(self.backups)):
            raise HvdDcasgdValueError(f"hvd_dcasgd: the state's weights and backups are shaped {shapes}")
        for name, value in state["untrained_state"].items():
            if tuple(value.shape) != tuple(self.untrained_state[name].shape):
                raise HvdDcasgdValueError(f"hvd_dcasgd: the state's {name!r} is {list(value.shape)}, "
                                          f"the server's is {list(self.untrained_state[name].shape)}")
        self.update.state.check(state["compensation_state"])

    def applied(self, worker: int) -> int:
        """Pushes of ``worker`` taken: applied, or skipped as bad."""
        return self.telemetry.pushes[worker] + self.telemetry.refused[worker]

    def optimizer_state_sent_with_weights(self, worker: int) -> Dict[str, Any]:
        """The optimizer's state now, and the weights of the same moment put
        into ``worker``'s outbox (its backup from now on): a consistent pair
        for a checkpoint the worker's script saves."""
        self.backups[worker].copy_(self.weights)
        self._fill_outbox(worker)
        self.channel.mailboxes.sync()
        self.telemetry.note_sent(worker, self.updates)
        return snapshot(self.optimizer.state_dict())

    def free(self) -> None:
        """Free the windows (collective over the communicator they were
        opened on) and close the trace; staged window memory is unregistered
        with CUDA first."""
        if self.staging is not None:
            self.staging.close()
        self.channel.free()
        self.telemetry.close()


def _state_read(state: Any) -> Any:
    """A saved :meth:`ParameterServer.state_dict` under today's names.
    Files written before kept the untrained state under ``extras`` (its
    names in the settings under ``buffers``), and the learning rate's meaning
    in the compensation's settings (``lr_scaling``) instead of the factor it
    gives."""
    if not isinstance(state, dict) or not isinstance(state.get("settings"), dict):
        return state
    state, settings = dict(state), dict(state["settings"])
    if "extras" in state and "untrained_state" not in state:
        state["untrained_state"] = state.pop("extras")
    if "buffers" in settings and "untrained_state" not in settings:
        settings["untrained_state"] = settings.pop("buffers")
    if "lr_factor" not in settings and isinstance(settings.get("compensation"), dict):
        compensation = dict(settings["compensation"])
        scaling = compensation.pop("lr_scaling", "none")
        settings["compensation"] = compensation
        settings["lr_factor"] = lr_factor(scaling, compensation.get("schedule", "async"),
                                          int(settings.get("num_workers") or 1))
    if isinstance(settings.get("compensation"), dict) and "bound" not in settings["compensation"]:
        settings["compensation"] = _constants_read(settings["compensation"])
    state["settings"] = settings
    return state


#: What a compensation used before its constants were settings of its own: DC-ASGD unbounded, Gap-Aware's
#: class constants, and lambda_0, MeanSquare's momentum and eps kept whatever the rule.
_BEFORE_SETTINGS = {"bound": math.inf, "gamma": 0.999, "gap_eps": 1e-8}


def _constants_read(compensation: Dict[str, Any]) -> Dict[str, Any]:
    """A compensation's settings saved before ``bound``, ``gamma`` and ``gap_eps`` were settings: the constants
    its rule used then, the others ``None``, as :class:`Compensation` now writes them."""
    compensation = {**compensation, "bound": None, "gamma": None, "gap_eps": None}
    rule = COMPENSATIONS.get(compensation.get("mode"))
    used = rule.constants() if rule is not None else {}
    for name in CONSTANTS:
        if name not in used:
            compensation[name] = None
        elif compensation.get(name) is None:
            compensation[name] = _BEFORE_SETTINGS.get(name, used[name])
    return compensation

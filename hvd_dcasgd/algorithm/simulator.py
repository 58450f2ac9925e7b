"""M virtual workers in one process, against the real parameter server.

:func:`simulate` trains a model the way ``mpirun -np M+1`` would -- worker m
computes its gradient on the weights the server last sent it, w_bak(m), and
the server applies it with :meth:`ParameterServer.apply` (or
:meth:`ParameterServer.apply_round` in ``sync`` mode) -- but the order in
which the server takes the pushes comes from a *delay model* instead of the
operating system's scheduler.  The server is the project's own, over MPI
windows on this rank alone (``COMM_SELF``), so what is simulated is only who
pushes when.  Same arguments, same result, bit for bit.

Delay models: :class:`RoundRobin` (every gradient exactly M-1 updates stale,
the paper's analysis), :class:`RandomOrder` (the next push comes from a worker
drawn uniformly), :class:`EventDriven` (per-worker step times with log-normal
jitter; :meth:`EventDriven.homogeneous`, :meth:`EventDriven.one_slow`,
:meth:`EventDriven.heavy_tailed`) and :class:`TraceOrder` (the order of a
server trace, ``HVD_DCASGD_TRACE``, from a real run).

An event-driven model keeps a *virtual clock*: an asynchronous update happens
at the time its gradient arrives, a synchronous round ends when its slowest
worker's step does.  ``simulate(..., until=T)`` trains for a fixed virtual
time instead of a fixed number of epochs, so that a fast worker draws more
batches than a slow one, as on a cluster.

Worker m's data is the shard ``m, m+M, m+2M, ...`` of the training set,
reshuffled every epoch by :func:`worker_batches`; an MPI program that uses the
same function trains on the same batches, so replaying its trace reproduces it.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from ..common.errors import HvdDcasgdValueError
from ..observability.telemetry import Telemetry
from ..protocol.layout import ModelLayout, flatten_into
from ..runtime.mpi import load_mpi
from .compensation import Compensation
from .endpoints import open_server
from .server import ParameterServer

__all__ = [
    "DelayModel", "EventDriven", "RandomOrder", "RoundRobin", "Simulation", "TraceOrder", "checksum", "error_rate",
    "simulate", "steps_per_epoch", "worker_batches",
]

Dataset = Tuple[torch.Tensor, torch.Tensor]


def worker_batches(num_samples: int, worker: int, workers: int, batch_size: int, epochs: int,
                   seed: int) -> Iterator[Tuple[int, torch.Tensor]]:
    """(epoch, sample indices) of every step of ``worker``: its shard
    ``worker, worker + workers, ...``, permuted every epoch by a generator
    seeded with ``1000 * seed + worker``, split into batches (the last one may be short)."""
    shard = torch.arange(worker, num_samples, workers)
    generator = torch.Generator().manual_seed(1000 * seed + worker)
    for epoch in range(epochs):
        order = shard[torch.randperm(len(shard), generator=generator)]
        for start in range(0, len(order), batch_size):
            yield epoch, order[start : start + batch_size]


def steps_per_epoch(num_samples: int, worker: int, workers: int, batch_size: int) -> int:
    """How many pushes ``worker`` makes per epoch."""
    return -(-len(range(worker, num_samples, workers)) // batch_size)


class DelayModel:
    """Chooses whose push the server applies next.  ``reset`` starts a run;
    ``next_worker`` gets the workers that still have steps to make;
    ``next_round`` starts a synchronous round of ``active``.  ``now`` is the
    virtual time of the last push or round (only an event-driven model keeps
    time; the others count one unit per update, or per round)."""

    now = 0.0

    def reset(self, workers: int, generator: torch.Generator) -> None:
        self.generator = generator
        self.now = 0.0

    def next_worker(self, active: Sequence[int]) -> int:
        raise NotImplementedError

    def next_round(self, active: Sequence[int]) -> None:
        self.now += 1.0


class RoundRobin(DelayModel):
    """Workers push in turn: 0, 1, ..., M-1, 0, ...; every gradient after the
    first round is exactly M-1 updates stale."""

    def reset(self, workers: int, generator: torch.Generator) -> None:
        super().reset(workers, generator)
        self.turn = -1

    def next_worker(self, active: Sequence[int]) -> int:
        self.turn = min((m for m in active if m > self.turn), default=active[0])
        self.now += 1.0
        return self.turn


class RandomOrder(DelayModel):
    """The next push comes from an active worker drawn uniformly at random."""

    def next_worker(self, active: Sequence[int]) -> int:
        self.now += 1.0
        return active[int(torch.randint(len(active), (1,), generator=self.generator))]


class EventDriven(DelayModel):
    """Worker m's steps take ``step_times[m]`` times a log-normal factor
    ``exp(jitter * N(0, 1))``; the push that finishes first is applied first,
    and its worker starts its next step at once."""

    def __init__(self, step_times: Sequence[float], jitter: float = 0.0):
        self.step_times = list(step_times)
        self.jitter = jitter

    @classmethod
    def homogeneous(cls, workers: int, jitter: float = 0.25) -> "EventDriven":
        """Workers of one speed (a step takes 1 on average, before jitter)."""
        return cls([1.0] * workers, jitter)

    @classmethod
    def one_slow(cls, workers: int, slowdown: float = 3.0, jitter: float = 0.25) -> "EventDriven":
        """Like :meth:`homogeneous`, but the last worker's steps take
        ``slowdown`` times as long (a straggler)."""
        return cls([1.0] * (workers - 1) + [slowdown], jitter)

    @classmethod
    def heavy_tailed(cls, workers: int, slow: Optional[int] = None, slowdown: float = 3.0,
                     jitter: float = 1.0) -> "EventDriven":
        """``slow`` workers (default a quarter, at least one) ``slowdown`` times
        slower than the rest, and wide jitter for everyone."""
        slow = max(1, workers // 4) if slow is None else slow
        return cls([slowdown if m >= workers - slow else 1.0 for m in range(workers)], jitter)

    def reset(self, workers: int, generator: torch.Generator) -> None:
        if len(self.step_times) != workers:
            raise HvdDcasgdValueError(f"hvd_dcasgd: {len(self.step_times)} step times for {workers} workers")
        super().reset(workers, generator)
        self.now = 0.0
        self.pending = [(self._duration(m), m) for m in range(workers)]
        heapq.heapify(self.pending)

    def _duration(self, worker: int) -> float:
        noise = float(torch.randn((), generator=self.generator, dtype=torch.float64))
        return self.step_times[worker] * float(torch.exp(torch.tensor(self.jitter * noise)))

    def next_worker(self, active: Sequence[int]) -> int:
        while True:
            self.now, worker = heapq.heappop(self.pending)
            if worker in active:
                heapq.heappush(self.pending, (self.now + self._duration(worker), worker))
                return worker

    def next_round(self, active: Sequence[int]) -> None:
        """Every worker of ``active`` starts a step now; the round ends with the slowest."""
        self.now += max(self._duration(m) for m in active)


class TraceOrder(DelayModel):
    """The order of a server trace (JSON lines with ``update`` and
    ``worker``, as ``HVD_DCASGD_TRACE`` writes them).  A worker that has no
    steps left is skipped; after the trace's end, workers take turns."""

    def __init__(self, path: str):
        with open(path) as lines:
            records = [json.loads(line) for line in lines if line.strip()]
        pushes = [r for r in records if "worker" in r and "update" in r]  # pushes (not a "sent" line or an event)
        self.order = [r["worker"] for r in sorted(pushes, key=lambda r: r["update"])]
        self.trace_workers = 1 + max(self.order, default=0)
        #: The trace's changes of the number of workers, (update, workers), for :func:`simulate`'s ``membership``.
        self.membership = [(r["at"], r["workers"]) for r in records if r.get("event") == "resized"]

    def reset(self, workers: int, generator: torch.Generator) -> None:
        if self.trace_workers > workers and not self.membership:
            raise HvdDcasgdValueError(f"hvd_dcasgd: the trace has {self.trace_workers} workers, the simulation {workers}")
        super().reset(workers, generator)
        self.position = 0
        self.after_trace = RoundRobin()
        self.after_trace.reset(workers, generator)

    def next_worker(self, active: Sequence[int]) -> int:
        while self.position < len(self.order):
            worker = self.order[self.position]
            self.position += 1
            if worker in active:
                return worker
        return self.after_trace.next_worker(active)


@dataclass
class Simulation:
    """What a simulated run gives back."""

    test_errors: List[float]  # after every epoch (a pass over the training set by all workers together)
    final_error: float
    weights: torch.Tensor  # the server's final flat weights
    updates: int
    staleness: Counter  # staleness -> number of gradients
    times: List[float]  # the virtual time of each entry of test_errors
    samples: int  # training examples the applied gradients were computed on
    seconds: float  # virtual time at the end

    @property
    def checksum(self) -> str:
        return checksum(self.weights)


def checksum(weights: torch.Tensor) -> str:
    """A short SHA-256 of a flat tensor's bytes: equal only for bit-identical weights."""
    return hashlib.sha256(weights.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def _server(model: torch.nn.Module, optimizer: torch.optim.Optimizer, compensation: Compensation, workers: int,
            trace: Optional[str], resume_from: Optional[int] = None) -> ParameterServer:
    """The project's ParameterServer over real windows on this rank alone
    (``resume_from``: the trace goes on from that update)."""
    layout = ModelLayout.of(optimizer, model.named_parameters(), model)
    if layout.untrained_state:
        raise HvdDcasgdValueError("hvd_dcasgd: the simulator takes models without buffers or frozen parameters "
                                  "(a real run keeps BatchNorm statistics per worker)")
    return open_server(load_mpi().COMM_SELF, optimizer, layout, compensation, num_workers=workers,
                       telemetry=Telemetry(workers, trace, resume_from=resume_from), staged=False)


def error_rate(model: torch.nn.Module, data: Dataset) -> float:
    """Fraction of ``data`` that ``model`` gets wrong."""
    x, y = data
    was_training = model.training
    model.eval()
    with torch.no_grad():
        error = (model(x).argmax(1) != y).float().mean().item()
    model.train(was_training)
    return error


def simulate(
    model: Callable[[], torch.nn.Module],
    train: Dataset,
    test: Dataset,
    *,
    compensation: Union[str, Compensation],
    workers: int,
    epochs: int,
    batch_size: int,
    lr: Callable[[float], float],
    optimizer: Optional[Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]] = None,
    delay: Optional[DelayModel] = None,
    seed: int = 0,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    trace: Optional[str] = None,
    until: Optional[float] = None,
    membership: Sequence[Tuple[int, int]] = (),
) -> Simulation:
    """Train ``model()`` (built after ``torch.manual_seed(seed)``) with
    ``workers`` virtual workers for ``epochs`` epochs and return its test
    errors.  ``lr(epoch)`` is the learning rate a worker sends with a push
    made at (fractional) epoch ``epoch`` of its own data, as a scheduler
    stepped on the worker would (``k / n`` into an epoch of ``n`` steps after
    ``k`` of them); ``optimizer`` builds the server's optimizer (default plain
    SGD).  ``delay`` (default :class:`RoundRobin`) orders the pushes and keeps
    the virtual clock; ``sync`` mode averages one push of every active worker
    per update.  ``trace`` writes the server's trace there.  One worker is
    sequential SGD in every mode.

    ``until`` trains for that much virtual time instead (``delay`` should be
    event-driven): workers draw batches as long as they have time, a push
    arriving later is not applied, ``epochs`` only sets the schedule (virtual
    epoch ``e`` is the time ``e * until / epochs``, when the test error is
    taken and at which ``lr`` is asked), and the rate of a push is the one at
    its arrival.

    ``membership`` changes the number of workers: at each (update, M') the
    job goes on with M' workers, as a job resumed from a checkpoint of that
    moment with M' workers does -- the server's state is taken on by a server
    of M' workers (:mod:`.membership`), the trace notes the change, and each
    worker's data goes on at its position (:meth:`.server.ParameterServer.position`)
    in the shards of M' workers.  :attr:`TraceOrder.membership` gives a
    trace's own changes.  Event-driven delays keep one step time per worker,
    so they take no change."""
    compensation = compensation if isinstance(compensation, Compensation) else Compensation(compensation)
    delay = RoundRobin() if delay is None else delay
    changes = sorted(membership)
    if changes and isinstance(delay, EventDriven):
        raise HvdDcasgdValueError("hvd_dcasgd: an event-driven delay has one step time per worker, so the number "
                                  "of workers cannot change under it (membership=)")
    if any(after < 1 for _, after in changes):
        raise HvdDcasgdValueError(f"hvd_dcasgd: every change of membership= leaves at least one worker, not {changes}")
    torch.manual_seed(seed)
    net = model()
    steps = torch.optim.SGD(net.parameters(), lr=lr(0)) if optimizer is None else optimizer(net.parameters())
    server = _server(net, steps, compensation, workers, trace)
    try:
        replica = model()  # the workers' forward and backward passes, on the weights each one holds
        named = dict(replica.named_parameters())
        params = [named[spec.name] for spec in server.layout.params]  # in the optimizer's order, as on the wire
        held = torch.empty(server.layout.numel, dtype=server.layout.dtype)
        for p, view in zip(params, server.layout.views(held)):
            p.data = view
        x, y = train
        drawn_epochs = epochs if until is None else 1 << 20  # a timed worker draws as long as it has time
        epoch_time = None if until is None else until / epochs
        samples = 0

        def shards(positions: Sequence[int]) -> None:
            """Each worker's steps per epoch, batches from its position on, steps left and taken."""
            nonlocal per_worker, batches, remaining, done
            count = len(positions)
            per_worker = [steps_per_epoch(len(y), m, count, batch_size) for m in range(count)]
            batches = [worker_batches(len(y), m, count, batch_size, drawn_epochs, seed) for m in range(count)]
            for m, position in enumerate(positions):
                for _ in range(position):
                    next(batches[m], None)
            remaining = [max(0, epochs * n - p) if until is None else math.inf for n, p in zip(per_worker, positions)]
            done = list(positions)

        staleness: Counter = Counter()  # of the servers before the last change of membership
        per_worker: List[int] = []
        batches: List[Iterator[Tuple[int, torch.Tensor]]] = []
        remaining: List[float] = []
        done: List[int] = []
        shards([0] * workers)

        def resize(after: int) -> None:
            """The job goes on with ``after`` workers from this update (see ``membership``)."""
            nonlocal server, workers
            state, before = server.state_dict(), workers
            staleness.update(server.telemetry.staleness)  # the new server's telemetry counts from here
            server.free()
            server = _server(net, steps, compensation, after, trace, resume_from=state["updates"])
            server.load_state_dict(state)
            if after != before:  # as a resumed job's trace notes it
                server.telemetry.note_workers(server.updates, before, after)
            workers = after
            shards([server.position(m) for m in range(after)])

        def push(m: int) -> None:
            """Worker m computes its next gradient on w_bak(m) and leaves it in its inbox."""
            nonlocal samples
            _, batch = next(batches[m])
            at = done[m] / per_worker[m] if until is None else delay.now / epoch_time
            remaining[m] -= 1
            done[m] += 1
            samples += len(batch)
            held.copy_(server.outboxes[m])
            replica.zero_grad(set_to_none=True)
            loss(replica(x[batch]), y[batch]).backward()
            message = server.messages[m]
            flatten_into(message.gradient, server.layout.views(message.gradient), [p.grad for p in params])
            message.lrs.fill_(lr(at))

        def evaluate_until(now: float) -> None:
            """The test error at every virtual epoch that ended before ``now``."""
            while until is not None and len(errors) < epochs and now >= (len(errors) + 1) * epoch_time:
                errors.append(error_rate(net, test))
                times.append((len(errors)) * epoch_time)

        delay.reset(workers, torch.Generator().manual_seed(seed))
        errors: List[float] = []
        times: List[float] = []
        per_epoch, applied = sum(per_worker), 0
        while True:
            while changes and server.updates >= changes[0][0]:
                resize(changes.pop(0)[1])
                per_epoch = sum(per_worker)
            if not any(remaining):
                break
            active = [m for m in range(workers) if remaining[m]]
            if compensation.schedule == "sync":
                delay.next_round(active)
                evaluate_until(delay.now)
                if until is not None and delay.now > until:
                    break
                for m in active:
                    push(m)
                server.apply_round(active)
                applied += len(active)
            else:
                m = delay.next_worker(active)
                evaluate_until(delay.now)
                if until is not None and delay.now > until:
                    break
                push(m)
                server.apply(m)
                applied += 1
            while until is None and applied >= (len(errors) + 1) * per_epoch:
                errors.append(error_rate(net, test))
                times.append(delay.now)
        evaluate_until(until or 0.0)
        final = error_rate(net, test)
        return Simulation(errors, final, server.weights.clone(), server.updates,
                          staleness + Counter(server.telemetry.staleness), times, samples,
                          delay.now if until is None else until)
    finally:
        server.free()

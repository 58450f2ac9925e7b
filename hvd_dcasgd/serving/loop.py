"""Serving: the parameter server's one loop -- poll, apply, answer.

The loop knows the protocol (:class:`.channel.ServerChannel`) and the
algorithm (:class:`.server.ParameterServer`).  Everything it must decide --
whom to drop, whether a stop or a checkpoint is due, which pushes to hold
back, whether it may end -- it asks a coordination
(:class:`.coordination.Coordination`: one server, or several); where it
stands it tells the rank's lifecycle (:class:`.lifecycle.Lifecycle`).  It
has no branch on the number of servers.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional, Sequence

import torch

from ..algorithm.server import ParameterServer
from ..common.log import get_logger
from ..observability.monitor import Monitor
from ..protocol.channel import ServerChannel
from ..protocol.stall import StallWatch
from ..protocol.transport import Backoff
from ..runtime.lifecycle import Lifecycle
from .checkpoints import Checkpoints
from .coordination import Coordination, OneServer
from .membership import Membership

__all__ = ["REQUESTS_INTERVAL", "save", "save_answering", "serve"]

log = get_logger("server")

#: Seconds between two answers to control requests while pushes keep the server busy.
REQUESTS_INTERVAL = 0.01


def save(server: ParameterServer, checkpoints: Checkpoints, number: Optional[int] = None) -> Any:
    """Write a checkpoint of everything ``server`` holds (between two
    updates), the trace up to it first; its path.  ``number`` names it (a
    cut's, with several servers; by default the update counter)."""
    server.telemetry.flush()
    start = time.perf_counter()
    path = checkpoints.write(server.state_dict(), number)
    server.telemetry.note_checkpoint(time.perf_counter() - start)
    return path


def save_answering(channel: ServerChannel, write: Callable[[], Any]) -> Any:
    """Run ``write`` (a checkpoint's) on a thread of its own while this
    thread tells the workers the server is writing and keeps calling MPI;
    ``write``'s result, or its exception.  Where one-sided operations
    progress only while their target calls MPI (Open MPI's osc/pt2pt over
    TCP), a write in this thread would hold every worker's read of this
    server, and so its word to the other servers, until the write ended;
    a long write would read as a silent server.  Nothing is applied
    meanwhile: pushes arrive in the inboxes and are answered afterwards.
    Only this thread calls MPI (the thread level may be serialized)."""
    outcome: List[Any] = []

    def run() -> None:
        try:
            outcome.append((write(), None))
        except BaseException as exc:  # handed to the serving thread, raised there
            outcome.append((None, exc))

    writer = threading.Thread(target=run, name="hvd_dcasgd checkpoint write")
    channel.writing(True)  # a long write is not silence to the waiting workers
    writer.start()
    try:
        while True:
            writer.join(timeout=1e-3)
            if not writer.is_alive():
                break
            channel.progress()
    finally:
        writer.join()
        channel.writing(False)
    result, error = outcome[0]
    if error is not None:
        raise error
    return result


def serve(server: ParameterServer, coordination: Optional[Coordination] = None,
          lifecycle: Optional[Lifecycle] = None, between_polls: Callable[[], None] = lambda: None,
          watch: Optional[StallWatch] = None, metrics_dir: Optional[str] = None) -> None:
    """Answer pushes until every worker has left (or was dropped), then
    close the session.

    Arguments:
        server: the algorithm, with the channel it answers on.
        coordination: what to decide between polls (default: one server,
            no checkpoints).
        lifecycle: this rank's; a signal noted there stops the session, and
            the loop records there the update at which it stopped.  From the
            poll at which a stop takes effect, later pushes are answered
            "stop" and not applied.
        between_polls: runs between two polls (control requests): on every
            turn while no push is pending, and at least every
            :data:`REQUESTS_INTERVAL` seconds while pushes keep coming (a
            probe for messages costs as much as a poll of every worker).
        watch: names the workers that stay silent too long; the
            coordination's ``stall_timeout`` drops them.
        metrics_dir: where the monitor writes the metrics
            (``DistributedOptimizer(metrics_dir=...)``; ``HVD_DCASGD_METRICS``
            overrides it).
    """
    coordination = OneServer() if coordination is None else coordination
    lifecycle = Lifecycle() if lifecycle is None else lifecycle
    channel = server.channel
    if coordination.membership is None:  # a coordination that opened no trace (a server built by hand)
        coordination.membership = Membership(server.telemetry)
    membership = coordination.membership
    synchronous = server.compensation.schedule == "sync"
    backoff = Backoff(max_sleep=1e-4)
    answered: List[int] = []
    requests_at = 0.0
    monitor = Monitor(server, metrics_dir=metrics_dir)  # metrics and progress lines, each at its interval
    while True:
        if not answered or time.monotonic() - requests_at >= REQUESTS_INTERVAL:
            between_polls()
            requests_at = time.monotonic()
        for m in coordination.dropped_elsewhere():  # the poll counts them as gone
            channel.drop(m)
            membership.dropped(m, server.updates)
        ready, left = channel.poll()
        monitor.tick(left)
        if watch is not None:
            _drop_silent(server, coordination, watch, ready, left)
        membership.seen(left, server.updates)
        stopped = lifecycle.stopped
        asked = not stopped and (channel.stop_asked or lifecycle.asked_to_stop)
        stopping_now = coordination.stops_now(asked)
        limits = coordination.limits(server, asked, stopped)
        if limits is not None:  # hold back the pushes beyond what is due
            ready = [m for m in ready if server.applied(m) < limits[m]]
        if stopped:  # nothing more is applied
            answered = ready
        elif synchronous:
            active = [m for m in range(channel.num_workers) if not left[m]]
            if active and all(m in ready for m in active):
                server.apply_round(active)
                answered = active
            else:
                answered = ready if stopping_now else []
        else:
            for m in ready:
                monitor.applying(m)
                server.apply(m)
            answered = ready
        for m in answered:
            channel.reply(m, stop=stopped or stopping_now)
        if stopping_now:
            lifecycle.stop(at=server.updates)
        due = coordination.due(server, lifecycle.stopped)
        if due is not None:
            if coordination.checkpoints is not None:
                save_answering(channel, lambda: save(server, coordination.checkpoints, due.number))
            if due.stop:
                lifecycle.stop(at=server.updates)
        if answered:
            backoff.reset()
        elif all(left) and coordination.may_end():
            break
        else:
            backoff.wait()
    coordination.end()
    monitor.close()
    channel.close()
    if server.device.type == "cuda":
        torch.cuda.synchronize(server.device)


def _drop_silent(server: ParameterServer, coordination: Coordination, watch: StallWatch, ready: Sequence[int],
                 left: List[bool]) -> None:
    """Warn about silent workers; drop the ones silent past the
    coordination's ``stall_timeout`` (marked in ``left``)."""
    for m in ready:
        watch.heard(m)
    for m in server.channel.waiting:  # waiting for another server's answer: alive, owing nothing yet
        watch.heard(m)
    owes = [not (left[m] or m in ready) for m in range(server.channel.num_workers)]
    watch.check(owes)
    timeout = coordination.stall_timeout
    for m in watch.silent_past(owes, timeout):
        server.channel.drop(m)
        coordination.dropped(m)
        coordination.membership.dropped(m, server.updates)
        left[m] = True
        log.warning(f"hvd_dcasgd: {watch.names[m]} has not pushed for {timeout:g} s (HVD_DCASGD_STALL_TIMEOUT): "
                    "dropped; the other workers carry on without it")

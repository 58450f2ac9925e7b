"""The push/reply protocol between workers and the server, over RMA windows.

Per worker j the control window holds four words -- ``pushed`` (how many
gradients j has published), ``replied`` (how many the server has answered),
``left`` (j has finished training) and ``waiting`` (with several servers,
counted up about twice a second while j waits for *another* server's answer:
j is alive and owes this server nothing yet) -- then three global words: ``stop`` (a
rank was asked to stop: preemption), ``heartbeat`` (the server's loop counts
it up about twice a second, so a waiting worker can tell a slow answer from a
server that is gone; :data:`WRITING_BIT` set while it writes a checkpoint) and ``closed``, set by the server when every worker has
left.  Two high bits of ``replied`` carry the server's news with the answer
itself: :data:`STOP_BIT` (stop after this step) and :data:`DROPPED_BIT` (this
worker was silent too long and no longer takes part).

A push is: Put the message into inbox j, flush, then atomically store
``pushed = k``.  Because the flag is flushed after the data, the server never
reads a half-written gradient.  The server answers push k by writing its
weights into outbox j and then storing ``replied = k``; the worker Gets its
outbox only after it saw ``replied == k``, so it never reads half-written
weights.  A worker has at most one push in flight, so its inbox is never
overwritten before the server has consumed it, and every push is applied
exactly once.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..common.errors import HvdDcasgdError
from ..runtime.exits import SERVER_SILENT, WORKER_DROPPED
from ..runtime.lifecycle import Lifecycle
from .stall import FROZEN_AFTER, StallWatch, stall_timeout_seconds, stall_warning_seconds
from .transport import Backoff, ControlWords, Mailboxes

WORDS_PER_WORKER = 4
PUSHED, REPLIED, LEFT, WAITING = range(WORDS_PER_WORKER)
GLOBAL_WORDS = 3
STOP, HEARTBEAT, CLOSED = range(-GLOBAL_WORDS, 0)  # from the end of the window

#: Bits of a ``replied`` word above the count of answers.
STOP_BIT, DROPPED_BIT = 1 << 61, 1 << 62
COUNT_MASK = (1 << 61) - 1
#: A bit of the ``heartbeat`` word: the server is writing a checkpoint (busy, not silent).
WRITING_BIT = 1 << 62
HEARTBEAT_SECONDS = 0.5


def control_words(num_workers: int) -> int:
    """Size of the control window for ``num_workers`` workers."""
    return num_workers * WORDS_PER_WORKER + GLOBAL_WORDS


def _global_word(control: ControlWords, word: int) -> int:
    """The index of global word ``word`` (:data:`STOP`, :data:`HEARTBEAT`, :data:`CLOSED`)."""
    return control.count + word


def _word(worker: int, field: int) -> int:
    return worker * WORDS_PER_WORKER + field


class WorkerChannel:
    """Worker ``worker``'s end: push a message, pull the reply, leave."""

    def __init__(self, control: ControlWords, mailboxes: Mailboxes, worker: int, server: Optional[str] = None,
                 lifecycle: Optional[Lifecycle] = None):
        """``server`` names the server in messages (default: by its rank);
        ``lifecycle`` is this rank's, which the watchdog informs when the
        server stays silent while this worker is blocked inside MPI (default:
        a lifecycle of its own, which ends the process all the same)."""
        self.control = control
        self.lifecycle = Lifecycle() if lifecycle is None else lifecycle
        self.mailboxes = mailboxes
        self.worker = worker
        self.pushes = 0
        self.stopping = False  # the server's last answer said: stop after this step
        self._server = server or f"the server (MPI rank {control.owner})"
        self._timeout = stall_timeout_seconds()
        self._beat, self._beat_seen, self._beat_read = -1, 0.0, 0.0  # the last heartbeat, when it moved, when read
        self._looked_at = 0.0  # the last look at the clock while a read of the server was under way
        self._waiting_since: Optional[float] = None  # in a wait for the server since then
        #: The channels to the other servers (several servers): told while this one is waited for.
        self.peers: Sequence["WorkerChannel"] = ()
        self._told_at = 0.0  # when the peers were last told
        if self._timeout is not None:
            self._start_watchdog()

    def push(self, pieces: Sequence[Tuple[int, np.ndarray]]) -> None:
        """Deliver the message -- its ``(offset, bytes)`` pieces, which cover
        it -- to the inbox, then announce it."""
        self.send(pieces)
        self.announce()

    def send(self, pieces: Sequence[Tuple[int, np.ndarray]]) -> None:
        """Issue the Puts of a push (a worker talking to several servers
        issues every server's before completing any); :meth:`announce`
        completes and announces them."""
        self._waiting_since = time.monotonic()  # until the answer is in (see _start_watchdog)
        self.mailboxes.put_inbox_pieces(self.worker, pieces, flush=False)

    def announce(self) -> None:
        """Complete the Puts :meth:`send` issued, then announce the push."""
        self.mailboxes.flush()
        self.pushes += 1
        self.control.store(_word(self.worker, PUSHED), self.pushes)

    def pull(self, out: np.ndarray) -> None:
        """Wait until the server answered the last push, then read the outbox."""
        self.await_answer()
        self.read(out)

    def read(self, out: np.ndarray, flush: bool = True) -> None:
        """Read the outbox, the server's answer, into ``out`` (with
        ``flush=False`` the Get completes at the window's next flush)."""
        self.mailboxes.get_outbox(self.worker, out, flush)
        self._waiting_since = None

    def await_answer(self) -> None:
        """Wait until the server answered the last push.  A wait past
        ``HVD_DCASGD_STALL_WARNING`` seconds is said out loud; a server
        silent for ``HVD_DCASGD_STALL_TIMEOUT`` seconds, or an answer that
        says this worker was dropped, raises.  The wait does not block
        inside MPI: while a read of this server is under way (it may be
        frozen) the worker tells the other servers it is waiting (a write it
        does not wait for) and watches this one's silence (see
        :meth:`.ControlWords.load_meanwhile`)."""
        self._begin_wait()
        backoff = Backoff()
        watch = None
        while True:
            if backoff.idle > backoff.spins:  # not a quick answer: look at the clock
                if watch is None:
                    watch = StallWatch([f"worker {self.worker}: {self._server}"], stall_warning_seconds())
                    self._beat_read = 0.0  # read the heartbeat at once: is the server writing a checkpoint now?
                watch.check([True], f"has not answered push {self.pushes - 1}")
                self._tell_peers()
                self._check_server_alive()
            replied = self.control.load_meanwhile(_word(self.worker, REPLIED), self._unanswered)
            if replied & DROPPED_BIT:
                raise self._dropped()
            if replied & COUNT_MASK >= self.pushes:
                break
            backoff.wait()
        self.stopping = bool(replied & STOP_BIT)

    def _begin_wait(self) -> None:
        """A wait for the server begins: its silence counts from now, and a
        "writing" read in an earlier wait is no news any more (only a read
        of the heartbeat in this wait can say the server is busy)."""
        now = time.monotonic()
        self._beat_seen = self._looked_at = max(self._beat_seen, now)
        if self._beat >= 0:
            self._beat &= ~WRITING_BIT

    def _unanswered(self) -> None:
        """While a read of this server's words is under way (it is busy or
        stopped and calls no MPI): tell the other servers this worker is
        waiting, and end the job once the server's silence passes the
        timeout -- unless the last word from it said it was writing a
        checkpoint (busy, not silent)."""
        self._tell_peers()
        if self._timeout is None:
            return
        now = time.monotonic()
        if now - self._looked_at > FROZEN_AFTER:  # this process was not running (frozen): not the server's silence
            self._beat_seen = max(self._beat_seen, now)
        self._looked_at = now
        if self._beat >= 0 and self._beat & WRITING_BIT:  # its last word (if any was read yet) said "writing"
            self._beat_seen = now
        elif now - self._beat_seen >= self._timeout:
            self._raise_silent(now)

    def _tell_peers(self) -> None:
        """While this server keeps the worker waiting, count up its waiting
        word at every other server (at most every :data:`HEARTBEAT_SECONDS`):
        the worker owes them its next push, and is not silent."""
        if not self.peers:
            return
        now = time.monotonic()
        if now - self._told_at < HEARTBEAT_SECONDS:
            return
        self._told_at = now
        for peer in self.peers:
            peer.mark_waiting(now)

    def mark_waiting(self, now: float) -> None:
        """Count up this worker's waiting word at this channel's server.  The
        worker waits for another server meanwhile: this one's silence does
        not count either (its answer is in, or not yet awaited)."""
        self.control.post_add(_word(self.worker, WAITING), 1)  # not waited for: that server may be frozen too
        self._beat_seen = max(self._beat_seen, now)

    def ask_to_stop(self) -> None:
        """Ask the server to stop the session (this rank was told to stop)."""
        self.control.store(_global_word(self.control, STOP), 1)

    def leave(self) -> None:
        """Tell the server this worker will push no more."""
        self.control.store(_word(self.worker, LEFT), 1)

    def wait_closed(self, asked_to_stop: Callable[[], bool] = lambda: False) -> None:
        """Wait (sleeping, not spinning) until the server closed the session;
        raise if the server is silent for ``HVD_DCASGD_STALL_TIMEOUT`` seconds.
        Once ``asked_to_stop()`` (a signal reached this rank while it waits),
        ask the server to stop: the others stop after their step."""
        backoff = Backoff(max_sleep=1e-2)
        self._waiting_since = time.monotonic()
        self._begin_wait()
        told = False
        while not self.control.load_meanwhile(_global_word(self.control, CLOSED), self._unanswered):
            if not told and asked_to_stop():
                self.ask_to_stop()
                told = True
            backoff.wait()
            self._check_server_alive()
        self._waiting_since = None

    def dropped_workers(self) -> List[int]:
        """After the session closed: the workers the server dropped."""
        words = self.control.load_all()[: -GLOBAL_WORDS].reshape(-1, WORDS_PER_WORKER)
        return [int(m) for m in np.flatnonzero(words[:, REPLIED] & DROPPED_BIT)]

    def _dropped(self) -> HvdDcasgdError:
        error = HvdDcasgdError(f"hvd_dcasgd: worker {self.worker} was dropped by the server after "
                               f"{self._timeout:g} s without a push (HVD_DCASGD_STALL_TIMEOUT); the others "
                               "carried on without it.")
        error.status = WORKER_DROPPED
        return error

    def _check_server_alive(self) -> None:
        """Raise when the server's heartbeat has not moved for the timeout
        (read at most every :data:`HEARTBEAT_SECONDS`, without blocking
        inside MPI: see :meth:`_unanswered`)."""
        if self._timeout is None:
            return
        now = time.monotonic()
        if now - self._beat_read < HEARTBEAT_SECONDS:
            return
        if now - self._beat_read > HEARTBEAT_SECONDS + FROZEN_AFTER:  # not looking since (frozen, or stepping):
            self._beat_seen = now  # that time is no silence of the server's
        self._beat_read = self._looked_at = now
        beat = self.control.load_meanwhile(_global_word(self.control, HEARTBEAT), self._unanswered)
        now = time.monotonic()
        self._beat_read = now
        if beat != self._beat or beat & WRITING_BIT:  # it moved, or the server is busy writing a checkpoint
            self._beat, self._beat_seen = beat, now
        elif now - self._beat_seen >= self._timeout:
            self._raise_silent(now)

    def _raise_silent(self, now: float) -> None:
        error = HvdDcasgdError(self._server_silent(now - self._beat_seen))
        error.status = SERVER_SILENT
        raise error

    def _server_silent(self, seconds: float) -> str:
        return (f"hvd_dcasgd: worker {self.worker}: {self._server} has not answered for {seconds:.0f} s "
                f"(HVD_DCASGD_STALL_TIMEOUT={self._timeout:g}); ending the job.")

    def _start_watchdog(self) -> None:
        """Where one-sided operations progress only while their target calls
        into MPI (Open MPI's osc/pt2pt over TCP), a stopped server blocks
        this worker inside MPI, where :meth:`_check_server_alive` cannot run:
        a thread watches the same clock and, a little later, tells this
        rank's lifecycle, which ends the process (:meth:`.Lifecycle.end_now`:
        status 68, without MPI, so that ``mpirun`` ends the job)."""

        def watch() -> None:
            woke = time.monotonic()
            while True:
                time.sleep(HEARTBEAT_SECONDS)
                now = time.monotonic()
                if now - woke > HEARTBEAT_SECONDS + FROZEN_AFTER:  # this process was frozen (SIGSTOP, a
                    self._beat_seen = max(self._beat_seen, now)  # suspended job): silence counts from now
                woke = now
                since = self._waiting_since
                if since is None:
                    continue
                silent = now - max(since, self._beat_seen)
                if silent >= self._timeout + 4 * HEARTBEAT_SECONDS:
                    self.lifecycle.end_now(self._server_silent(silent), SERVER_SILENT)

        threading.Thread(target=watch, name="hvd_dcasgd server watch", daemon=True).start()

    def free(self) -> None:
        """Free both windows (collective, with the server's :meth:`ServerChannel.free`)."""
        free_windows(self.control, self.mailboxes)


class ServerChannel:
    """The server's end: find pushed gradients, answer them, close."""

    def __init__(self, control: ControlWords, mailboxes: Mailboxes, num_workers: int):
        self.control = control
        self.mailboxes = mailboxes
        self.num_workers = num_workers
        self.answered = [0] * num_workers
        self.dropped = [False] * num_workers
        self.stop_asked = False  # a worker asked to stop (its STOP word)
        self._words = np.empty(control.count, dtype=np.int64)
        self._waits = [0] * num_workers  # each worker's waiting word at the last poll
        #: The workers whose waiting word moved at the last poll: waiting for another server, alive.
        self.waiting: List[int] = []
        self._beats, self._beat_at = 0, 0.0

    def poll(self) -> Tuple[List[int], List[bool]]:
        """Workers with an unanswered push, and which workers have left
        (a dropped worker counts as having left, and is never ready).

        One atomic read of every control word, then a memory barrier so that the
        inboxes read next hold what was flushed before the flags.
        """
        self._heartbeat()
        words = self.control.load_all(self._words).tolist()  # a few words: Python beats numpy's per-call cost
        self.stop_asked = self.stop_asked or bool(words[STOP])
        pushed = words[PUSHED:-GLOBAL_WORDS:WORDS_PER_WORKER]
        answered = self.answered
        ready = []
        for j, count in enumerate(pushed):
            if count > answered[j]:
                if count > answered[j] + 1:
                    raise HvdDcasgdError(f"hvd_dcasgd: protocol violation, pushes {pushed} answered {answered}")
                if not self.dropped[j]:
                    ready.append(j)
        waits = words[WAITING:-GLOBAL_WORDS:WORDS_PER_WORKER]
        if waits != self._waits:
            self.waiting = [j for j, (now, before) in enumerate(zip(waits, self._waits)) if now != before]
            self._waits = waits
        elif self.waiting:
            self.waiting = []
        if ready:
            self.mailboxes.sync()
        return ready, [bool(x) or d for x, d in zip(words[LEFT:-GLOBAL_WORDS:WORDS_PER_WORKER], self.dropped)]

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._beat_at >= HEARTBEAT_SECONDS:
            self._beats += 1
            self._beat_at = now
            self.control.store(_global_word(self.control, HEARTBEAT), self._beats)

    def writing(self, busy: bool) -> None:
        """Tell waiting workers that a checkpoint write begins (``busy``: its
        time is not silence) or has ended (the heartbeat moves on at once)."""
        if busy:
            self.control.store(_global_word(self.control, HEARTBEAT), self._beats | WRITING_BIT)
        else:
            self._beat_at = 0.0
            self._heartbeat()

    def progress(self) -> None:
        """Let the workers' one-sided operations on this server's windows
        move on while it does something else."""
        self.control.progress()

    def reply(self, worker: int, stop: bool = False) -> None:
        """Publish ``worker``'s outbox, which the caller has just written;
        with ``stop``, tell it to stop after this step."""
        self.mailboxes.sync()
        self.answered[worker] += 1
        self.control.store(_word(worker, REPLIED), int(self.answered[worker]) | (STOP_BIT if stop else 0))

    def drop(self, worker: int) -> None:
        """Stop waiting for ``worker``: it counts as having left, its pushes
        are never read again, and its next wait for an answer raises."""
        self.dropped[worker] = True
        self.control.store(_word(worker, REPLIED), int(self.answered[worker]) | DROPPED_BIT)

    def close(self) -> None:
        """Tell every worker that the session is over."""
        self.control.store(_global_word(self.control, CLOSED), 1)

    def free(self) -> None:
        """Free both windows (collective, with every worker's :meth:`WorkerChannel.free`)."""
        free_windows(self.control, self.mailboxes)


def free_windows(control: ControlWords, mailboxes: Mailboxes) -> None:
    """Free the two windows, in the same order on every rank."""
    control.free()
    mailboxes.free()

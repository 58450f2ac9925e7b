"""The push/reply protocol between workers and the server, over RMA windows.

Per worker j the control window holds three words -- ``pushed`` (how many
gradients j has published), ``replied`` (how many the server has answered) and
``left`` (j has finished training) -- and one global ``closed`` word, set by
the server when every worker has left.

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

from typing import List, Tuple

import numpy as np

from .errors import HvdDcasgdError
from .stall import StallWatch, stall_warning_seconds
from .transport import Backoff, ControlWords, Mailboxes

WORDS_PER_WORKER = 3
PUSHED, REPLIED, LEFT = range(WORDS_PER_WORKER)


def control_words(num_workers: int) -> int:
    """Size of the control window for ``num_workers`` workers."""
    return num_workers * WORDS_PER_WORKER + 1


def _word(worker: int, field: int) -> int:
    return worker * WORDS_PER_WORKER + field


class WorkerChannel:
    """Worker ``worker``'s end: push a message, pull the reply, leave."""

    def __init__(self, control: ControlWords, mailboxes: Mailboxes, worker: int):
        self.control = control
        self.mailboxes = mailboxes
        self.worker = worker
        self.pushes = 0
        self._closed_word = control.count - 1

    def push(self, message: np.ndarray) -> None:
        """Deliver ``message`` to the inbox, then announce it."""
        self.mailboxes.put_inbox(self.worker, message)
        self.pushes += 1
        self.control.store(_word(self.worker, PUSHED), self.pushes)

    def pull(self, out: np.ndarray) -> None:
        """Wait until the server answered the last push, then read the outbox;
        a wait past ``HVD_DCASGD_STALL_WARNING`` seconds is said out loud."""
        backoff = Backoff()
        watch = None
        while self.control.load(_word(self.worker, REPLIED)) < self.pushes:
            backoff.wait()
            if backoff.idle > backoff.spins:  # not a quick answer: look at the clock
                watch = watch or StallWatch([f"worker {self.worker}: the server (MPI rank {self.control.owner})"],
                                            stall_warning_seconds())
                watch.check([True], f"has not answered push {self.pushes - 1}")
        self.mailboxes.get_outbox(self.worker, out)

    def leave(self) -> None:
        """Tell the server this worker will push no more."""
        self.control.store(_word(self.worker, LEFT), 1)

    def wait_closed(self) -> None:
        """Wait (sleeping, not spinning) until the server closed the session."""
        backoff = Backoff(max_sleep=1e-2)
        while not self.control.load(self._closed_word):
            backoff.wait()

    def free(self) -> None:
        """Free both windows (collective, with the server's :meth:`ServerChannel.free`)."""
        free_windows(self.control, self.mailboxes)


class ServerChannel:
    """The server's end: find pushed gradients, answer them, close."""

    def __init__(self, control: ControlWords, mailboxes: Mailboxes, num_workers: int):
        self.control = control
        self.mailboxes = mailboxes
        self.num_workers = num_workers
        self.answered = np.zeros(num_workers, dtype=np.int64)
        self._words = np.empty(control.count, dtype=np.int64)

    def poll(self) -> Tuple[List[int], List[bool]]:
        """Workers with an unanswered push, and which workers have left.

        One atomic read of every control word, then a memory barrier so that the
        inboxes read next hold what was flushed before the flags.
        """
        words = self.control.load_all(self._words)
        per_worker = words[:-1].reshape(self.num_workers, WORDS_PER_WORKER)
        pushed = per_worker[:, PUSHED]
        if np.any(pushed > self.answered + 1):
            raise HvdDcasgdError(f"hvd_dcasgd: protocol violation, pushes {pushed} answered {self.answered}")
        ready = [int(j) for j in np.flatnonzero(pushed > self.answered)]
        if ready:
            self.mailboxes.sync()
        return ready, [bool(x) for x in per_worker[:, LEFT]]

    def reply(self, worker: int) -> None:
        """Publish ``worker``'s outbox, which the caller has just written."""
        self.mailboxes.sync()
        self.answered[worker] += 1
        self.control.store(_word(worker, REPLIED), int(self.answered[worker]))

    def close(self) -> None:
        """Tell every worker that the session is over."""
        self.control.store(self.control.count - 1, 1)

    def free(self) -> None:
        """Free both windows (collective, with every worker's :meth:`WorkerChannel.free`)."""
        free_windows(self.control, self.mailboxes)


def free_windows(control: ControlWords, mailboxes: Mailboxes) -> None:
    """Free the two windows, in the same order on every rank."""
    control.free()
    mailboxes.free()

"""Graceful preemption: SIGTERM, SIGINT or SIGUSR1 stop the job after the current step.

SLURM's ``scancel`` and preemption send SIGTERM, ``sbatch --signal=USR1@60``
sends SIGUSR1 ahead of the time limit, Ctrl-C sends SIGINT.  While a training
session runs, the handler only informs the rank's lifecycle
(:meth:`.lifecycle.Lifecycle.signal_received`), which notes it: a worker finishes its
current step, asks the server to stop and raises :class:`Preempted`; the
server applies what is already in its inboxes, answers every later push with
"stop" (without applying it: the resumed job redoes it), and once the workers
have left it writes a checkpoint and the job exits with status
:data:`.exits.PREEMPTED` (75).  Outside a session -- before it starts, after
it ends -- and at a second signal, the signal does what it did before.
"""

from __future__ import annotations

import signal
from typing import Callable, Dict, Optional

from .exits import PREEMPTED

__all__ = ["Preempted", "SIGNALS", "install", "signal_name"]

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

_previous: Dict[int, object] = {}


class Preempted(SystemExit):
    """Raised by a worker's ``step()`` once the job was asked to stop: the
    step has completed, the server saves a checkpoint.  A ``SystemExit``
    with status 75, so the script ends (``except Exception`` does not catch
    it) and ``hvd.shutdown()`` runs at exit."""

    def __init__(self, message: str):
        super().__init__(PREEMPTED)
        self.message = message

    def __str__(self) -> str:
        return self.message


def signal_name(number: Optional[int]) -> str:
    return signal.Signals(number).name if number else "a request from another rank"


def install(inform: Callable[[int], bool]) -> None:
    """Handle :data:`SIGNALS` on this rank: ``inform(number)`` (the
    lifecycle's) takes the signal, or returns ``False``, and then the signal
    does what it did before."""

    def handler(number, frame):
        if inform(number):
            return
        previous = _previous.get(number)
        signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(number, frame)
        else:
            signal.raise_signal(number)

    for number in SIGNALS:
        try:
            _previous[number] = signal.getsignal(number)
            signal.signal(number, handler)
        except ValueError:  # not the main thread: the script's own handlers stay
            return

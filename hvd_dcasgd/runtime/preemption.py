"""Graceful preemption: SIGTERM, SIGINT or SIGUSR1 stop the job after the current step.

SLURM's ``scancel`` and preemption send SIGTERM, ``sbatch --signal=USR1@60``
sends SIGUSR1 ahead of the time limit, Ctrl-C sends SIGINT.  While a training
session runs, the handler only informs the rank's lifecycle
(:meth:`.lifecycle.Lifecycle.signal_received`), which notes it: a worker finishes its
current step, asks the server to stop and raises :class:`Preempted`; the
server applies what is already in its inboxes, answers every later push with
"stop" (without applying it: the resumed job redoes it), and once the workers
have left it writes a checkpoint and the job exits with status
:data:`.exits.PREEMPTED` (75).

Any number of later signals, of any of the three kinds, are only counted:
the job stops once, with its checkpoint, also while a worker waits in
``shutdown()``, while the server writes a checkpoint and during the final
exchange (the handlers stay installed until the rank's part of the session
is over).  The way out at once: a signal that comes ``HVD_DCASGD_STOP_GRACE``
seconds or more after the first (30 by default) ends the rank with one
sentence, by the signal's own default action (then nothing more is saved);
SIGKILL always does.  Before the session starts and after this rank's part
of it is over, a signal does what it did before.
"""

from __future__ import annotations

import signal
import sys
from typing import Callable, Dict, Optional

from .exits import PREEMPTED
from .lifecycle import Verdict

__all__ = ["Preempted", "SIGNALS", "install", "signal_name", "stop_grace_seconds"]

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


def stop_grace_seconds() -> Optional[float]:
    """``HVD_DCASGD_STOP_GRACE`` in seconds, or ``None`` when 0 turns the way out off."""
    from ..common.config import resolve

    return resolve("HVD_DCASGD_STOP_GRACE") or None


def signal_name(number: Optional[int]) -> str:
    return signal.Signals(number).name if number else "a request from another rank"


def install(inform: Callable[[int], Verdict], rank: str = "this rank") -> None:
    """Handle :data:`SIGNALS` on this rank: ``inform(number)`` (the
    lifecycle's) takes the signal (:attr:`Verdict.STOPS`, :attr:`Verdict.NOTED`),
    or the signal does what it did before -- with a sentence naming ``rank``
    when it ends the rank at once (:attr:`Verdict.NOW`)."""

    def handler(number, frame):
        verdict = inform(number)
        if verdict in (Verdict.STOPS, Verdict.NOTED):
            return
        if verdict is Verdict.NOW:
            signal.signal(number, signal.SIG_DFL)
            try:
                sys.stderr.write(f"hvd_dcasgd: {rank} ends at once on {signal_name(number)}, which came "
                                 "HVD_DCASGD_STOP_GRACE seconds or more after the first stop signal; what was "
                                 "not yet saved is lost.\n")
                sys.stderr.flush()
            except (OSError, RuntimeError, ValueError):  # stderr closed or busy: end all the same
                pass
            signal.raise_signal(number)
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

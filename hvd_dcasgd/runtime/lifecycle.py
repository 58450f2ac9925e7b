"""One rank's lifecycle: where it is, and why it stops -- in one object.

Every rank (the servers and the workers) has one :class:`Lifecycle`, held by
its runtime.  Its phase moves only forward::

    STARTING --> TRAINING --> STOPPING --> ENDING --> FINISHED
                     \\________________________^

* ``STARTING``: from ``init()`` to the end of the session's start
  (:func:`hvd_dcasgd.serving.transitions.start`: agreement, windows, resume).
* ``TRAINING``: the server applies pushes, the worker steps.
* ``STOPPING``: the job was asked to stop (a signal on some rank, see
  :mod:`.preemption`): the server answers every push "stop" from the update
  :attr:`Lifecycle.stopped_at` on, a worker ends its script after its step.
* ``ENDING``: every worker has left: the final exchange, the last
  checkpoint, the windows freed (:func:`hvd_dcasgd.serving.transitions.end`).
* ``FINISHED``: nothing collective is left; the process may exit.

Signal handlers, the stall watch, the worker's watchdog and the serving
loop only *inform* the lifecycle (:meth:`Lifecycle.signal_received`,
:meth:`Lifecycle.stop`, :meth:`Lifecycle.end_now`); they never end a rank
themselves.  The one way a rank ends at once, without MPI, is
:meth:`Lifecycle.end_now`: a worker's watchdog thread calls it when the
server has been silent past ``HVD_DCASGD_STALL_TIMEOUT`` while the worker
is blocked inside MPI.  The transitions that involve every rank are
each one function both sides run: ``transitions.start`` (start and resume),
the channel's stop word and answer bit (stop), ``transitions.end`` (end), in
:mod:`hvd_dcasgd.serving.transitions`.
"""

from __future__ import annotations

import enum
import os
import time
from typing import Callable, NoReturn, Optional

from ..common.errors import HvdDcasgdError
from ..common.log import get_logger
from .exits import flush

__all__ = ["Lifecycle", "Phase", "Verdict"]

log = get_logger("lifecycle")


class Phase(enum.Enum):
    STARTING = "starting"
    TRAINING = "training"
    STOPPING = "stopping"
    ENDING = "ending"
    FINISHED = "finished"


class Verdict(enum.Enum):
    """What a stop signal does on a rank (:meth:`Lifecycle.signal_received`)."""

    STOPS = "stops"  # the first one while training: the session stops after the current step
    NOTED = "noted"  # the rank is already stopping or ending: counted, nothing else
    AS_BEFORE = "as before"  # outside a session: the signal does what it did before
    NOW = "now"  # HVD_DCASGD_STOP_GRACE seconds after the first one: the rank ends at once


#: The phases each phase may move to.
NEXT = {
    Phase.STARTING: (Phase.TRAINING, Phase.ENDING, Phase.FINISHED),
    Phase.TRAINING: (Phase.STOPPING, Phase.ENDING),
    Phase.STOPPING: (Phase.ENDING,),
    Phase.ENDING: (Phase.FINISHED,),
    Phase.FINISHED: (),
}


class Lifecycle:
    """This rank's phase, the signal that asked it to stop, and where it stopped.

    Arguments:
        stops_on_signal: whether a signal while training stops the session
            gracefully (the parameter server's sessions); Horovod's baseline
            leaves signals as they were.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.phase = Phase.STARTING
        self.stops_on_signal = False
        self.grace: Optional[float] = None  # seconds after the first signal from which a later one ends the rank
        self.clock = clock
        self.signal: Optional[int] = None  # the signal that asked this rank to stop
        self.signalled_at: Optional[float] = None  # when (``clock``)
        self.later_signals = 0  # signals noted after the first one
        self.stopped_at: Optional[int] = None  # on a server: the update from which pushes are answered "stop"
        self.at_exit: Optional[Callable[[], None]] = None  # what is left for the process's exit (see finish)

    def move(self, phase: Phase) -> None:
        """Move to ``phase`` (staying is allowed); a move backwards is a bug, said in a sentence."""
        if phase is not self.phase and phase not in NEXT[self.phase]:
            raise HvdDcasgdError(f"hvd_dcasgd: internal error: a rank cannot go from {self.phase.value} to "
                                 f"{phase.value}")
        self.phase = phase

    def start_training(self, stops_on_signal: bool, grace: Optional[float] = None) -> None:
        """This rank has done its part of the start.  With ``stops_on_signal`` a
        signal stops it gracefully; one that comes ``grace`` seconds or more
        after the first ends the rank at once (``None``: never)."""
        self.stops_on_signal, self.grace = stops_on_signal, grace
        self.move(Phase.TRAINING)

    def signal_received(self, number: int) -> Verdict:
        """From a signal handler: what the signal ``number`` does.  From the
        start of training until this rank's part of the session is over
        (training, stopping, ending), the first signal stops the session
        after the current step and every later one is only counted --
        however many come, in any order -- unless it comes ``grace`` seconds
        or more after the first: then the rank ends at once.  Before the
        session and once this rank has finished, the signal does what it
        did before."""
        if not self.stops_on_signal or self.phase not in (Phase.TRAINING, Phase.STOPPING, Phase.ENDING):
            return Verdict.AS_BEFORE
        now = self.clock()
        if self.signal is None:
            self.signal, self.signalled_at = number, now
            return Verdict.STOPS
        if self.grace is not None and now - self.signalled_at >= self.grace:
            return Verdict.NOW
        self.later_signals += 1
        return Verdict.NOTED

    @property
    def asked_to_stop(self) -> bool:
        """Whether a signal asked this rank to stop."""
        return self.signal is not None

    def stop(self, at: Optional[int] = None) -> None:
        """Stop training: a worker after its step; a server from update ``at`` on."""
        if self.phase is Phase.TRAINING:
            self.move(Phase.STOPPING)
        if at is not None and self.stopped_at is None:
            self.stopped_at = at

    @property
    def stopped(self) -> bool:
        """Whether this server answers "stop" and applies nothing more."""
        return self.stopped_at is not None

    def end(self) -> None:
        """The final exchange begins (every worker has left)."""
        self.move(Phase.ENDING)

    def finish(self, at_exit: Optional[Callable[[], None]] = None) -> None:
        """Nothing collective is left.  ``at_exit``: what this rank must still
        do once its script has ended (after a worker was dropped: end the job
        with the others, :func:`hvd_dcasgd.serving.transitions.end_without_dropped`)."""
        self.at_exit = at_exit
        self.move(Phase.FINISHED)

    def exit(self) -> None:
        """At the process's exit, after the script: what :meth:`finish` left to do."""
        if self.at_exit is not None:
            self.at_exit()

    def end_now(self, sentence: str, status: int) -> NoReturn:
        """This rank cannot go on (its main thread may be stuck inside MPI):
        say ``sentence`` (an error) and end the process with ``status`` at
        once, without MPI -- no collective, no finalize, which could never
        complete -- so that ``mpirun`` sees the exit and ends the job.  From
        any thread."""
        try:
            log.error(sentence)
            flush()
        finally:  # stderr closed or busy: end all the same
            os._exit(status)

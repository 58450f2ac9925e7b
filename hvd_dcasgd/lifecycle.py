"""One rank's lifecycle: where it is, and why it stops -- in one object.

Every rank (the servers and the workers) has one :class:`Lifecycle`, held by
its runtime.  Its phase moves only forward::

    STARTING --> TRAINING --> STOPPING --> ENDING --> FINISHED
                     \\________________________^

* ``STARTING``: from ``init()`` to the end of the session's start
  (:func:`.session.start`: agreement, windows, resume).
* ``TRAINING``: the server applies pushes, the worker steps.
* ``STOPPING``: the job was asked to stop (a signal on some rank, see
  :mod:`.preemption`): the server answers every push "stop" from the update
  :attr:`Lifecycle.stopped_at` on, a worker ends its script after its step.
* ``ENDING``: every worker has left: the final exchange
  (:func:`.session.final_exchange`), the last checkpoint, the windows freed.
* ``FINISHED``: nothing collective is left; the process may exit.

Signal handlers, the stall watch and the serving loop only *inform* the
lifecycle (:meth:`Lifecycle.signal_received`, :meth:`Lifecycle.stop`); they
never end a rank themselves.  The transitions that involve every rank are
each one function both sides run: :func:`.session.start` (start and resume),
the channel's stop word and answer bit (stop), :func:`.session.final_exchange`
(end).
"""

from __future__ import annotations

import enum
from typing import Optional

from .errors import HvdDcasgdError

__all__ = ["Lifecycle", "Phase"]


class Phase(enum.Enum):
    STARTING = "starting"
    TRAINING = "training"
    STOPPING = "stopping"
    ENDING = "ending"
    FINISHED = "finished"


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

    def __init__(self) -> None:
        self.phase = Phase.STARTING
        self.stops_on_signal = False
        self.signal: Optional[int] = None  # the signal that asked this rank to stop
        self.stopped_at: Optional[int] = None  # on a server: the update from which pushes are answered "stop"

    def move(self, phase: Phase) -> None:
        """Move to ``phase`` (staying is allowed); a move backwards is a bug, said in a sentence."""
        if phase is not self.phase and phase not in NEXT[self.phase]:
            raise HvdDcasgdError(f"hvd_dcasgd: internal error: a rank cannot go from {self.phase.value} to "
                                 f"{phase.value}")
        self.phase = phase

    def start_training(self, stops_on_signal: bool) -> None:
        """The session has started on every rank."""
        self.stops_on_signal = stops_on_signal
        self.move(Phase.TRAINING)

    def signal_received(self, number: int) -> bool:
        """From a signal handler: note the first signal while training (the
        session then stops after the current step); ``False`` when the
        signal must do what it did before (outside a session, a second one)."""
        if self.phase in (Phase.TRAINING, Phase.STOPPING) and self.stops_on_signal and self.signal is None:
            self.signal = number
            return True
        return False

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

    def finish(self) -> None:
        self.move(Phase.FINISHED)

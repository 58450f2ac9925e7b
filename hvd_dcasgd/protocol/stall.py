"""No stall is silent: who has been quiet for how long, said out loud.

The server keeps, for every worker that has not left, the time of its last
push; a worker that owes a push (it is not waiting for an answer) and has
been silent for ``HVD_DCASGD_STALL_WARNING`` seconds (60 by default, as
Horovod's stall check; 0 turns the warnings off) is named in a warning,
repeated at that interval while the silence lasts.  A worker waiting for the
server's answer warns the same way.  With ``HVD_DCASGD_STALL_TIMEOUT`` (off by
default, as Horovod's stall shutdown) a worker silent that long is dropped,
and a server silent that long ends the job.

Silence is measured, not the clock: only time during which the side that
judges was running and looking counts.  A gap of more than
:data:`FROZEN_AFTER` seconds between two of its looks means it was itself
frozen (SIGSTOP, a suspended job: ``scontrol suspend``) or busy elsewhere;
that gap is nobody's silence, so every last-heard time moves on by it.
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence

from ..common.config import resolve
from ..common.log import get_logger

__all__ = ["FROZEN_AFTER", "StallWatch", "stall_timeout_seconds", "stall_warning_seconds"]

log = get_logger("stall")

#: Seconds between two looks of a watch beyond which the watcher itself was
#: not running (its loop looks many times a second): the gap is not silence.
FROZEN_AFTER = 1.0


def stall_warning_seconds() -> Optional[float]:
    """``HVD_DCASGD_STALL_WARNING`` in seconds, or ``None`` when 0 turns it off."""
    return resolve("HVD_DCASGD_STALL_WARNING") or None


def stall_timeout_seconds() -> Optional[float]:
    """``HVD_DCASGD_STALL_TIMEOUT`` in seconds, or ``None`` (unset or 0: never)."""
    return resolve("HVD_DCASGD_STALL_TIMEOUT") or None


class StallWatch:
    """The time each of ``names`` was last heard from, and a warning for
    each one silent for ``warn_after`` seconds (again every ``warn_after``)."""

    def __init__(self, names: Sequence[str], warn_after: Optional[float],
                 clock: Callable[[], float] = time.monotonic):
        self.names, self.warn_after, self.clock = list(names), warn_after, clock
        now = clock()
        self.last: List[float] = [now] * len(names)
        self.warned: List[float] = [now] * len(names)
        self.looked = now  # the watcher's last look

    def now(self) -> float:
        """The clock, after moving every last-heard time on by the gap since
        the previous look if that gap shows the watcher was not running."""
        now = self.clock()
        gap = now - self.looked
        if gap > FROZEN_AFTER:
            self.last = [t + gap for t in self.last]
            self.warned = [t + gap for t in self.warned]
        self.looked = now
        return now

    def heard(self, index: int) -> None:
        self.last[index] = self.warned[index] = self.now()

    def check(self, owes: Sequence[bool], what: str = "has not pushed") -> None:
        """Warn about each ``index`` that ``owes`` something and has been silent too long."""
        now = self.now()
        if self.warn_after is None:
            return
        for index, owing in enumerate(owes):
            if owing and now - self.warned[index] >= self.warn_after:
                self.warned[index] = now
                log.warning(f"hvd_dcasgd: {self.names[index]} {what} for {now - self.last[index]:.0f} s "
                            "(a hung data loader, a wedged device, a dead process?)")

    def silent_past(self, owes: Sequence[bool], seconds: Optional[float]) -> List[int]:
        """The indices that ``owes`` something and have been silent ``seconds`` or more."""
        now = self.now()
        if seconds is None:
            return []
        return [i for i, owing in enumerate(owes) if owing and now - self.last[i] >= seconds]

"""Who is in a server's session: the workers present, and every change of
them as one kind of event, in one place.

The changes a job knows today:

* ``left``: a worker's script ended (its data did, or it called
  ``hvd.shutdown()``): it leaves nothing pending, and the others go on;
* ``dropped``: the server dropped a worker silent past
  ``HVD_DCASGD_STALL_TIMEOUT`` (with several servers, the first one drops it
  for all); the others go on, and the job ends with status 69;
* ``resized``: the job resumed from a checkpoint of another number of
  workers (:mod:`hvd_dcasgd.algorithm.membership` says what carries over).

The serving loop and the session tell :class:`Membership` what they see; it
keeps the count of workers present (the metrics' ``workers`` scalar) and
writes each event into the trace as ``{"event": "left", "member": m, "at":
u}``, ``{"event": "dropped", "member": m, "at": u}`` or ``{"event":
"resized", "workers": M', "before": M, "at": u}`` (``u``: the server's
update count then; with several servers each line also carries
``"shard"``).  A line with ``"event"`` is never a push: a trace's pushes are
its lines with ``"worker"`` and ``"update"``.
"""

from __future__ import annotations

from typing import List, Sequence

from ..observability.telemetry import Telemetry

__all__ = ["DROPPED", "LEFT", "Membership", "RESIZED"]

#: The events, as the trace names them.
LEFT, DROPPED, RESIZED = "left", "dropped", "resized"


class Membership:
    """The workers present in one server's session (all of them at the
    start), told every change; ``telemetry`` keeps the count and the trace."""

    def __init__(self, telemetry: Telemetry):
        self.telemetry = telemetry
        self.present: List[bool] = [True] * telemetry.num_workers
        self.count = len(self.present)  # how many are present
        telemetry.note_present(self.count)

    def resized(self, update: int, before: int, after: int) -> None:
        """The job resumed at ``update`` with ``after`` workers where its checkpoint's job had ``before``."""
        self.present, self.count = [True] * after, after
        self.telemetry.note_workers(update, before, after)
        self.telemetry.note_present(after)

    def seen(self, left: Sequence[bool], update: int) -> None:
        """What a poll saw: ``left[m]`` for every worker gone (left, or dropped
        already); the ones newly gone left."""
        if sum(left) == len(left) - self.count:
            return  # nobody new: one comparison per poll
        for m, gone in enumerate(left):
            if gone and self.present[m]:
                self._gone(m, LEFT, update)

    def dropped(self, worker: int, update: int) -> None:
        """``worker`` was dropped (silent past the stall timeout), here or by the first server."""
        if self.present[worker]:
            self._gone(worker, DROPPED, update)

    def _gone(self, worker: int, event: str, update: int) -> None:
        self.present[worker] = False
        self.count -= 1
        self.telemetry.note_member(event, worker, update)
        self.telemetry.note_present(self.count)

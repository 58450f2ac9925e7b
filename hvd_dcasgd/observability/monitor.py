"""What the server's loop calls to be watched: metrics and progress lines.

The loop makes one :class:`Monitor` and calls :meth:`Monitor.tick` once per
turn, after the poll (a clock read, nothing more, until something is due),
:meth:`Monitor.applying` before each push it applies (a flag read; once per
interval a stale push is sampled for ``compensation_ratio``) and
:meth:`Monitor.close` at the end; a checkpoint notes its own time in the
telemetry (:meth:`.telemetry.Telemetry.note_checkpoint`).  What is due
comes from :mod:`.metrics` (``HVD_DCASGD_METRICS``) and :mod:`.progress`
(``HVD_DCASGD_PROGRESS``).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Optional, Sequence

from .metrics import Metrics, metrics_settings
from .progress import Progress, progress_interval

if TYPE_CHECKING:
    from ..algorithm.server import ParameterServer

__all__ = ["Monitor"]


class Monitor:
    """Writes a server's metrics and logs its progress, each at its interval.

    Arguments:
        server: the :class:`.server.ParameterServer` watched.
        worker_offset: the MPI rank of worker 0 (the number of servers).
        metrics_dir: ``DistributedOptimizer(metrics_dir=...)``, which
            ``HVD_DCASGD_METRICS`` overrides.
    """

    def __init__(self, server: "ParameterServer", worker_offset: Optional[int] = None,
                 metrics_dir: Optional[str] = None):
        telemetry = server.telemetry
        if worker_offset is None:
            worker_offset = telemetry.place.first_worker_rank
        settings = metrics_settings(metrics_dir)
        self.metrics = Metrics(server, settings[0]) if settings else None
        self.metrics_every = settings[1] if settings else math.inf
        every = progress_interval()
        self.progress = Progress(telemetry, worker_offset) if every else None
        self.progress_every = every or math.inf
        now = time.monotonic()
        self.metrics_due = now + self.metrics_every
        self.progress_due = now + self.progress_every
        self.due = min(self.metrics_due, self.progress_due)

    def tick(self, left: Sequence[bool] = ()) -> None:
        """Write or log what is due.  ``left[m]``: worker m has left (or was
        dropped), as the poll just found."""
        now = time.monotonic()
        if now < self.due:
            return
        if self.metrics is not None and now >= self.metrics_due:
            self.metrics.write()
            self.metrics_due = now + self.metrics_every
        if self.progress is not None and now >= self.progress_due:
            self.progress.report(left)
            self.progress_due = now + self.progress_every
        self.due = min(self.metrics_due, self.progress_due)

    def applying(self, worker: int) -> None:
        """``worker``'s push is applied next (the interval's compensation_ratio
        may be sampled from it)."""
        if self.metrics is not None and self.metrics.wants_sample:
            self.metrics.sample(worker)

    def close(self) -> None:
        """Write the last interval's metrics and close the files."""
        if self.metrics is not None:
            self.metrics.write()
            self.metrics.close()
            self.metrics = None

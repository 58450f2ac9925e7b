"""A progress line on long runs, logged by the server.

Every ``HVD_DCASGD_PROGRESS`` seconds (default 60; 0: never) each server
logs one line (logger ``hvd_dcasgd.progress``, level INFO)::

    hvd_dcasgd server: 120345 updates, 201.3 updates/s, staleness mean 3.02; slowest worker 2 (MPI rank 3)
    at 48.7 pushes/s; last checkpoint 4m12s ago

the rates over the time since the previous line.  The slowest worker is the
one with the fewest pushes in that time among those still training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from ..common.config import resolve
from ..common.log import get_logger
from .metrics import Reading, interval_figures

if TYPE_CHECKING:
    from .telemetry import Telemetry

__all__ = ["Progress", "progress_interval"]

log = get_logger("progress")


def progress_interval() -> Optional[float]:
    """Seconds between two progress lines; ``None`` for none."""
    return resolve("HVD_DCASGD_PROGRESS") or None


def _ago(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


class Progress:
    """Logs one line about ``telemetry`` at each :meth:`report`, about the
    time since the previous one."""

    def __init__(self, telemetry: "Telemetry", worker_offset: int = 1):
        self.telemetry = telemetry
        self.worker_offset = worker_offset  # MPI rank of worker 0 (the number of servers)
        self.last = Reading(telemetry)
        self.started = self.last.at

    def line(self, left: Sequence[bool] = (), now: Optional[Reading] = None) -> str:
        """The line for the time since the previous one (which it ends)."""
        now = now or Reading(self.telemetry)
        figures = interval_figures(self.last, now)
        self.last = now
        training = [m for m in range(len(now.pushes)) if not (m < len(left) and left[m])]
        parts = [f"{self.telemetry.name}: {now.updates} updates, {figures['updates_per_s']:.1f} updates/s, "
                 f"staleness mean {figures['staleness/mean']:.2f}"]
        if training:
            slowest = min(training, key=lambda m: figures[f"worker{m}/pushes_per_s"])
            parts.append(f"slowest worker {slowest} (MPI rank {slowest + self.worker_offset}) at "
                         f"{figures[f'worker{slowest}/pushes_per_s']:.1f} pushes/s")
        checkpoint_at = self.telemetry.checkpoint_at
        parts.append("no checkpoint yet" if checkpoint_at is None else
                     f"last checkpoint {_ago(now.at - checkpoint_at)} ago")
        return "; ".join(parts)

    def report(self, left: Sequence[bool] = ()) -> None:
        log.info(self.line(left))

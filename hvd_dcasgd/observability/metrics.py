"""Scalars a user can watch while a job runs, written by the server.

With ``HVD_DCASGD_METRICS=DIR`` every server writes, every
``HVD_DCASGD_METRICS_INTERVAL`` seconds (default 10), what its telemetry
counted since the last time, as TensorBoard event files in ``DIR/server``
(``DIR/server-<s>`` for server s of several: one run each), so
``tensorboard --logdir DIR`` shows them beside the script's own runs.
Without the ``tensorboard`` package the same columns go to
``DIR/server/metrics.csv`` (said once).  Each scalar's step is the server's
update count (TensorBoard's wall-time axis shows a stall, where the count
stands still):

==================================  ===========================================================
tag                                 what it is, over the last interval
==================================  ===========================================================
``updates``                         server updates so far
``updates_per_s``                   server updates per second
``gradients_per_s``                 gradients applied per second (several per update on ``sync``)
``staleness/mean``, ``/max``        staleness of the gradients applied (updates between the
                                    weights a gradient was computed on and its own update)
``staleness`` (histogram)           their distribution (CSV: ``staleness:count`` pairs)
``refused``                         pushes refused so far (``HVD_DCASGD_SKIP_BAD_PUSHES=1``)
``workers``                         workers in the job now (one fewer for each that left or was
                                    dropped: :mod:`hvd_dcasgd.serving.membership`)
``apply_seconds_per_update``        time in the update itself (compensate and step)
``checkpoint_seconds``              time the last checkpoint took to write (once per checkpoint)
``compensation_ratio``              mean |compensated g - g| / mean |g|: how much the compensation
                                    changes a gradient (not written for ``none`` and ``sync``)
``worker<m>/pushes_per_s``          worker m's pushes per second
``worker<m>/seconds_since_push``    seconds since worker m's last push
==================================  ===========================================================

``compensation_ratio`` is sampled: the first stale push of each interval
(one computed on weights older than the server's, the pushes the rule
compensates) is compensated as its update is about to, on copies of every
k-th element (about 65,536 elements, an even sample of every layer; the
training untouched); an interval without a stale push has none.  A push
computed on the current weights is left out: its ratio is 0 whatever the
rule, and where pushes come in pairs half the samples would be that 0.
"""

from __future__ import annotations

import csv
import os
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

import torch

from ..common.config import resolve, setting
from ..common.log import get_logger
from ..runtime.place import ServerPlace

if TYPE_CHECKING:
    from ..algorithm.server import ParameterServer
    from .telemetry import Telemetry

__all__ = ["Metrics", "Reading", "interval_figures", "metrics_folder"]

log = get_logger("metrics")


class Reading:
    """A reading of a server's telemetry: its counters at one moment, copied."""

    def __init__(self, telemetry: "Telemetry", now: Optional[float] = None):
        self.at = time.perf_counter() if now is None else now  # the telemetry's clock
        self.updates = telemetry.updates
        self.staleness = Counter(telemetry.staleness)
        self.pushes = list(telemetry.pushes)
        self.refused = sum(telemetry.refused)
        self.workers = telemetry.present
        self.apply_seconds = telemetry.apply_seconds
        self.last_push = list(telemetry.last_push)
        self.checkpoints = telemetry.checkpoints


def interval_figures(before: Reading, after: Reading) -> Dict[str, Any]:
    """The figures of the interval from ``before`` to ``after``: rates,
    staleness of the gradients applied in it (``staleness`` itself is the
    histogram, a Counter), each worker's rate and silence."""
    seconds = max(after.at - before.at, 1e-9)
    staleness = after.staleness - before.staleness
    gradients = sum(staleness.values())
    updates = after.updates - before.updates
    figures: Dict[str, Any] = {
        "updates": after.updates,
        "updates_per_s": updates / seconds,
        "gradients_per_s": gradients / seconds,
        "staleness/mean": sum(s * n for s, n in staleness.items()) / gradients if gradients else 0.0,
        "staleness/max": max(staleness) if staleness else 0,
        "refused": after.refused,
        "workers": after.workers,
        "apply_seconds_per_update": (after.apply_seconds - before.apply_seconds) / updates if updates else 0.0,
    }
    for m, (was, now) in enumerate(zip(before.pushes, after.pushes)):
        figures[f"worker{m}/pushes_per_s"] = (now - was) / seconds
        last = after.last_push[m]
        figures[f"worker{m}/seconds_since_push"] = after.at - (last if last is not None else before.at)
    figures["staleness"] = staleness
    return figures


def metrics_folder(folder: str, place: ServerPlace) -> Path:
    """Where one server writes: ``folder/server``, or ``folder/server-<s>`` for server s of several."""
    return Path(folder) / place.metrics_folder


class _TensorBoard:
    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(log_dir=str(folder))
        self.path = folder

    def write(self, figures: Dict[str, Any], step: int, wall: float) -> None:
        for tag, value in figures.items():
            if tag == "staleness":
                if value:
                    _histogram(self.writer, tag, value, step, wall)
            elif value is not None:
                self.writer.add_scalar(tag, value, step, walltime=wall)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _histogram(writer: Any, tag: str, counts: Counter, step: int, wall: float) -> None:
    values = sorted(counts)
    n = sum(counts.values())
    writer.add_histogram_raw(tag, min=values[0], max=values[-1], num=n, sum=sum(s * c for s, c in counts.items()),
                             sum_squares=sum(s * s * c for s, c in counts.items()),
                             bucket_limits=[s + 0.5 for s in values], bucket_counts=[counts[s] for s in values],
                             global_step=step, walltime=wall)


class _CSV:
    def __init__(self, folder: Path, columns: Sequence[str]):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "metrics.csv"
        self.columns = ["wall_time", "step", *columns]
        new = not self.path.exists() or self.path.stat().st_size == 0  # a resumed job appends
        self.file = open(self.path, "a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=self.columns)
        if new:
            self.writer.writeheader()

    def write(self, figures: Dict[str, Any], step: int, wall: float) -> None:
        row = {k: ("" if v is None else v) for k, v in figures.items()}
        row["staleness"] = " ".join(f"{s}:{n}" for s, n in sorted(figures["staleness"].items()))
        self.writer.writerow({"wall_time": wall, "step": step, **row})
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _tensorboard_installed() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class Metrics:
    """One server's periodic writer: :meth:`write` every interval, from
    :class:`Reading` s of the server's telemetry.

    Arguments:
        server: the :class:`.server.ParameterServer` whose telemetry is written.
        folder: the top folder (``HVD_DCASGD_METRICS``).
        tensorboard: write event files (default: when the package is installed),
            else a CSV of the same columns.
    """

    def __init__(self, server: "ParameterServer", folder: str, tensorboard: Optional[bool] = None):
        self.server = server
        telemetry = server.telemetry
        num_workers = len(telemetry.pushes)
        path = metrics_folder(folder, telemetry.place)
        self.sampled = server.compensation.mode != "none" and server.compensation.schedule != "sync"
        columns = ["updates", "updates_per_s", "gradients_per_s", "staleness/mean", "staleness/max", "staleness",
                   "refused", "workers", "apply_seconds_per_update", "checkpoint_seconds", "compensation_ratio",
                   *(f"worker{m}/{what}" for m in range(num_workers)
                     for what in ("pushes_per_s", "seconds_since_push"))]
        if tensorboard is None:
            tensorboard = _tensorboard_installed()
            if not tensorboard and telemetry.place.speaks_for_all:
                log.warning(f"hvd_dcasgd: the tensorboard package is not installed, so the metrics go to "
                            f"{path / 'metrics.csv'} (pip install tensorboard for event "
                            "files)")
        self.output = _TensorBoard(path) if tensorboard else _CSV(path, columns)
        self.last = Reading(telemetry)
        self.wants_sample = self.sampled  # the interval's compensation_ratio is still to be sampled
        self.ratio: Optional[float] = None  # ... or this
        self.scratch: Dict[str, torch.Tensor] = {}  # the sample's copies, allocated once

    def write(self, now: Optional[Reading] = None) -> Dict[str, Any]:
        """Write the figures since the last write; they are returned."""
        now = now or Reading(self.server.telemetry)
        figures = interval_figures(self.last, now)
        checkpoint = self.server.telemetry.checkpoint_seconds
        figures["checkpoint_seconds"] = checkpoint if now.checkpoints != self.last.checkpoints else None
        figures["compensation_ratio"], self.ratio = self.ratio, None
        self.wants_sample = self.sampled
        self.output.write(figures, now.updates, time.time())
        self.last = now
        return figures

    def sample(self, worker: int) -> None:
        """Take the interval's compensation_ratio from ``worker``'s push, about
        to be applied, if it is stale: mean |compensated g - g| / mean |g|, on
        copies."""
        if self.server.staleness(worker) == 0:
            return  # computed on the current weights: nothing to compensate
        self.ratio = self.server.compensation_ratio(worker, self.scratch)
        self.wants_sample = False

    def close(self) -> None:
        self.output.close()


def metrics_settings(metrics_dir: Optional[str] = None) -> Optional[tuple]:
    """(folder, interval) from the environment or ``metrics_dir`` (``DistributedOptimizer(metrics_dir=...)``,
    which ``HVD_DCASGD_METRICS`` overrides), or ``None`` when no metrics are asked for."""
    folder = setting("HVD_DCASGD_METRICS") or metrics_dir
    if folder is None:
        return None
    return os.path.expanduser(folder), resolve("HVD_DCASGD_METRICS_INTERVAL")

"""What the server counts: updates, pushes per worker, staleness; the trace.

Staleness of a gradient is the number of server updates applied between the
weights it was computed on (the ones last sent to its worker) and its own
update: every gradient is exactly M-1 stale with M workers in round-robin.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import IO, Any, Dict, List, Optional

from .files import atomic_write


class Telemetry:
    """Counts every applied gradient and, with ``trace_path``, writes one JSON
    line per gradient: ``{"update": i, "worker": m, "step": k, "staleness": s}``."""

    def __init__(self, num_workers: int, trace_path: Optional[str] = None, resume_from: Optional[int] = None):
        """With ``resume_from`` (a job resumed at that update) the trace goes
        on where it was, without the lines of updates from that one on (the
        ones a killed job applied after its last checkpoint)."""
        self.num_workers = num_workers
        self.pushes: List[int] = [0] * num_workers
        self.refused: List[int] = [0] * num_workers  # pushes the server would not apply
        self.staleness = Counter()
        self.updates = 0
        self.first: Optional[float] = None  # when the first gradient was applied
        self.last = 0.0
        if trace_path and resume_from is not None and os.path.exists(trace_path):
            _cut_trace(trace_path, resume_from)
        mode = "a" if resume_from is not None else "w"
        self._trace: Optional[IO[str]] = open(trace_path, mode) if trace_path else None

    def record(self, update: int, worker: int, staleness: int) -> None:
        """Note that ``worker``'s next push went into server update ``update``."""
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last
        step = self.pushes[worker]
        self.pushes[worker] += 1
        self.staleness[staleness] += 1
        self.updates = max(self.updates, update + 1)
        if self._trace is not None:
            self._trace.write(json.dumps({"update": update, "worker": worker, "step": step, "staleness": staleness}) + "\n")

    def note_sent(self, worker: int, update: int) -> None:
        """Note that ``worker`` was sent the weights of ``update`` outside a push
        (a consistent snapshot of its checkpoint): ``{"worker": m, "sent": i}``."""
        if self._trace is not None:
            self._trace.write(json.dumps({"worker": worker, "sent": update}) + "\n")

    def flush(self) -> None:
        """Put every trace line so far on disk (a checkpoint is about to name them)."""
        if self._trace is not None:
            self._trace.flush()

    def close(self) -> None:
        if self._trace is not None:
            self._trace.close()
            self._trace = None

    def summary_dict(self) -> Dict[str, Any]:
        """The end-of-run figures as plain values (what :meth:`summary` says)."""
        elapsed = max(self.last - (self.first or 0.0), 1e-9)
        total = sum(self.staleness.values())
        return {
            "updates": self.updates,
            "gradients": total,
            "seconds": elapsed,
            "updates_per_s": self.updates / elapsed,
            "gradients_per_s": total / elapsed,
            "staleness_mean": sum(s * n for s, n in self.staleness.items()) / total if total else 0.0,
            "staleness_max": max(self.staleness) if self.staleness else 0,
            "staleness_histogram": {str(s): n for s, n in sorted(self.staleness.items())},
            "pushes": list(self.pushes),
            "refused": list(self.refused),
            "pushes_per_s": [n / elapsed for n in self.pushes],
        }

    def summary(self) -> str:
        """A few lines for the end of a run."""
        d = self.summary_dict()
        histogram = " ".join(f"{s}:{n}" for s, n in d["staleness_histogram"].items())
        rates = " ".join(f"w{m}={r:.1f}/s" for m, r in enumerate(d["pushes_per_s"]))
        return (
            f"hvd_dcasgd server: {d['updates']} updates in {d['seconds']:.1f} s ({d['updates_per_s']:.1f} updates/s), "
            f"{d['gradients']} gradients ({d['gradients_per_s']:.1f} gradients/s)\n"
            f"hvd_dcasgd server: staleness mean {d['staleness_mean']:.2f} max {d['staleness_max']}; "
            f"histogram {histogram or '-'}\n"
            f"hvd_dcasgd server: pushes per worker {d['pushes']}; throughput {rates}"
            + (f"\nhvd_dcasgd server: refused pushes per worker {d['refused']}" if any(d["refused"]) else "")
        )

    def write_summary(self, path: str) -> None:
        """Write :meth:`summary_dict` to ``path`` as JSON, atomically."""
        summary = self.summary_dict()
        atomic_write(path, lambda out: json.dump(summary, out, indent=1))


def _cut_trace(path: str, update: int) -> None:
    """Keep the lines of ``path`` about updates before ``update``."""
    def before(line: str) -> bool:
        record = json.loads(line)
        return record.get("update", record.get("sent", 0)) < update

    with open(path) as f:
        kept = [line for line in f if line.strip() and before(line)]
    atomic_write(path, lambda out: out.writelines(kept))

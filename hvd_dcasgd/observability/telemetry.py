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
from typing import IO, Any, Dict, List, Optional, Sequence

from ..common.files import atomic_write
from ..common.log import get_logger
from ..runtime.place import OnlyServer, ServerPlace, place_of

log = get_logger("telemetry")


class Telemetry:
    """Counts every applied gradient and, with ``trace_path``, writes one JSON
    line per gradient: ``{"update": i, "worker": m, "step": k, "staleness": s}``.

    With several servers each server's lines carry ``"shard": s``, after one
    first line ``{"shard": s, "offset": o, "numel": n}`` (its slice of the
    flat parameter vector, in elements), and all servers append to the same
    trace, a whole line at a time."""

    def __init__(self, num_workers: int, trace_path: Optional[str] = None, resume_from: Optional[int] = None,
                 place: ServerPlace = OnlyServer()):
        """With ``resume_from`` (a job resumed at that update) the trace goes
        on where it was, without the lines of updates from that one on (the
        ones a killed job applied after its last checkpoint).  ``place`` is
        the server's among the job's servers."""
        self.num_workers = num_workers
        self.place = place
        self.name = place.name
        self._tag = place.trace_tag()
        self.pushes: List[int] = [0] * num_workers
        self.refused: List[int] = [0] * num_workers  # pushes the server would not apply
        self.present = num_workers  # workers in the session now (:mod:`hvd_dcasgd.serving.membership`)
        self.staleness = Counter()
        self.updates = 0
        self.first: Optional[float] = None  # when the first gradient was applied
        self.last = 0.0
        self.apply_seconds = 0.0  # spent in the updates themselves (compensate, step)
        self.last_push: List[Optional[float]] = [None] * num_workers  # when each worker's last push was applied
        self.checkpoints = 0  # checkpoints written by this server in this run
        self.checkpoint_seconds = 0.0  # what the last one took to write
        self.checkpoint_at: Optional[float] = None  # when it was written
        self.bytes_in_per_push, self.bytes_out_per_answer = 0, 0
        self.transport: Dict[str, Any] = {}  # how the pushes travel and which hosts hold the ranks
        self.update_path: Dict[str, str] = {}  # which update ran, how messages reach the model, and why
        shared = place.shares_the_trace  # several servers: the first truncates everyone's, before any writes
        if trace_path and resume_from is not None and not shared and os.path.exists(trace_path):
            truncate_trace(trace_path, {None: resume_from})
        mode = "a" if resume_from is not None or shared else "w"
        # several servers append to one file: a line at a time (one write each, O_APPEND)
        self._trace: Optional[IO[str]] = open(trace_path, mode, buffering=1 if shared else -1) if trace_path else None
        header = place.trace_header()
        if self._trace is not None and header is not None and resume_from is None:
            self._trace.write(json.dumps(header) + "\n")

    def record(self, update: int, worker: int, staleness: int) -> None:
        """Note that ``worker``'s next push went into server update ``update``."""
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last
        self.last_push[worker] = self.last
        step = self.pushes[worker]
        self.pushes[worker] += 1
        self.staleness[staleness] += 1
        self.updates = max(self.updates, update + 1)
        if self._trace is not None:
            self._trace.write(json.dumps({"update": update, "worker": worker, "step": step, "staleness": staleness,
                                          **self._tag}) + "\n")

    def note_workers(self, update: int, before: int, after: int) -> None:
        """The job resumed at ``update`` with ``after`` workers where the checkpoint's had ``before``: every
        worker's count starts again (:mod:`hvd_dcasgd.algorithm.membership`); the trace's line
        ``{"event": "resized", "workers": after, "before": before, "at": i}``."""
        self.num_workers = after
        self.pushes, self.refused = [0] * after, [0] * after
        self.last_push = [None] * after
        self._write({"event": "resized", "workers": after, "before": before, "at": update})

    def note_member(self, event: str, worker: int, update: int) -> None:
        """A worker left the session (``event``: ``left``, ``dropped``) at ``update``: the trace's line
        ``{"event": event, "member": m, "at": i}`` (:mod:`hvd_dcasgd.serving.membership`)."""
        self._write({"event": event, "member": worker, "at": update})

    def note_present(self, workers: int) -> None:
        """How many workers are present now (the metrics' ``workers``)."""
        self.present = workers

    def _write(self, record: Dict[str, Any]) -> None:
        """An event's line, on disk at once (events are few)."""
        if self._trace is not None:
            self._trace.write(json.dumps({**record, **self._tag}) + "\n")
            self._trace.flush()

    def note_sizes(self, bytes_in: int, bytes_out: int) -> None:
        """The bytes of one push (learning rates and gradient) and of one answer (weights)."""
        self.bytes_in_per_push, self.bytes_out_per_answer = bytes_in, bytes_out

    def note_checkpoint(self, seconds: float) -> None:
        """Note that a checkpoint was written, in ``seconds``."""
        self.checkpoints += 1
        self.checkpoint_seconds = seconds
        self.checkpoint_at = time.perf_counter()

    def note_transport(self, transport: Dict[str, str], server_host: str, worker_hosts: Sequence[str]) -> None:
        """How one-sided operations travel (:func:`hvd_dcasgd.runtime.mpi.transport`), the host of this
        server and each worker's."""
        self.transport = {**transport, "server_hosts": [server_host], "worker_hosts": list(worker_hosts)}

    def note_update_path(self, path: str, why: str, staging: str, staging_why: str, pipelined: str) -> None:
        """The update's path and why; how messages reach the server's model
        (``none``: window memory; ``pinned``: page-locked staging) and why;
        whether the staged update is pipelined with its copies, and why."""
        self.update_path = {"path": path, "why": why, "staging": staging, "staging_why": staging_why,
                            "pipelined": pipelined}

    def note_sent(self, worker: int, update: int) -> None:
        """Note that ``worker`` was sent the weights of ``update`` outside a push
        (with the optimizer's state of the same moment, for a checkpoint its
        script saves): ``{"worker": m, "sent": i}``."""
        if self._trace is not None:
            self._trace.write(json.dumps({"worker": worker, "sent": update, **self._tag}) + "\n")

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
            "apply_seconds_per_update": self.apply_seconds / self.updates if self.updates else 0.0,
            "bytes_in_per_push": self.bytes_in_per_push,
            "bytes_out_per_answer": self.bytes_out_per_answer,
            "transport": dict(self.transport),
            "update_path": dict(self.update_path),
        }

    def summary(self) -> str:
        """A few lines for the end of a run."""
        return self.describe(self.summary_dict(), self.name)

    @staticmethod
    def describe(d: Dict[str, Any], name: str) -> str:
        """A summary dict as a few lines, each starting with ``name``."""
        histogram = " ".join(f"{s}:{n}" for s, n in d["staleness_histogram"].items())
        rates = " ".join(f"w{m}={r:.1f}/s" for m, r in enumerate(d["pushes_per_s"]))
        return (
            f"{name}: {d['updates']} updates in {d['seconds']:.1f} s ({d['updates_per_s']:.1f} updates/s), "
            f"{d['gradients']} gradients ({d['gradients_per_s']:.1f} gradients/s)\n"
            f"{name}: staleness mean {d['staleness_mean']:.2f} max {d['staleness_max']}; "
            f"histogram {histogram or '-'}\n"
            f"{name}: pushes per worker {d['pushes']}; throughput {rates}"
            + (f"\n{name}: refused pushes per worker {d['refused']}" if any(d["refused"]) else "")
            + (f"\n{name}: {Telemetry.describe_transport(d['transport'])}" if d.get("transport") else "")
            + (f"\n{name}: {Telemetry.describe_update_path(d['update_path'])}" if d.get("update_path") else "")
        )

    @staticmethod
    def describe_update_path(u: Dict[str, str]) -> str:
        """One line: the update's path, and for a staged model the staging and pipelining, with why."""
        line = f"update path {u['path']} ({u['why']})"
        if u["staging"] != "none":
            line += f"; staging {u['staging']} ({u['staging_why']}); {u['pipelined']}"
        return line

    @staticmethod
    def describe_transport(t: Dict[str, Any]) -> str:
        """One line: the MPI, its one-sided component and thread level, and the hosts."""
        hosts: Dict[str, List[str]] = {}
        server_hosts = t["server_hosts"]
        names = [place_of(s, len(server_hosts)).short_name for s in range(len(server_hosts))]
        for host, rank in [*zip(server_hosts, names), *((h, f"w{m}") for m, h in enumerate(t["worker_hosts"]))]:
            hosts.setdefault(host, []).append(rank)
        components = ", ".join(f"{name} {t[name]}" for name in ("osc", "pml", "btl") if name in t)
        placed = "; ".join(f"{host}: {' '.join(ranks)}" for host, ranks in hosts.items())
        return (f"transport {t['library']}" + (f" ({components})" if components else "")
                + f", thread level {t['thread_level']}; {len(hosts)} host(s): {placed}")

    @staticmethod
    def merge(shards: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
        """Several servers' summary dicts as one, with each under ``shards``:
        every server takes every push, so a push counts once (the fewest any
        server applied), updates and their rate are per server (the mean),
        staleness counts every server's gradients."""
        histogram: Counter = Counter()
        for d in shards:
            histogram.update({int(s): n for s, n in d["staleness_histogram"].items()})
        total = sum(histogram.values())
        seconds = max(d["seconds"] for d in shards)
        pushes = [min(p) for p in zip(*(d["pushes"] for d in shards))]
        return {
            "updates": round(sum(d["updates"] for d in shards) / len(shards)),
            "gradients": min(d["gradients"] for d in shards),
            "seconds": seconds,
            "updates_per_s": sum(d["updates_per_s"] for d in shards) / len(shards),
            "gradients_per_s": min(d["gradients_per_s"] for d in shards),
            "staleness_mean": sum(s * n for s, n in histogram.items()) / total if total else 0.0,
            "staleness_max": max(histogram) if histogram else 0,
            "staleness_histogram": {str(s): n for s, n in sorted(histogram.items())},
            "pushes": pushes,
            "refused": [max(r) for r in zip(*(d["refused"] for d in shards))],
            "pushes_per_s": [n / seconds for n in pushes],
            "apply_seconds_per_update": max(d["apply_seconds_per_update"] for d in shards),
            "bytes_in_per_push": max(d["bytes_in_per_push"] for d in shards),
            "bytes_out_per_answer": max(d["bytes_out_per_answer"] for d in shards),
            "transport": {**shards[0]["transport"],
                          "server_hosts": [h for d in shards for h in d["transport"].get("server_hosts", [])]}
            if shards[0].get("transport") else {},
            "update_path": dict(shards[0].get("update_path", {})),
            "shards": list(shards),
        }

    @staticmethod
    def write(path: str, summary: Dict[str, Any]) -> None:
        """Write a summary dict to ``path`` as JSON, atomically."""
        atomic_write(path, lambda out: json.dump(summary, out, indent=1))

    def write_summary(self, path: str) -> None:
        """Write :meth:`summary_dict` to ``path`` as JSON, atomically."""
        self.write(path, self.summary_dict())


def read_trace(path: str) -> List[Dict[str, Any]]:
    """The records of the trace at ``path``, in order.  A line that is not
    whole (torn) -- the last one, torn by a SIGKILL while it was written, or,
    with several servers appending, one torn and followed on the same
    line by another server's whole one -- is dropped with a warning naming
    the line; a whole record after it on that line is kept."""
    records, decoder = [], json.JSONDecoder()
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
                continue
            except ValueError:
                pass
            rest = None  # a whole record after the torn part: from the last "{" that parses to the end
            for start in (i for i in range(len(line) - 1, 0, -1) if line[i] == "{"):
                try:
                    record, end = decoder.raw_decode(line, start)
                except ValueError:
                    continue
                if end == len(line) and isinstance(record, dict):
                    rest = record
                break
            log.warning(f"hvd_dcasgd: the trace {path} has a torn line at line {number} (a job killed while "
                        f"writing it): dropped {line[:40]!r}{' ...' if len(line) > 40 else ''}")
            if rest is not None:
                records.append(rest)
    return records


def truncate_trace(path: str, updates: Dict[Optional[int], Optional[int]]) -> None:
    """Keep the lines of ``path`` about updates before ``updates[s]``, s
    being a line's ``"shard"`` (``None`` for one server's lines; a server
    missing or at ``None`` keeps nothing but its first line); torn lines
    are dropped (:func:`read_trace`), every kept one ends the line."""
    def before(record: Dict[str, Any]) -> bool:
        if "offset" in record:  # a server's first line
            return True
        update = updates.get(record.get("shard"))
        at = record["update"] if "update" in record else record.get("sent", record.get("at", 0))
        return update is not None and at < update

    kept = [json.dumps(record) + "\n" for record in read_trace(path) if before(record)]
    atomic_write(path, lambda out: out.writelines(kept))

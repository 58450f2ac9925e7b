"""The evidence's runs.  ``plan.py`` lists the runs of a scale: tuning on
the validation split, then the main table (event-driven simulator, M = 4, 8,
16, 32, every method, paired seeds), one slow worker under a fixed virtual
time, round-robin as the paper's reference, real MPI runs at M = 4 with each
asynchronous run's trace replayed, and real runs padded to a step time with
and without a straggler.  This command runs them and records each in
``OUT/results/evidence.json`` as it finishes (``records.py``); then
``report.py`` writes ``OUT/RESULTS.md`` and the plots from that file alone.

    python benchmarks/evidence/run.py                 # full scale, about 45 minutes on 2 cores
    python benchmarks/evidence/run.py --quick         # digits, about 4 minutes on 2 cores (another --out)
    python benchmarks/evidence/run.py --scale tiny --out /tmp/ev --work /tmp/ev-work  # the tests' size
    python benchmarks/evidence/report.py              # only the page, in seconds, no training

A run already recorded without failure is skipped: a killed command resumes
where it stopped, a finished one runs nothing and only writes the page.  The
plan is made again after every wave of runs, since the tuned methods' runs
can only be planned once their tuning runs are recorded.  The timed real runs
go one at a time; the other real runs (one at a time among themselves) share
the cores with the simulator runs (``--jobs`` processes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shlex
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(ROOT)]  # tasks, benchmarks' helpers, package: here and in the simulator

from hvd_dcasgd.errors import HvdDcasgdError  # noqa: E402
from hvd_dcasgd.process import CommandResult, run_command  # noqa: E402
from jobs import child_env, mpirun  # noqa: E402
from plan import JITTER, METHODS, SCALES, SLOWDOWN, Run, Scale, key_of, plan  # noqa: E402
from records import empty, load, retire, save, succeeded  # noqa: E402
from tasks import TASKS  # noqa: E402

MPI_TIMEOUT = 900  # seconds: a hang ends as a failed run
DIVERGED = "holds NaN or Inf"  # what the server's refusal of a non-finite gradient says
CHANCE_ERROR = 0.9


# --- the kinds of run ---------------------------------------------------------
def execute(spec: Dict, work: Path) -> Dict:
    """Run what ``spec`` describes (any kind); its record: ``key``, ``spec``'s
    fields and the results, or ``failed`` with the last lines of the error."""
    kinds = {"simulator": simulate_run, "mpi": mpi_run}
    try:
        record = kinds[spec["source"]](spec, work)
    except Exception:
        record = {**spec, "failed": traceback.format_exc().strip().splitlines()[-12:]}
    return {"key": key_of(spec), **record}


def delay_model(spec: Dict):
    """The simulator's delay model for ``spec``, and its virtual-time budget (or None)."""
    from hvd_dcasgd.simulator import EventDriven, RoundRobin, TraceOrder, steps_per_epoch

    workers, delay = spec["workers"], spec["delay"]
    if delay == "trace":
        return TraceOrder(spec["trace"]), None
    if delay == "round-robin":
        return RoundRobin(), None
    if delay == "event":
        return EventDriven.homogeneous(workers, JITTER), None
    task = TASKS[spec["task"]]
    train_size = task.sizes[0]
    until = spec["epochs"] * steps_per_epoch(train_size, 0, workers, task.batch_size)  # a fast worker's epochs
    return EventDriven.one_slow(workers, SLOWDOWN, JITTER), float(until)


def simulate_run(spec: Dict, work: Path) -> Dict:
    """One simulator run, in this process (a simulator pool's worker)."""
    import torch

    from hvd_dcasgd.compensation import Compensation
    from hvd_dcasgd.simulator import simulate

    torch.set_num_threads(1)
    task = TASKS[spec["task"]]
    train, validation, test = task.data(work / "data")
    order, until = delay_model(spec)
    compensation = Compensation(simulated_mode(spec["method"]), spec["lambda_0"])
    try:
        result = simulate(task.model, train, validation if spec["split"] == "validation" else test,
                          compensation=compensation, workers=spec["workers"], epochs=spec["epochs"],
                          batch_size=task.batch_size, lr=rate(spec), delay=order, seed=spec["seed"], until=until)
    except HvdDcasgdError as error:
        if DIVERGED not in str(error):
            raise
        return diverged(spec, str(error))
    return {**spec, "final_error": result.final_error, "test_errors": result.test_errors, "times": result.times,
            "samples": result.samples, "virtual_seconds": result.seconds, "updates": result.updates,
            "checksum": result.checksum, "staleness": {str(s): n for s, n in sorted(result.staleness.items())}}


def diverged(spec: Dict, sentence: str) -> Dict:
    """The record of a run whose weights became NaN or Inf (the server refused
    a gradient holding them): a result, scored at chance (a model that
    predicts nothing gets 90% of ten balanced classes wrong)."""
    return {**spec, "diverged": sentence.strip().splitlines()[-1], "final_error": CHANCE_ERROR, "test_errors": [],
            "times": []}


def simulated_mode(method: str) -> str:
    """The server mode that simulates ``method``: sequential SGD is one worker
    of ASGD, Horovod's allreduce is the server's ``sync`` schedule (the
    average of every worker's gradient per step, at the rate given)."""
    return {"sgd": "none", "horovod": "sync"}.get(method, METHODS[method].mode)


def rate(spec: Dict):
    """The rate a worker sends at (fractional) epoch e: the task's schedule,
    times the method's scale, with its warm-up."""
    task, epochs, scale, warmup = TASKS[spec["task"]], spec["epochs"], spec["scale"], spec["warmup"] or 0.0
    if spec.get("lr") is not None:
        task = dataclasses.replace(task, lr=spec["lr"])
    return lambda epoch: task.lr_at(epoch, epochs, scale, warmup)


def mpi_run(spec: Dict, work: Path) -> Dict:
    """One real run, ``mpirun -np workers+1 train_mpi.py``, with its trace's staleness."""
    name = key_of(spec).replace("/", "-")
    out, trace, summary = work / f"{name}.json", work / f"{name}.jsonl", work / f"{name}.summary.json"
    for stale in (out, trace, summary):  # left by an earlier, killed attempt
        stale.unlink(missing_ok=True)
    mode = "none" if spec["method"] == "sgd" else METHODS[spec["method"]].mode
    options = ["--lambda-0", spec["lambda_0"]] if spec["lambda_0"] is not None else []
    options += ["--warmup", spec["warmup"]] if spec["warmup"] else []
    options += ["--lr", spec["lr"]] if spec.get("lr") is not None else []
    options += ["--step-time", spec["step_time"], "--seconds", spec["seconds"]] if spec["step_time"] else []
    cmd = mpirun(spec["workers"] + 1, HERE / "train_mpi.py", "--task", spec["task"], "--compensation", mode,
                 "--epochs", spec["epochs"], "--seed", spec["seed"], "--scale", spec["scale"], *options,
                 "--straggler", spec["straggler"], "--cache", work / "data", "--trace", trace, "--out", out)
    started = time.perf_counter()
    result = run_command(cmd, timeout=MPI_TIMEOUT, env={**child_env(), "HVD_DCASGD_SUMMARY": str(summary)})
    record = {**spec, "command": shlex.join(map(str, cmd)), "launch_seconds": time.perf_counter() - started}
    if result.returncode != 0 and DIVERGED in result.stdout:
        return diverged(record, next(line for line in result.stdout.splitlines() if DIVERGED in line))
    if result.returncode != 0 or not out.exists():
        return {**record, "failed": last_lines(result, MPI_TIMEOUT)}
    record = {**json.loads(out.read_text()), **record}
    record["server_updates_per_s"] = json.loads(summary.read_text())["updates_per_s"] if summary.exists() else None
    if trace.exists() and trace.stat().st_size:
        record["trace"] = str(trace)
        counts: Dict[int, int] = {}
        for line in trace.read_text().splitlines():
            s = json.loads(line)["staleness"]
            counts[s] = counts.get(s, 0) + 1
        record["staleness"] = {str(s): n for s, n in sorted(counts.items())}
    return record


def last_lines(result: CommandResult, timeout: float) -> List[str]:
    return result.stdout.strip().splitlines()[-12:] + ([f"(killed after {timeout:.0f} s)"] if result.timed_out else [])


# --- running the plan ---------------------------------------------------------
class Recorder:
    """evidence.json, rewritten after every finished run with this session's
    entry (its command, machine, load and time so far), so that a killed
    command loses only the runs it was in the middle of."""

    def __init__(self, path: Path, evidence: Dict, command: str):
        self.path, self.evidence, self.started = path, evidence, time.time()
        self.lock = threading.Lock()
        self.session = {"command": command, "machine": machine(), "cores": os.cpu_count(),
                        "load_before": list(os.getloadavg()), "load_after": None, "seconds": 0.0,
                        "timed_seconds": 0.0, "runs": 0}

    def add(self, record: Dict, timed: bool = False) -> None:
        with self.lock:  # the launcher's thread and the main thread both add
            self._add(record, timed)

    def _add(self, record: Dict, timed: bool) -> None:
        if not self.session["runs"]:
            self.evidence["sessions"].append(self.session)
        others = [r for r in self.evidence["records"] if r["key"] != record["key"]]
        self.evidence["records"] = others + [record]
        seconds = time.time() - self.started
        self.session.update(runs=self.session["runs"] + 1, seconds=seconds, load_after=list(os.getloadavg()))
        if timed:
            self.session["timed_seconds"] = seconds
        save(self.path, self.evidence)
        outcome = f"failed: {record['failed'][-1] if record['failed'] else '?'}" if "failed" in record else "done"
        print(f"  [{self.session['runs']}] {record['key']}: {outcome} ({seconds:.0f} s)", flush=True)


def run_all(scale: Scale, recorder: Recorder, work: Path, jobs: int) -> None:
    """Wave after wave, until a plan made from the records so far has nothing
    left to run: its timed runs one at a time, then the others together
    (each replay once the real run it replays is recorded)."""
    attempted = set()
    while True:
        recorded = succeeded(recorder.evidence)
        todo = [run for run in plan(scale, recorder.evidence["records"])
                if run.key not in recorded and run.key not in attempted and not replays_divergence(run, recorded)]
        ready = [run for run in todo if run.needs is None or run.needs in recorded]
        if not ready:
            if todo:
                print(f"{len(todo)} runs not run: the real runs they replay failed", flush=True)
            return
        attempted.update(run.key for run in ready)
        for run in ready:
            if run.alone:
                recorder.add(execute(run.spec, work), timed=True)
        run_together([input_of(run, recorded) for run in ready if not run.alone], recorder, work, jobs)


def replays_divergence(run: Run, recorded: Dict[str, Dict]) -> bool:
    """Whether ``run`` would replay a real run that diverged (and left no trace to replay)."""
    return run.needs is not None and bool(recorded.get(run.needs, {}).get("diverged"))


def input_of(run: Run, recorded: Dict[str, Dict]) -> Dict:
    """``run``'s spec, with the trace it replays."""
    return {**run.spec, "trace": recorded[run.needs].get("trace")} if run.needs else run.spec


def run_together(specs: List[Dict], recorder: Recorder, work: Path, jobs: int) -> None:
    """Simulator runs on ``jobs`` processes (each a fresh MPI singleton, a few
    runs each: ``multiprocessing.Pool`` replaces a worker after
    ``maxtasksperchild`` runs without the deadlocks ``ProcessPoolExecutor``'s
    ``max_tasks_per_child`` has on Python 3.11) while the real runs go one
    after another on a thread."""
    simulated = [spec for spec in specs if spec["source"] == "simulator"]
    real = [spec for spec in specs if spec["source"] != "simulator"]
    with get_context("spawn").Pool(jobs, maxtasksperchild=8) as simulators, ThreadPoolExecutor(1) as launcher:
        launched = [launcher.submit(lambda spec: recorder.add(execute(spec, work)), spec) for spec in real]
        for record in simulators.imap_unordered(partial(execute, work=work), simulated):
            recorder.add(record)
        for future in launched:
            future.result()


def retire_unplanned(scale: Scale, evidence: Dict, path: Path) -> None:
    """Once every planned run is recorded, drop the records the plan no
    longer has (an earlier grid's or setting's), saying which."""
    final = plan(scale, evidence["records"])
    done = succeeded(evidence)
    if any(run.key not in done and not replays_divergence(run, done) for run in final):
        return  # not complete: a tuned method's evaluation may not be planned yet
    gone = retire(evidence, [run.key for run in final])
    if gone:
        save(path, evidence)
        print(f"dropped {len(gone)} records the plan no longer has (an earlier grid or setting): "
              + ", ".join(gone[:5]) + (", ..." if len(gone) > 5 else ""), flush=True)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description="Reproduce the paper's comparison at CPU scale.")
    parser.add_argument("--scale", choices=sorted(SCALES), default=None, help="full (default), quick, or tiny (tests)")
    parser.add_argument("--quick", action="store_true", help="the same as --scale quick")
    parser.add_argument("--out", default="docs", help="RESULTS.md here, plots and evidence.json in OUT/results")
    parser.add_argument("--work", default="build/evidence", help="data cache, traces and per-run files")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulator processes")
    parser.add_argument("--report", action=argparse.BooleanOptionalAction, default=True,
                        help="write RESULTS.md and the plots afterwards (default: yes)")
    args = parser.parse_args()
    scale_name = args.scale or ("quick" if args.quick else "full")
    out, work = Path(args.out), Path(args.work)
    path = out / "results" / "evidence.json"
    evidence = load(path) if path.exists() else empty(scale_name)
    if evidence["scale"] != scale_name:
        parser.error(f"{path} holds a {evidence['scale']}-scale run; give another --out to run at {scale_name} scale")
    scale = SCALES[scale_name]
    done = succeeded(evidence)
    todo = [run for run in plan(scale, evidence["records"]) if run.key not in done and not replays_divergence(run, done)]
    print(f"{len(done)} runs recorded already (skipped); {len(todo)} to run now (tuned methods are planned once their tuning is recorded)",
          flush=True)
    if todo:
        command = " ".join(["python benchmarks/evidence/run.py", *map(shlex.quote, sys.argv[1:])])
        recorder = Recorder(path, evidence, command)
        path.parent.mkdir(parents=True, exist_ok=True)
        for task in scale.tasks:
            TASKS[task].data(work / "data")
        run_all(scale, recorder, work, args.jobs)
        print(f"ran {recorder.session['runs']} runs in {recorder.session['seconds'] / 60:.1f} min", flush=True)
    retire_unplanned(scale, evidence, path)
    if args.report:
        from report import default_readme, write_report

        names = write_report(out, default_readme(out))
        print(f"wrote {out / 'RESULTS.md'} and {len(names)} plots", flush=True)


if __name__ == "__main__":
    main()

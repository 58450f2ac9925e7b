"""The evidence's runs.  ``plan.py`` lists the runs of a scale: the paper's
Table 1 at CPU scale (simulator for M = 4, 8, 16, the real MPI parameter server
for M = 4), a lambda_0 sweep, delay models against real staleness, wall-clock
and throughput with and without a straggler, the compensation's cost.  This
command runs them and records each in ``OUT/results/evidence.json`` as it
finishes (``records.py``); then ``report.py`` writes ``OUT/RESULTS.md`` and
the plots from that file alone.

    python benchmarks/evidence/run.py                 # full scale, about 17 minutes on 2 cores
    python benchmarks/evidence/run.py --scale quick   # a few minutes, fewer epochs and seeds
    python benchmarks/evidence/run.py --scale tiny --out /tmp/ev --work /tmp/ev-work  # the tests' size
    python benchmarks/evidence/report.py              # only the page, in seconds, no training

A run already recorded without failure is skipped: a killed command resumes
where it stopped, a finished one runs nothing and only writes the page.  The
real runs whose timings are compared go one at a time; the other real runs
(one at a time among themselves) share the cores with the simulator runs
(``--jobs`` processes); the replay of a real run's trace starts once that run
is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(ROOT)]  # this tree's tasks and package, in this process and the simulator's

from hvd_dcasgd.process import CommandResult, run_command  # noqa: E402
from plan import SCALES, Run, key_of, plan  # noqa: E402
from records import empty, load, save, succeeded  # noqa: E402
from report import write_report  # noqa: E402
from tasks import TASKS  # noqa: E402

MPI_TIMEOUT = BENCH_TIMEOUT = 900  # seconds: a hang ends as a failed run


# --- the kinds of run ---------------------------------------------------------
def execute(spec: Dict, work: Path) -> Dict:
    """Run what ``spec`` describes (any kind); its record: ``key``, ``spec``'s
    fields and the results, or ``failed`` with the last lines of the error."""
    kinds = {"simulator": simulate_run, "mpi": mpi_run, "bench": bench_run}
    try:
        record = kinds[spec["source"]](spec, work)
    except Exception:
        record = {**spec, "failed": traceback.format_exc().strip().splitlines()[-12:]}
    return {"key": key_of(spec), **record}


def simulate_run(spec: Dict, work: Path) -> Dict:
    """One simulator run, in this process (a simulator pool's worker)."""
    import torch

    from hvd_dcasgd.compensation import Compensation
    from hvd_dcasgd.simulator import EventDriven, RandomOrder, RoundRobin, TraceOrder, simulate

    torch.set_num_threads(1)
    job = {**spec, "cache": str(work / "data")}
    task, workers, delay = TASKS[job["task"]], job["workers"], job["delay"]
    train, test = task.data(Path(job["cache"]))
    models = {"round-robin": RoundRobin, "random": RandomOrder, "heavy-tailed": lambda: EventDriven.heavy_tailed(workers)}
    order = TraceOrder(job["trace"]) if delay == "trace" else models[delay]()
    mode = "none" if job["method"] == "sgd" else job["method"]
    result = simulate(task.model, train, test, compensation=Compensation(mode, job["lambda_0"]), workers=workers,
                      epochs=job["epochs"], batch_size=task.batch_size, lr=lambda e: task.lr_at(e, job["epochs"]),
                      delay=order, seed=job["seed"])
    return {**job, "final_error": result.final_error, "test_errors": result.test_errors,
            "staleness": {str(s): n for s, n in sorted(result.staleness.items())}}


def mpi_run(spec: Dict, work: Path) -> Dict:
    """One real run, ``mpirun -np workers+1 train_mpi.py``, with its trace's staleness."""
    name = key_of(spec).replace("/", "-")
    out, trace, summary = work / f"{name}.json", work / f"{name}.jsonl", work / f"{name}.summary.json"
    for stale in (out, trace, summary):  # left by an earlier, killed attempt
        stale.unlink(missing_ok=True)
    cmd = mpirun(spec["workers"] + 1, HERE / "train_mpi.py", "--task", spec["task"],
                 "--compensation", "none" if spec["method"] == "sgd" else spec["method"], "--epochs", spec["epochs"],
                 "--seed", spec["seed"], "--straggler", spec["straggler"], "--cache", work / "data",
                 "--trace", trace, "--out", out)
    started = time.perf_counter()
    result = run_command(cmd, timeout=MPI_TIMEOUT, env={**child_env(), "HVD_DCASGD_SUMMARY": str(summary)})
    record = {**spec, "command": shlex.join(map(str, cmd)), "launch_seconds": time.perf_counter() - started}
    if result.returncode != 0 or not out.exists():
        return {**record, "failed": last_lines(result, MPI_TIMEOUT)}
    record = {**json.loads(out.read_text()), **record}  # the program calls sequential SGD "none"
    record["server_updates_per_s"] = json.loads(summary.read_text())["updates_per_s"] if summary.exists() else None
    if trace.exists() and trace.stat().st_size:
        record["trace"] = str(trace)
        counts: Dict[int, int] = {}
        for line in trace.read_text().splitlines():
            s = json.loads(line)["staleness"]
            counts[s] = counts.get(s, 0) + 1
        record["staleness"] = {str(s): n for s, n in sorted(counts.items())}
    return record


def bench_run(spec: Dict, work: Path) -> Dict:
    """The server-bound update rate of every mode (benchmarks/bench_end_to_end.py)."""
    cmd = [sys.executable, ROOT / "benchmarks" / "bench_end_to_end.py", "--steps", "150"]
    result = run_command(cmd, timeout=BENCH_TIMEOUT, env=child_env())
    rates = {f"{mode} {variant}".strip(): float(rate)
             for mode, variant, rate in re.findall(r"^\s+(\w+)\s+(.*?)\s*([\d.]+) updates/s", result.stdout, re.M)}
    record = {**spec, "command": shlex.join(map(str, cmd)), "updates_per_s": rates,
              "output": result.stdout.strip().splitlines()}
    return record if result.returncode == 0 else {**record, "failed": last_lines(result, BENCH_TIMEOUT)}


def mpirun(ranks: int, *args) -> List[str]:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "--oversubscribe", "-np", str(ranks), sys.executable, *map(str, args)]


def child_env() -> Dict[str, str]:
    """This environment, with this tree's package first on the path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def last_lines(result: CommandResult, timeout: float) -> List[str]:
    return result.stdout.strip().splitlines()[-12:] + ([f"(killed after {timeout:.0f} s)"] if result.timed_out else [])


# --- running the plan ---------------------------------------------------------
class Recorder:
    """evidence.json, rewritten after every finished run with this session's
    entry (its command, machine, load and time so far), so that a killed
    command loses only the runs it was in the middle of."""

    def __init__(self, path: Path, evidence: Dict, command: str, total: int):
        self.path, self.evidence, self.total, self.started = path, evidence, total, time.time()
        self.session = {"command": command, "machine": machine(), "cores": os.cpu_count(),
                        "load_before": list(os.getloadavg()), "load_after": None, "seconds": 0.0,
                        "timed_seconds": 0.0, "runs": 0}

    def add(self, record: Dict, timed: bool = False) -> None:
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
        print(f"  [{self.session['runs']}/{self.total}] {record['key']}: {outcome} ({seconds:.0f} s)", flush=True)


def run_all(runs: List[Run], recorder: Recorder, work: Path, jobs: int) -> None:
    """The runs to be timed one at a time, then the others in waves: every
    run whose input is recorded, until none is left or none can start."""
    for run in runs:
        if run.alone:
            recorder.add(execute(run.spec, work), timed=True)
    pending = [run for run in runs if not run.alone]
    while pending:
        recorded = succeeded(recorder.evidence)
        ready = [run for run in pending if run.needs is None or run.needs in recorded]
        if not ready:
            print(f"{len(pending)} runs not run: the real runs they replay failed", flush=True)
            return
        run_together([input_of(run, recorded) for run in ready], recorder, work, jobs)
        started = {run.key for run in ready}
        pending = [run for run in pending if run.key not in started]


def input_of(run: Run, recorded: Dict[str, Dict]) -> Dict:
    """``run``'s spec, with the trace it replays."""
    return {**run.spec, "trace": recorded[run.needs].get("trace")} if run.needs else run.spec


def run_together(specs: List[Dict], recorder: Recorder, work: Path, jobs: int) -> None:
    """Simulator runs on ``jobs`` processes (each a fresh MPI singleton, a few
    runs each) while the real runs and the benchmark go one after another."""
    with ThreadPoolExecutor(1) as launcher, ProcessPoolExecutor(jobs, mp_context=get_context("spawn"),
                                                                max_tasks_per_child=8) as simulators:
        futures = [(simulators if spec["source"] == "simulator" else launcher).submit(execute, spec, work)
                   for spec in specs]
        for future in as_completed(futures):
            recorder.add(future.result())


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
    planned = plan(SCALES[scale_name])
    done = succeeded(evidence)
    todo = [run for run in planned if run.key not in done]
    print(f"{len(planned)} planned runs: {len(planned) - len(todo)} recorded already (skipped), {len(todo)} to run",
          flush=True)
    if todo:
        command = " ".join(["python benchmarks/evidence/run.py", *map(shlex.quote, sys.argv[1:])])
        recorder = Recorder(path, evidence, command, len(todo))
        path.parent.mkdir(parents=True, exist_ok=True)
        for task in SCALES[scale_name].tasks:
            TASKS[task].data(work / "data")
        run_all(todo, recorder, work, args.jobs)
        print(f"ran {recorder.session['runs']} runs in {recorder.session['seconds'] / 60:.1f} min", flush=True)
    if args.report:
        names = write_report(out)
        print(f"wrote {out / 'RESULTS.md'} and {len(names)} plots", flush=True)


if __name__ == "__main__":
    main()

"""Run the evidence of ``docs/results/PLAN.md``: every planned run not yet
recorded, then the page.

    python benchmarks/evidence/run.py                    # the accuracy study, standard scale (about 80 min on 2 cores)
    python benchmarks/evidence/run.py --study time       # then the time-to-accuracy study (real jobs, about 2 h)
    python benchmarks/evidence/run.py --scale quick --out build/quick   # for trying things: never results

Resumable: the records are kept in ``OUT/results/evidence.json``, rewritten
after every finished run, and a run already recorded is not run again.  Every
session records its start time (UTC), the commit and whether the tree was
clean; a session on another commit than the records' is refused unless
``--allow-mixed-commits`` is given (the page then says so).  Simulator runs go
on ``--jobs`` processes; the real jobs of the time study one at a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
import traceback
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(ROOT)]  # tasks, benchmarks' helpers, package: here and in the simulator

from tqdm import tqdm  # noqa: E402

from hvd_dcasgd.common.errors import HvdDcasgdError  # noqa: E402
from hvd_dcasgd.common.process import run_command  # noqa: E402
from jobs import child_env, mpirun  # noqa: E402
from plan import JITTER, METHODS, MOMENTUM, SCALES, Scale, key_of, plan  # noqa: E402
from records import empty, load, save, succeeded  # noqa: E402
from tasks import TASKS, rate_at  # noqa: E402

MPI_TIMEOUT = 300  # seconds: a hang ends as a failed run
DIVERGED = "holds NaN or Inf"  # what the server's refusal of a non-finite gradient says
CHANCE_ERROR = 0.9


# --- the kinds of run ---------------------------------------------------------
def execute(spec: Dict, work: Path) -> Dict:
    """Run what ``spec`` describes (any kind); its record: ``key``, ``spec``'s
    fields and the results, or ``failed`` with the last lines of the error."""
    kinds = {"simulator": simulate_run, "mpi": real_run, "horovodrun": real_run}
    try:
        record = kinds[spec["source"]](spec, work)
    except Exception:
        record = {**spec, "failed": traceback.format_exc().strip().splitlines()[-12:]}
    return {"key": key_of(spec), **record}


def compensation_of(spec: Dict):
    """The server's ``Compensation`` for ``spec``'s method and constant."""
    from hvd_dcasgd.algorithm.compensation import Compensation

    method = METHODS[spec["method"]]
    if method.constant is None:
        return Compensation(method.mode)
    return Compensation(method.mode, **{method.constant: spec["constant"]})


def rate(spec: Dict):
    """The rate a worker sends at (fractional) epoch e: the spec's rate and
    scale, the task's schedule, the warm-up of a synchronous method."""
    return lambda epoch: rate_at(spec["lr"], epoch, spec["epochs"], spec["scale"], spec["warmup"] or 0.0,
                                 spec["workers"])


def simulate_run(spec: Dict, work: Path) -> Dict:
    """One simulator run, in this process (a simulator pool's worker)."""
    import torch

    from hvd_dcasgd.algorithm.simulator import EventDriven, RoundRobin, simulate

    torch.set_num_threads(1)
    task = TASKS[spec["task"]]
    train, validation, test = task.data(work / "data")
    delay = RoundRobin() if spec["delay"] == "round-robin" else EventDriven.homogeneous(spec["workers"], JITTER)
    optimizer = None
    if spec["optimizer"] == "momentum":
        optimizer = lambda params: torch.optim.SGD(params, lr=rate(spec)(0.0), momentum=MOMENTUM)  # noqa: E731
    try:
        result = simulate(task.model, train, validation if spec["split"] == "validation" else test,
                          compensation=compensation_of(spec), workers=spec["workers"], epochs=spec["epochs"],
                          batch_size=task.batch_size, lr=rate(spec), delay=delay, seed=spec["seed"],
                          optimizer=optimizer)
    except HvdDcasgdError as error:
        if DIVERGED not in str(error):
            raise
        return diverged(spec, str(error))
    return {**spec, "final_error": result.final_error, "test_errors": result.test_errors,
            "updates": result.updates, "staleness": {str(s): n for s, n in sorted(result.staleness.items())}}


def diverged(spec: Dict, sentence: str) -> Dict:
    """The record of a run whose weights became NaN or Inf (the server refused
    a gradient holding them): a result, at chance, apart from accuracy."""
    return {**spec, "diverged": sentence.strip().splitlines()[-1], "final_error": CHANCE_ERROR, "test_errors": []}


def real_command(spec: Dict, out: Path, work: Path) -> List[str]:
    """The real job's command line: horovodrun (plain Horovod) or mpirun (this project, M+1 ranks)."""
    options = ["--task", spec["task"], "--epochs", spec["epochs"], "--lr", spec["lr"], "--scale", spec["scale"],
               "--seed", spec["seed"], "--step-time", spec["step_time"], "--seconds", spec["seconds"],
               "--straggler", spec["straggler"], "--evaluate-every", spec["evaluate_every"],
               "--cache", work / "data", "--out", out]
    options += ["--warmup", spec["warmup"]] if spec["warmup"] else []
    if spec["source"] == "horovodrun":
        binary = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        if binary is None:
            raise RuntimeError("horovodrun is not installed next to this Python (Horovod: .ci/setup.sh)")
        return [binary, "-np", str(spec["workers"]), "-H", f"localhost:{spec['workers']}", sys.executable,
                str(HERE / "train_mpi.py"), "--plain-horovod", *map(str, options)]
    options += ["--compensation", METHODS[spec["method"]].mode]
    options += ["--constant", spec["constant"]] if spec["constant"] is not None else []
    return mpirun(spec["workers"] + 1, HERE / "train_mpi.py", *options)


def real_run(spec: Dict, work: Path) -> Dict:
    """One timed real job; its curve of test error against seconds."""
    out = work / (key_of(spec).replace("/", "-") + ".json")
    out.unlink(missing_ok=True)  # left by an earlier, killed attempt
    cmd = real_command(spec, out, work)
    started = time.perf_counter()
    result = run_command(cmd, timeout=MPI_TIMEOUT, env=child_env())
    record = {**spec, "command": shlex.join(map(str, cmd)), "launch_seconds": time.perf_counter() - started}
    if result.returncode != 0 and DIVERGED in result.stdout:
        return diverged(record, next(line for line in result.stdout.splitlines() if DIVERGED in line))
    if result.returncode != 0 or not out.exists():
        tail = result.stdout.strip().splitlines()[-12:]
        return {**record, "failed": tail + ([f"(killed after {MPI_TIMEOUT} s)"] if result.timed_out else [])}
    return {**record, **json.loads(out.read_text())}


# --- provenance ---------------------------------------------------------------
def git_state(ignore: List[Path]) -> Dict:
    """The commit and whether the tree is clean (changes under ``ignore``,
    the records and the page being written, do not count)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        changed = [line[3:] for line in git("status", "--porcelain").splitlines()]
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "clean": False}
    skipped = [str(p.resolve().relative_to(ROOT)) for p in ignore if p.resolve().is_relative_to(ROOT)]
    dirty = [path for path in changed if not any(path.strip('"').startswith(s) for s in skipped)]
    return {"commit": commit, "clean": not dirty}


def mixed_commits(evidence: Dict, commit: Optional[str]) -> List[str]:
    """The commits of the recorded sessions other than ``commit``."""
    return sorted({s.get("commit") or "unknown" for s in evidence["sessions"]} - {commit})


# --- running the plan ---------------------------------------------------------
class Recorder:
    """evidence.json, rewritten after every finished run with this session's
    entry (start time, commit, clean tree, command, machine, load, time so
    far), so that a killed command loses only the runs it was in the middle of."""

    def __init__(self, path: Path, evidence: Dict, command: str, study: str, provenance: Dict):
        self.path, self.evidence, self.started = path, evidence, time.time()
        self.lock = threading.Lock()
        self.progress: Optional[tqdm] = None
        start = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.session = {"started": start, **provenance, "study": study, "command": command, "machine": machine(),
                        "cores": os.cpu_count(), "load_before": list(os.getloadavg()), "load_after": None,
                        "seconds": 0.0, "runs": 0}

    def add(self, record: Dict) -> None:
        with self.lock:
            if not self.session["runs"]:
                self.evidence["sessions"].append(self.session)
            others = [r for r in self.evidence["records"] if r["key"] != record["key"]]
            self.evidence["records"] = others + [record]
            seconds = time.time() - self.started
            self.session.update(runs=self.session["runs"] + 1, seconds=seconds, load_after=list(os.getloadavg()))
            save(self.path, self.evidence)
            outcome = f"failed: {record['failed'][-1] if record['failed'] else '?'}" if "failed" in record else "done"
            line = f"  [{self.session['runs']}] {record['key']}: {outcome} ({seconds:.0f} s)"
            if self.progress is not None:
                self.progress.update(1)
                self.progress.write(line, file=sys.stdout)
            else:
                print(line, flush=True)


def todo(scale: Scale, evidence: Dict, study: str, attempted=frozenset()) -> List:
    done = succeeded(evidence)
    return [run for run in plan(scale, evidence["records"], study) if run.key not in done and run.key not in attempted]


def run_all(scale: Scale, recorder: Recorder, work: Path, jobs: int, study: str) -> None:
    """Wave after wave, until a plan made from the records so far has nothing
    left to run: simulator runs on ``jobs`` processes (each a fresh MPI
    singleton, a few runs each: ``multiprocessing.Pool`` replaces a worker
    after ``maxtasksperchild`` runs), real jobs one at a time."""
    attempted = set()
    with tqdm(desc=f"{study} study", unit="run", file=sys.stderr, dynamic_ncols=True) as progress:
        recorder.progress = progress
        while True:
            ready = todo(scale, recorder.evidence, study, attempted)
            if not ready:
                break
            attempted.update(run.key for run in ready)
            progress.total = (progress.total or 0) + len(ready)
            progress.refresh()
            for run in ready:
                if run.spec["source"] != "simulator":
                    recorder.add(execute(run.spec, work))
            simulated = [run.spec for run in ready if run.spec["source"] == "simulator"]
            if simulated:
                with get_context("spawn").Pool(jobs, maxtasksperchild=8) as pool:
                    for record in pool.imap_unordered(partial(execute, work=work), simulated):
                        recorder.add(record)
        recorder.progress = None


def machine() -> str:
    model = platform.processor()
    if Path("/proc/cpuinfo").exists():
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), model)
    return f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the evidence of docs/results/PLAN.md, resumably.")
    parser.add_argument("--scale", choices=sorted(SCALES), default="standard",
                        help="standard (the study), quick (for trying things) or tiny (the tests)")
    parser.add_argument("--study", choices=("accuracy", "time"), default="accuracy",
                        help="accuracy (the simulator; first) or time (real jobs; needs the accuracy study)")
    parser.add_argument("--out", default="docs", help="RESULTS.md here, plots and evidence.json in OUT/results")
    parser.add_argument("--work", default="build/evidence", help="data cache and per-run files")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulator processes")
    parser.add_argument("--allow-mixed-commits", action="store_true",
                        help="add to records of another commit (the page says so)")
    parser.add_argument("--report", action=argparse.BooleanOptionalAction, default=True,
                        help="write RESULTS.md and the plots afterwards (default: yes)")
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.work)
    path = out / "results" / "evidence.json"
    evidence = load(path) if path.exists() else empty(args.scale)
    if evidence["scale"] != args.scale:
        parser.error(f"{path} holds a {evidence['scale']}-scale study; give another --out to run at {args.scale} scale")
    scale = SCALES[args.scale]
    provenance = git_state([out, work])
    runs = todo(scale, evidence, args.study)
    done = succeeded(evidence)
    print(f"{len(done)} runs recorded already (skipped); {len(runs)} to run now (the runs that need tuned values "
          "are planned once their tuning is recorded)", flush=True)
    if runs:
        others = mixed_commits(evidence, provenance["commit"])
        if others and not args.allow_mixed_commits:
            parser.error(f"{path} holds records of commit {', '.join(others)}, and this tree is at "
                         f"{provenance['commit']}: one study is one commit; give another --out, or "
                         "--allow-mixed-commits to add to it anyway (the page then says so)")
        if not provenance["clean"]:
            print("warning: the tree has uncommitted changes; this session is recorded as not clean", flush=True)
        command = " ".join(["python benchmarks/evidence/run.py", *map(shlex.quote, sys.argv[1:])])
        recorder = Recorder(path, evidence, command, args.study, provenance)
        path.parent.mkdir(parents=True, exist_ok=True)
        TASKS[scale.task].data(work / "data")
        run_all(scale, recorder, work, args.jobs, args.study)
        print(f"ran {recorder.session['runs']} runs in {recorder.session['seconds'] / 60:.1f} min", flush=True)
    if args.report:
        from report import default_readme, write_report

        names = write_report(out, default_readme(out))
        print(f"wrote {out / 'RESULTS.md'} and {len(names)} plots", flush=True)


if __name__ == "__main__":
    main()

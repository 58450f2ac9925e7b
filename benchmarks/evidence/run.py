"""Run the evidence of ``docs/results/PLAN.md``: every planned run not yet
recorded, wave after wave, then the page.

    python benchmarks/evidence/run.py --jobs 2           # the accuracy study, standard scale (about 85 min on 2 cores)
    python benchmarks/evidence/run.py --scale quick --out build/quick   # for trying things: never results

Resumable: the records are kept in ``OUT/results/evidence.json``, rewritten
after every finished run, and a run already recorded is not run again.  Every
session records its start time (UTC), the commit and whether the tree was
clean; a session on another commit than the records' is refused unless
``--allow-mixed-commits`` is given (the page then says so).  Simulator runs go
on ``--jobs`` processes.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
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
sys.path[:0] = [str(HERE), str(ROOT)]  # tasks and plan, and this tree's package: here and in the simulator

from tqdm import tqdm  # noqa: E402

from hvd_dcasgd.common.errors import HvdDcasgdError  # noqa: E402
from plan import CHANCE_ERROR, JITTER, METHODS, OUT_OF_THE_BOX, SCALES, Scale, key_of, plan, settings_of  # noqa: E402
from records import empty, load, save, succeeded  # noqa: E402
from tasks import TASKS, rate_at  # noqa: E402

DIVERGED = "holds NaN or Inf"  # what the server's refusal of a non-finite gradient says


# --- a run --------------------------------------------------------------------
def execute(spec: Dict, work: Path) -> Dict:
    """Run what ``spec`` describes; its record: ``key``, ``spec``'s fields and
    the results, or ``failed`` with the last lines of the error."""
    try:
        record = simulate_run(spec, work)
    except Exception:
        record = {**spec, "failed": traceback.format_exc().strip().splitlines()[-12:]}
    return {"key": key_of(spec), **record}


def compensation_of(spec: Dict):
    """The server's ``Compensation`` for ``spec``'s method: its mode, and only
    the settings that mode uses (the tuned ones from the record, the fixed
    ones from the method: the paper's DC-ASGD-a is bound = inf)."""
    from hvd_dcasgd.algorithm.compensation import Compensation

    return Compensation(METHODS[spec["method"]].mode, **settings_of(spec))


def rate(spec: Dict):
    """The rate a worker sends at (fractional) epoch e: the spec's rate and
    scale, the task's schedule, the warm-up of a synchronous method."""
    return lambda epoch: rate_at(spec["lr"], epoch, spec["epochs"], spec["scale"], spec["warmup"] or 0.0,
                                 spec["workers"])


def simulate_run(spec: Dict, work: Path) -> Dict:
    """One simulator run, in this process (a simulator pool's worker)."""
    import torch

    from hvd_dcasgd.algorithm.simulator import EventDriven, simulate

    torch.set_num_threads(1)
    task = TASKS[spec["task"]]
    train, validation, test = task.data(work / "data")
    try:
        result = simulate(task.model, train, validation if spec["split"] == "validation" else test,
                          compensation=compensation_of(spec), workers=spec["workers"], epochs=spec["epochs"],
                          batch_size=task.batch_size, lr=rate(spec), seed=spec["seed"],
                          delay=EventDriven.homogeneous(spec["workers"], JITTER))
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


def package_defaults() -> List[str]:
    """Where the package's defaults differ from the out-of-the-box values the
    plan fixed (``plan.OUT_OF_THE_BOX``): one sentence each."""
    from hvd_dcasgd.algorithm.compensation import Compensation

    found = []
    for method, settings in OUT_OF_THE_BOX.items():
        defaults = Compensation(METHODS[method].mode)
        for name, value in settings:
            if getattr(defaults, name, None) != value:
                found.append(f"{METHODS[method].mode}'s default {name} is {getattr(defaults, name, None)}, "
                             f"the plan's out-of-the-box value {value}")
    return found


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


def refuse_mixed_commits(parser: argparse.ArgumentParser, path: Path, evidence: Dict, commit: Optional[str],
                         allowed: bool) -> None:
    """The parser's error where ``path`` holds records of another commit than
    ``commit`` and adding to them was not ``allowed``: one study is one commit."""
    others = mixed_commits(evidence, commit)
    if others and not allowed:
        parser.error(f"{path} holds records of commit {', '.join(others)}, and this tree is at "
                     f"{commit}: one study is one commit; give another --out, or "
                     "--allow-mixed-commits to add to it anyway (the page then says so)")


# --- running the plan ---------------------------------------------------------
class Recorder:
    """evidence.json, rewritten after every finished run with this session's
    entry (start time, commit, clean tree, command, machine, load, time so
    far), so that a killed command loses only the runs it was in the middle of."""

    def __init__(self, path: Path, evidence: Dict, command: str, provenance: Dict):
        self.path, self.evidence, self.started = path, evidence, time.time()
        self.lock = threading.Lock()
        self.progress: Optional[tqdm] = None
        start = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.session = {"started": start, **provenance, "command": command, "machine": machine(),
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


def todo(scale: Scale, evidence: Dict, attempted=frozenset()) -> List:
    done = succeeded(evidence)
    return [run for run in plan(scale, evidence["records"]) if run.key not in done and run.key not in attempted]


def run_all(scale: Scale, recorder: Recorder, work: Path, jobs: int) -> None:
    """Wave after wave, until a plan made from the records so far has nothing
    left to run, on ``jobs`` processes (each a fresh MPI singleton, a few runs
    each: ``multiprocessing.Pool`` replaces a worker after
    ``maxtasksperchild`` runs)."""
    attempted = set()
    with tqdm(desc="accuracy study", unit="run", file=sys.stderr, dynamic_ncols=True) as progress:
        recorder.progress = progress
        while True:
            ready = todo(scale, recorder.evidence, attempted)
            if not ready:
                break
            attempted.update(run.key for run in ready)
            progress.total = (progress.total or 0) + len(ready)
            progress.refresh()
            with get_context("spawn").Pool(min(jobs, len(ready)), maxtasksperchild=8) as pool:
                for record in pool.imap_unordered(partial(execute, work=work), [run.spec for run in ready]):
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
    runs = todo(scale, evidence)
    done = succeeded(evidence)
    print(f"{len(done)} runs recorded already (skipped); {len(runs)} to run now (the runs that need tuned values "
          "are planned once their tuning is recorded)", flush=True)
    if runs:
        refuse_mixed_commits(parser, path, evidence, provenance["commit"], args.allow_mixed_commits)
        for sentence in package_defaults():
            print(f"warning: {sentence}; the out-of-the-box cells run the plan's", flush=True)
        if not provenance["clean"]:
            print("warning: the tree has uncommitted changes; this session is recorded as not clean", flush=True)
        command = " ".join(["python benchmarks/evidence/run.py", *map(shlex.quote, sys.argv[1:])])
        recorder = Recorder(path, evidence, command, provenance)
        path.parent.mkdir(parents=True, exist_ok=True)
        TASKS[scale.task].data(work / "data")
        run_all(scale, recorder, work, args.jobs)
        print(f"ran {recorder.session['runs']} runs in {recorder.session['seconds'] / 60:.1f} min", flush=True)
    if args.report:
        from report import default_readme, write_report

        names = write_report(out, default_readme(out))
        print(f"wrote {out / 'RESULTS.md'} and {len(names)} plots", flush=True)


if __name__ == "__main__":
    main()

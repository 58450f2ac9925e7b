"""Run the time-to-accuracy study (:mod:`timing`): the synchronous baseline's
untimed runs, which choose the target, then every timed run not yet
recorded, one real job at a time.

    python benchmarks/evidence/time_run.py                # the study (about 3 h on 2 cores)
    python benchmarks/evidence/time_run.py --scale tiny --out build/time-tiny   # the tests' size: never results

Resumable, as ``run.py`` is: the records are kept in
``OUT/results/time/evidence.json``, rewritten after every finished run, and
a run already recorded is not run again, so a sitting may be stopped between
runs (Ctrl-C or SIGTERM ends the job under way, unrecorded, and loses nothing
else).  Every sitting records its start
time (UTC), the commit and whether the tree was clean; one on another commit
than the records' is refused unless ``--allow-mixed-commits`` is given.

The target, once chosen, is kept in the records: a later sitting runs
against the same one.  The methods' points come from the accuracy study's
records (``--accuracy``, by default this tree's docs/results/evidence.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(ROOT)]

from jobs import horovodrun, mpirun, own_env  # noqa: E402
from records import save  # noqa: E402
from run import Recorder, execute, git_state, refuse_mixed_commits  # noqa: E402
from tasks import TASKS  # noqa: E402
from timing import (HOROVOD_RECIPE, SCALES, TimeScale, chosen_points, key_of, options, target_from,  # noqa: E402
                    timed_specs, untimed_specs)

TRAIN = HERE / "train_mpi.py"
#: Seconds a timed job may take beyond its training budget (start-up, evaluation) before it counts as hung.
GRACE = 300.0


def empty(scale: str) -> Dict:
    return {"scale": scale, "sessions": [], "untimed": [], "targets": {}, "records": []}


def load(path: Path) -> Dict:
    data = json.loads(Path(path).read_text())
    return {**empty(data["scale"]), **data}


def command(spec: Dict, work: Path, out: Path) -> List[str]:
    """The timed run's command line: horovodrun (plain Horovod, M ranks) or mpirun (this project, M+1 ranks)."""
    given = options(spec, cache=str(work / "data"), out=str(out))
    if spec["source"] == "horovodrun":
        workers = spec["workers"]
        return [horovodrun(), "-np", str(workers), "-H", f"localhost:{workers}", sys.executable, str(TRAIN),
                "--plain-horovod", *given]
    return [str(part) for part in mpirun(spec["workers"] + 1, TRAIN, *given)]


def timed_run(spec: Dict, work: Path) -> Dict:
    """One timed real job: its record (the spec, the command, the curve up
    to the target, the final error, every worker's samples and seconds), or
    ``failed`` with the last lines it printed."""
    out = work / "timed" / f"{hashlib.sha1(key_of(spec).encode()).hexdigest()[:16]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = command(spec, work, out)
    env = own_env(HOROVOD_RECIPE if spec["source"] == "horovodrun" else {}, varied=HOROVOD_RECIPE)
    record = {"key": key_of(spec), **spec, "command": shlex.join(cmd), "environment": dict(
        HOROVOD_RECIPE if spec["source"] == "horovodrun" else {})}
    started = time.perf_counter()
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)  # its own process group: a hung job is ended whole
    try:
        printed, _ = job.communicate(timeout=spec["seconds"] + GRACE)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        printed, _ = job.communicate()
        return {**record, "failed": printed.splitlines()[-20:] + [f"(killed after {spec['seconds'] + GRACE:g} s)"]}
    except BaseException:  # the sitting is stopped (Ctrl-C, SIGTERM): the job under way goes with it, unrecorded
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        raise
    record["launch_seconds"] = time.perf_counter() - started
    if job.returncode != 0 or not out.exists():
        return {**record, "failed": printed.splitlines()[-20:] + [f"(exit status {job.returncode})"]}
    return {**record, **json.loads(out.read_text())}


def choose_targets(scale: TimeScale, evidence: Dict, points, work: Path, recorder_path: Path) -> Dict[int, float]:
    """The target at each M: chosen once from the untimed runs (run now if
    missing) and kept in the records."""
    if evidence["targets"]:
        return {int(w): t for w, t in evidence["targets"].items()}
    specs = untimed_specs(scale, points)
    print(f"{len(specs)} untimed runs of the synchronous baseline (the simulator) choose the target ...", flush=True)
    # in a process of their own: this one starts the timed jobs' mpirun and stays outside MPI
    with get_context("spawn").Pool(1) as pool:
        for record in pool.imap(partial(execute, work=work), specs):
            if "failed" in record:
                sys.exit("an untimed run failed, so no target can be chosen:\n" + "\n".join(record["failed"]))
            evidence["untimed"].append(record)
    targets = {w: target_from([r["final_error"] for r in evidence["untimed"] if r["workers"] == w])
               for w in scale.workers}
    evidence["targets"] = {str(w): t for w, t in targets.items()}
    save(recorder_path, evidence)
    return targets


def main() -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # stop a sitting as Ctrl-C does
    parser = argparse.ArgumentParser(description="Run the time-to-accuracy study, resumably.")
    parser.add_argument("--scale", choices=sorted(SCALES), default="standard",
                        help="standard (the study) or tiny (the tests)")
    parser.add_argument("--out", default="docs", help="the records in OUT/results/time/evidence.json")
    parser.add_argument("--work", default="build/evidence", help="data cache and per-run files")
    parser.add_argument("--accuracy", default=str(ROOT / "docs" / "results" / "evidence.json"),
                        help="the accuracy study's records, whose choices the methods run at")
    parser.add_argument("--allow-mixed-commits", action="store_true",
                        help="add to records of another commit (the page then says so)")
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.work)
    path = out / "results" / "time" / "evidence.json"
    evidence = load(path) if path.exists() else empty(args.scale)
    if evidence["scale"] != args.scale:
        parser.error(f"{path} holds a {evidence['scale']}-scale study; give another --out to run at {args.scale} scale")
    scale = SCALES[args.scale]
    accuracy = [] if scale.points is not None else json.loads(Path(args.accuracy).read_text())["records"]
    points = chosen_points(scale, accuracy)
    provenance = git_state([out, work])
    refuse_mixed_commits(parser, path, evidence, provenance["commit"], args.allow_mixed_commits)
    if not provenance["clean"]:
        print("warning: the tree has uncommitted changes; this sitting is recorded as not clean", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    TASKS[scale.task].data(work / "data")
    targets = choose_targets(scale, evidence, points, work, path)
    print("targets: " + ", ".join(f"M={w}: {t:.1%}" for w, t in targets.items()), flush=True)
    done = {r["key"] for r in evidence["records"] if "failed" not in r}
    runs = [spec for spec in timed_specs(scale, points, targets) if key_of(spec) not in done]
    print(f"{len(done)} timed runs recorded already (skipped); {len(runs)} to run now", flush=True)
    if runs:
        command_line = " ".join(["python benchmarks/evidence/time_run.py", *map(shlex.quote, sys.argv[1:])])
        recorder = Recorder(path, evidence, command_line, provenance)
        for spec in runs:
            recorder.add(timed_run(spec, work))
        print(f"ran {recorder.session['runs']} runs in {recorder.session['seconds'] / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()

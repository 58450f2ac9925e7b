"""(h) Whether a synchronous baseline runs at its machine's pace: images/s
per worker against the bound the step padding allows.

The time study compares methods whose every step is padded to
``--step-time`` seconds (``benchmarks/evidence/train_mpi.py``): a worker can
then train at most ``batch size / step time`` images/s, and a synchronous
method that trains much less is measuring its processes' contention for the
cores, not the method.  This benchmark runs the study's script with no
straggler, for each number of workers M, under each launch configuration:

* plain Horovod under ``horovodrun -np M -H localhost:M`` (its own script,
  ``import horovod.torch``), as launched by default and with the settings of
  a recipe (``HOROVOD`` below): each adds one setting to the one before, so
  that each row says what that setting bought;
* this project's ``sync`` under ``mpirun --oversubscribe -np M+1`` (rank 0
  the server) with Open MPI's default components (``jobs.mpirun``, as the
  tests start their jobs; ``hvd-dcasgd-run`` also oversubscribes where the
  ranks outnumber the cores), as launched and with one setting: Open MPI
  yields a waiting rank's core by itself when oversubscribed, so the setting
  is expected to change nothing.

Each run prints the images/s of every worker (its samples over its own
training time); the table gives their mean and its ratio to the bound, each
configuration's figures from the same interleaved rounds.

    python benchmarks/bench_sync_pace.py [--workers 2 4 8] [--seconds 12] [--rounds 1] [--markdown docs/PERFORMANCE.md]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import docs_section
from jobs import ROOT, horovodrun, mpirun, own_env

SCRIPT = ROOT / "benchmarks" / "evidence" / "train_mpi.py"
sys.path.insert(0, str(SCRIPT.parent))
from tasks import TASKS  # noqa: E402

#: Open MPI runs a rank that waits in MPI as a busy poll unless told to yield
#: the core (it tells itself so only when a host has more ranks than slots,
#: which ``-H localhost:M`` never has).
YIELD = {"OMPI_MCA_mpi_yield_when_idle": "1"}

#: Horovod's configurations, each the one before plus one setting: (name, variables).
HOROVOD = (
    ("Horovod, as launched", {}),
    ("+ Open MPI's yield when idle", YIELD),
    ("+ cycle time 5 ms", {**YIELD, "HOROVOD_CYCLE_TIME": "5"}),
    ("+ no MPI threads", {**YIELD, "HOROVOD_CYCLE_TIME": "5", "HOROVOD_MPI_THREADS_DISABLE": "1"}),
)
#: This project's synchronous schedule: (name, variables).
SYNC = (
    ("`sync`, as launched", {}),
    ("`sync` + yield when idle", YIELD),
)


def command(kind: str, workers: int, args: argparse.Namespace, out: Path) -> List[str]:
    """The study's script for ``workers`` workers: under horovodrun (``horovod``) or this project (``sync``)."""
    options = ["--task", args.task, "--lr", "0.05", "--step-time", args.step_time, "--seconds", args.seconds,
               "--evaluate-every", 1e9, "--cache", args.cache, "--out", out]
    if kind == "horovod":
        return [horovodrun(), "-np", str(workers), "-H", f"localhost:{workers}", sys.executable, str(SCRIPT),
                "--plain-horovod", *map(str, options)]
    return [str(c) for c in mpirun(workers + 1, SCRIPT, "--compensation", "sync", *options)]


def environment(variables: Dict[str, str]) -> Dict[str, str]:
    """This environment without the settings any case varies (so that a
    row has only its own) or the package's own variables, plus ``variables``."""
    return own_env(variables, varied={name for _, case in (*HOROVOD, *SYNC) for name in case})


def run_once(kind: str, variables: Dict[str, str], workers: int,
             args: argparse.Namespace) -> List[Tuple[float, float]]:
    """One run: each worker's (samples, seconds of training)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "run.json"
        env = environment(variables)
        cmd = command(kind, workers, args, out)
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            sys.exit(f"{' '.join(cmd)} took over {args.timeout:g} s")
        if done.returncode != 0 or not out.exists():
            sys.exit(f"{' '.join(cmd)} failed (status {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return [(samples, seconds) for samples, seconds in json.loads(out.read_text())["per_worker"]]


def cases() -> List[Tuple[str, str, Dict[str, str]]]:
    return [("horovod", name, v) for name, v in HOROVOD] + [("sync", name, v) for name, v in SYNC]


def launch(args: argparse.Namespace) -> None:
    bound = TASKS[args.task].batch_size / args.step_time
    runs: Dict[Tuple[int, str], List[float]] = {}
    for _, workers, (kind, name, variables) in itertools.product(range(args.rounds), args.workers, cases()):
        rates = [samples / seconds for samples, seconds in run_once(kind, variables, workers, args)]
        runs.setdefault((workers, name), []).append(statistics.fmean(rates))
        print(f"  M={workers} {name}: images/s per worker {', '.join(f'{r:.0f}' for r in rates)}", flush=True)
    rounds = f", median of {args.rounds} interleaved rounds" if args.rounds > 1 else ""
    print(f"sync pace: {args.task}, batch {TASKS[args.task].batch_size}, steps padded to {args.step_time:g} s "
          f"(bound {bound:.0f} images/s per worker), {args.seconds:g} s of training per run{rounds}")
    rows = []
    for workers, (_, name, variables) in itertools.product(args.workers, cases()):
        rate = statistics.median(runs[workers, name])
        print(f"  M={workers:2d} {name:32s} {rate:6.1f} images/s per worker  {rate / bound:4.2f} of the bound")
        settings = " ".join(f"`{k}={v}`" for k, v in variables.items()) or "none"
        rows.append([str(workers), name, settings, f"{rate:.1f}", f"{rate / bound:.2f}"])
    if args.markdown:
        summary = (f"The time study's script (`benchmarks/evidence/train_mpi.py`), {args.task}, batch "
                   f"{TASKS[args.task].batch_size}, every step padded to {args.step_time:g} s: a worker can train "
                   f"at most {bound:.0f} images/s. No straggler, {args.seconds:g} s of training per run, "
                   f"{os.cpu_count()} cores{rounds}. Each Horovod row adds one setting to the row above it.")
        header = ["M", "configuration", "settings", "images/s per worker (mean of the workers)",
                  "fraction of the bound"]
        docs_section.write(args.markdown, "bench_sync_pace.py", docs_section.command("bench_sync_pace.py", sys.argv[1:]),
                           [summary, "", *docs_section.table(header, rows)])


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8], help="the numbers of workers M")
    parser.add_argument("--task", default="fashion", choices=sorted(TASKS))
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=12.0, help="training time of each run")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cache", default=str(ROOT / "build" / "evidence" / "data"))
    parser.add_argument("--timeout", type=float, default=300, help="seconds for each run")
    parser.add_argument("--markdown", metavar="PATH", help="also write this benchmark's section of PATH")
    launch(parser.parse_args(argv))


if __name__ == "__main__":
    main()

"""``hvd-dcasgd-run``: start S parameter servers (one unless ``--servers``) and N workers under the MPI it finds.

    hvd-dcasgd-run -n 4 examples/train_digits.py --epochs 5

runs ``mpirun`` (Open MPI) or ``mpiexec`` (MPICH's Hydra) with N+S ranks and the
options this project needs there: the one-sided component, asynchronous
progress, oversubscription, running as root, and the environment --
``HVD_DCASGD_GPUS`` from ``--gpus`` among it, by which each rank's
``hvd.init()`` places it on a GPU of its node. ``docs/LAUNCH.md`` is the
reference.  This module is the command line; what it finds here is
:mod:`.probe`'s, the command it builds :mod:`.command`'s.  The standard
library, and the package's settings table.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from .command import LaunchError, build, parse_gpus
from .probe import probe

PROG = "hvd-dcasgd-run"
#: What this launcher does with the signals that stop a job: the first one
#: reaches the ranks at once as SIGUSR1 (mpirun forwards SIGUSR1 straight
#: away), and so do later ones, unless HVD_DCASGD_STOP_GRACE seconds have passed.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")


def parser() -> argparse.ArgumentParser:
    """The command-line interface; everything after the script goes to the script."""
    cli = argparse.ArgumentParser(
        prog=PROG,
        description="Run a DC-ASGD training script as S parameter servers (ranks 0..S-1; one by default) + N "
                    "workers under MPI.",
        epilog="Example: hvd-dcasgd-run -n 4 examples/train_digits.py --epochs 5. Reference: docs/LAUNCH.md.",
    )
    cli.add_argument("-n", "--workers", type=int, required=True, help="number of workers; N+S ranks are started")
    cli.add_argument("--servers", type=int, default=None,
                     help="number of parameter servers S, each holding a slice of the parameters (default: "
                          "HVD_DCASGD_SERVERS, else 1); on several hosts they are spread one per host first")
    where = cli.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", help="hosts and slots, host[:slots],...; the server runs on the first")
    where.add_argument("--hostfile", help="a hostfile in the syntax of the MPI found (Open MPI: `host slots=N`; "
                                          "MPICH: `host:N`); the server runs on the first host")
    cli.add_argument("--oversubscribe", action="store_true",
                     help="allow more ranks than slots (automatic on one node with more ranks than cores)")
    cli.add_argument("--gpus", default=None,
                     help="auto, none, keep, or GPU ids 0,1,...; every rank gets it as HVD_DCASGD_GPUS (default: "
                          "the caller's HVD_DCASGD_GPUS, else auto), and hvd.init() places each rank: on each node "
                          "the servers take the first GPUs, the workers the others")
    cli.add_argument("--python", default=sys.executable,
                     help="the Python interpreter of every rank (default: the one running this launcher)")
    cli.add_argument("--mpirun", help="the MPI launcher to use (default: mpirun, else mpiexec, on PATH)")
    cli.add_argument("--mpi-arg", action="append", default=[], metavar="ARGS",
                     help="extra arguments for mpirun, split like a shell, e.g. --mpi-arg='--bind-to none' "
                          "(repeatable)")
    cli.add_argument("--dry-run", action="store_true", help="print the command and run nothing")
    cli.add_argument("-v", "--verbose", action="store_true", help="print the command and why, then run it")
    cli.add_argument("script", help="the training script")
    cli.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return cli


def launch(argv: Sequence[str]) -> int:
    """Parse, check, build the command; print it (dry run) or run it."""
    from ..common.config import check_environment

    args = parser().parse_args(argv)
    problems = check_environment(os.environ)
    if problems:
        raise LaunchError(" ".join(p.removeprefix("hvd_dcasgd: ") for p in problems))
    if args.workers < 1:
        raise LaunchError(f"-n/--workers must be at least 1 (got {args.workers}).")
    if not Path(args.script).is_file():
        raise LaunchError(f"the training script {args.script} does not exist.")
    parse_gpus(args.gpus)
    plan = build(args, probe(args, os.environ), os.environ)
    for note in plan.notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    if args.verbose:
        for reason in plan.reasons:
            print(f"{PROG}: {reason}", file=sys.stderr)
    if args.dry_run:
        print(shlex.join(plan.command))
        return 0
    if args.verbose:
        print(f"{PROG}: {shlex.join(plan.command)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    return run_relaying_stops(plan.command)


def run_relaying_stops(command: Sequence[str]) -> int:
    """Run the MPI launcher and return its exit status.  The first SIGTERM,
    SIGINT or SIGUSR1 this process gets is sent to it as SIGUSR1, which it
    forwards to every rank at once: the ranks stop after their current step,
    the server writes a checkpoint, and the job ends with status 75.  (Told
    SIGTERM itself, Open MPI's mpirun would first wait, then give the ranks
    ``odls_base_sigkill_timeout`` seconds.)  Later ones are relayed the same
    way (the ranks only count them: the job stops once), unless one comes
    ``HVD_DCASGD_STOP_GRACE`` seconds or more after the first: that one goes
    on as it is, and mpirun ends the job at once."""
    import signal
    import time

    from ..common.config import resolve

    grace = resolve("HVD_DCASGD_STOP_GRACE") or None
    child = subprocess.Popen(list(command))
    first: List[float] = []  # when the first stop signal came

    def relay(number, frame):
        now = time.monotonic()
        if not first:
            first.append(now)
        at_once = grace is not None and now - first[0] >= grace
        child.send_signal(number if at_once else signal.SIGUSR1)

    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), relay)
    status = child.wait()
    return 128 - status if status < 0 else status


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``hvd-dcasgd-run``: the MPI job's exit status, or 2 with one sentence on a bad launch."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return launch(argv)
    except LaunchError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: cannot start {exc.filename or 'the command'} ({exc.strerror}).", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""What admitting a worker of another launch costs the workers already running.

A worker started by a separate launch joins a running job through MPI's
dynamic processes: it opens a port, publishes it under a name at Open MPI's
``ompi-server`` and waits in ``Accept``; the server looks the name up, then
``Connect``s, ``Merge``s the two sides into one communicator and creates the
joiner's windows over it (two, as a job's channel has).  Each of those calls
is collective between the server and the joiner and blocks its caller.

This script measures, in one run, each way of placing that handshake:

* ``loop``: the serving loop runs the handshake itself between two polls, at
  thread level ``serialized`` with the one-sided component ``pt2pt`` (the
  one Open MPI 4.1 offers over a merged communicator at that level): the
  running workers' requests wait for as long as the handshake takes;
* ``thread``: a helper thread runs the handshake while the serving loop goes
  on, at thread level ``multiple`` with the one-sided component ``ucx``
  (``pt2pt`` refuses ``multiple``; the default selection and ``rdma`` cannot
  open a window over a merged communicator).

The running job is a server and one worker.  The worker pushes (an atomic
add to the server's window), waits for the serving loop's reply (a word the
loop writes in its own memory when it finds the push), and steps for a
millisecond, before, during and after the join.  Printed per placement: the
handshake's steps, and the worker's waits from push to reply -- median, and
the largest outside and during the handshake.  On a loaded machine the
largest wait outside the handshake is the noise to compare with.  (One-sided
operations themselves keep moving while the server blocks in the handshake,
which makes progress; the serving loop's answers do not.)

    python benchmarks/join_handshake.py [--placements loop thread] [--rounds 3] [--markdown docs/PERFORMANCE.md]

Needs Open MPI's ``mpirun`` and ``ompi-server``; about 10 s a round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent))  # the package, where it is not installed

SERVICE = "hvd_dcasgd-join-handshake-{}"
PLACEMENTS = {
    "loop": {"osc": "pt2pt", "level": "serialized"},
    "thread": {"osc": "ucx", "level": "multiple"},
}


def _lookup(mpi, name: str, deadline: float) -> str:
    while True:
        try:
            return mpi.Lookup_name(name)
        except mpi.Exception:
            if time.monotonic() > deadline:
                raise SystemExit(f"join_handshake: no joiner published {name!r} within the deadline")
            time.sleep(0.01)


def _handshake(mpi, port: str) -> dict:
    """The server's side: connect, merge, two windows; each step's seconds and the span."""
    start = time.perf_counter()
    inter = mpi.COMM_SELF.Connect(port)
    connected = time.perf_counter()
    merged = inter.Merge(high=False)
    merged_at = time.perf_counter()
    windows = [mpi.Win.Allocate(64, 8, comm=merged) for _ in range(2)]
    end = time.perf_counter()
    merged.Barrier()  # the joiner has its windows too
    for win in windows:
        win.Free()
    merged.Free()
    inter.Disconnect()
    return {"connect": connected - start, "merge": merged_at - connected, "windows": end - merged_at,
            "start": start, "end": end}


def job(placement: str, out: Path) -> None:
    """The running job: rank 0 serves, rank 1 pushes and waits for each reply."""
    from mpi4py import MPI
    import numpy as np

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    win = MPI.Win.Allocate(3 * 8 if rank == 0 else 0, 8, comm=comm)  # words: pushed, replied, stop
    win.Lock_all(MPI.MODE_NOCHECK)
    if rank == 0:
        words = np.frombuffer(win.tomemory(), dtype=np.int64)
        words[:] = 0
        win.Sync()
    comm.Barrier()
    if rank == 0:
        name = os.environ["JOIN_NAME"]

        def serve_once() -> None:
            """One turn of a serving loop: answer a push it finds (its own memory, synchronised)."""
            win.Sync()
            if words[0] > words[1]:
                words[1] = words[0]
            win.Sync()
            MPI.COMM_SELF.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)  # progress, as the serving loop's poll makes
            time.sleep(1e-4)

        def serve_for(seconds: float) -> None:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                serve_once()

        report: dict = {}
        serve_for(0.3)
        if placement == "loop":
            found = _lookup(MPI, name, time.monotonic() + 120)  # a miss costs a round trip: no pause to speak of
            report = _handshake(MPI, found)
        else:
            done = threading.Event()

            def admit() -> None:
                report.update(_handshake(MPI, _lookup(MPI, name, time.monotonic() + 120)))
                done.set()

            helper = threading.Thread(target=admit, name="join handshake")
            helper.start()
            while not done.is_set():  # the serving loop goes on
                serve_once()
            helper.join()
        serve_for(0.3)
        words[2] = 1  # the worker stops
        win.Sync()
        while words[0] > words[1] or not words[0]:
            serve_once()
        serve_for(0.05)
        comm.send(report, dest=1)
    else:
        one, result = np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
        samples = []
        while True:
            start = time.perf_counter()
            win.Fetch_and_op(one, result, 0, 0, MPI.SUM)  # push
            win.Flush(0)
            pushed = int(result[0]) + 1
            while True:  # wait for the reply
                win.Fetch_and_op(one, result, 0, 1, MPI.NO_OP)
                win.Flush(0)
                if result[0] >= pushed:
                    break
            samples.append((start, time.perf_counter() - start))
            win.Fetch_and_op(one, result, 0, 2, MPI.NO_OP)
            win.Flush(0)
            if result[0]:
                break
            time.sleep(1e-3)  # the worker's step
        report = comm.recv(source=0)
        during = [s for t, s in samples if report["start"] <= t + s and t <= report["end"]]
        outside = [s for t, s in samples if not (report["start"] <= t + s and t <= report["end"])]
        out.write_text(json.dumps({**{k: report[k] for k in ("connect", "merge", "windows")},
                                   "median": statistics.median(s for _, s in samples),
                                   "max_outside": max(outside), "max_during": max(during, default=float("nan")),
                                   "during": len(during)}))
    comm.Barrier()
    win.Unlock_all()
    win.Free()


def joiner(name: str) -> None:
    """The joining side: open a port, publish it, accept, merge, two windows."""
    from mpi4py import MPI

    port = MPI.Open_port()
    MPI.Publish_name(name, port)
    inter = MPI.COMM_SELF.Accept(port)
    MPI.Unpublish_name(name, port)
    merged = inter.Merge(high=True)
    windows = [MPI.Win.Allocate(0, 8, comm=merged) for _ in range(2)]
    merged.Barrier()
    for win in windows:
        win.Free()
    merged.Free()
    inter.Disconnect()
    MPI.Close_port(port)


def one_round(placement: str, folder: Path, round_: int) -> dict:
    """Start ompi-server, the job and, once it serves, the joiner; the worker's figures."""
    from hvd_dcasgd.common.process import run_command, without_mpi_variables  # here: the ranks choose their own thread level

    uri, out = folder / f"uri-{placement}-{round_}", folder / f"result-{placement}-{round_}.json"
    # not an MPI process's variables (this script run from one): ompi-server would take them for a job of its own
    clean = without_mpi_variables(os.environ)
    server = subprocess.Popen(["ompi-server", "--no-daemonize", "--report-uri", str(uri)], env=clean,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not (uri.exists() and uri.read_text().strip()):
            if time.monotonic() > deadline:
                raise SystemExit("join_handshake: ompi-server wrote no URI within 10 s")
            time.sleep(0.05)
        settings = PLACEMENTS[placement]
        name = SERVICE.format(f"{placement}-{round_}")
        common = [*(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--oversubscribe",
                  "--mca", "pmix_server_uri", f"file:{uri}", "--mca", "osc", settings["osc"],
                  "-x", f"MPI4PY_RC_THREAD_LEVEL={settings['level']}", "-x", f"JOIN_NAME={name}"]
        me = [sys.executable, str(Path(__file__).resolve())]
        running = subprocess.Popen(["mpirun", *common, "-np", "2", *me, "--role", "job", "--placement", placement,
                                    "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        try:  # a side left waiting in MPI spins on a core: both end with the round
            joining = run_command(["mpirun", *common, "-np", "1", *me, "--role", "joiner", "--name", name],
                                  timeout=120)
            output, _ = running.communicate(timeout=120)
        finally:
            if running.poll() is None:
                os.killpg(running.pid, signal.SIGKILL)
                running.wait()
        if joining.timed_out:
            raise SystemExit(f"join_handshake: the {placement} round's joiner timed out:\n{joining.stdout[-2000:]}")
        if running.returncode or joining.returncode or not out.exists():
            raise SystemExit(f"join_handshake: the {placement} round failed:\n{output[-2000:]}\n{joining.stdout[-2000:]}")
        return json.loads(out.read_text())
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placements", nargs="+", choices=sorted(PLACEMENTS), default=["loop", "thread"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", metavar="PATH", help="also write this benchmark's section of PATH")
    parser.add_argument("--role", choices=["job", "joiner"], help=argparse.SUPPRESS)
    parser.add_argument("--placement", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "job":
        return job(args.placement, args.out)
    if args.role == "joiner":
        return joiner(args.name)
    for tool in ("mpirun", "ompi-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"join_handshake: needs Open MPI's {tool} on PATH")
    print(f"{'placement':<10} {'round':>5} {'connect':>8} {'merge':>7} {'windows':>8} "
          f"{'worker push to reply (ms): median':>34} {'max outside':>12} {'max during':>11}")
    results: dict = {placement: [] for placement in args.placements}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for placement in args.placements:  # alternated, so that the machine's load falls on both alike
                r = one_round(placement, Path(folder), round_)
                results[placement].append(r)
                print(f"{placement:<10} {round_:>5} {1e3 * r['connect']:>6.1f}ms {1e3 * r['merge']:>5.1f}ms "
                      f"{1e3 * r['windows']:>6.1f}ms {1e3 * r['median']:>34.2f} {1e3 * r['max_outside']:>12.2f} "
                      f"{1e3 * r['max_during']:>11.2f}", flush=True)
    if args.markdown:
        _write_section(args, results)


def _write_section(args: argparse.Namespace, results: dict) -> None:
    """The page's section: per placement, the medians over the rounds."""
    import docs_section

    def ms(placement: str, key: str, pick=statistics.median) -> str:
        return f"{1e3 * pick(r[key] for r in results[placement]):.1f}"

    rows = [[f"`{placement}`", f"`{PLACEMENTS[placement]['osc']}`, `{PLACEMENTS[placement]['level']}`",
             ms(placement, "connect"), ms(placement, "merge"), ms(placement, "windows"),
             ms(placement, "median"), ms(placement, "max_outside"), ms(placement, "max_during"),
             ms(placement, "max_during", max)] for placement in args.placements]
    header = ["handshake run by", "one-sided component, thread level", "connect (ms)", "merge (ms)",
              "two windows (ms)", "worker's wait, median (ms)", "largest wait outside the handshake (ms)",
              "largest wait during it (ms)", "worst round's largest wait during it (ms)"]
    summary = (f"A server and one worker of one `mpirun` admit a process of another `mpirun` through "
               f"`ompi-server`; {args.rounds} rounds, the placements alternated in each; medians over the rounds. "
               f"The worker pushes, waits for the serving loop's reply and steps for 1 ms, throughout.")
    docs_section.write(args.markdown, "join_handshake.py", docs_section.command("join_handshake.py", sys.argv[1:]),
                       [summary, "", *docs_section.table(header, rows)])

if __name__ == "__main__":
    main()

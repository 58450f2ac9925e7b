"""(b) One worker's push + pull round trip against raw mpi4py Put + Get.

    python benchmarks/bench_transport.py [--numel 25000000] [--markdown docs/PERFORMANCE.md]
    mpirun -np 2 python benchmarks/bench_transport.py [--numel 25000000]

Under ``mpirun -np 2`` it measures the one-sided path that mpirun chose: rank
0 owns the windows, rank 1 is the worker.  Started without mpirun it runs
itself under ``mpirun -np 2`` once per Open MPI path (the default, ``--mca
osc sm``, and TCP with ``--mca btl tcp,self --mca osc pt2pt``) and prints one
table.

All figures are for the same bytes (a float32 gradient out, float32 weights
back) on windows allocated the same way (``MPI.Win.Allocate`` on rank 0,
``Lock_all`` for the run), timed in interleaved repetitions:
* Put, Get: one ``Put`` + ``Flush`` of the message, one ``Get`` + ``Flush``
  of the weights;
* raw: ``Put`` + ``Flush`` + ``Get`` + ``Flush``, nothing else;
* channel: the protocol (Put, flush, publish the sequence word, wait for the
  server's answer, Get), the server answering at once;
* exchange: what ``optimizer.step()`` costs a worker beyond the server's
  update -- packing and checking the gradient, the channel round trip, loading
  the weights into the model.
Ratios raw / protocol are printed; 1.0 means no overhead over raw RMA.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

import docs_section
from jobs import child_env, mpirun

#: The Open MPI paths compared: name, mpirun arguments, extra environment
#: (osc/pt2pt refuses MPI_THREAD_MULTIPLE, so Horovod's integration is off there).
PATHS = (
    ("one node, default (osc/rdma over shared memory)", [], {}),
    ("one node, `--mca osc sm`", ["--mca", "osc", "sm"], {}),
    ("TCP, `--mca btl tcp,self --mca osc pt2pt`", ["--mca", "btl", "tcp,self", "--mca", "osc", "pt2pt"],
     {"HVD_DCASGD_HOROVOD": "0"}),
)
FIGURES = ("put", "get", "raw", "channel", "exchange")


def under_mpi_launcher() -> bool:
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def measure(args) -> None:
    """Rank 0 answers, rank 1 times; rank 1 prints the figures."""
    from hvd_dcasgd.protocol.channel import ServerChannel, WorkerChannel
    from hvd_dcasgd.algorithm.endpoints import open_windows
    from hvd_dcasgd.protocol.layout import ModelLayout, PushMessage
    from hvd_dcasgd.runtime.mpi import load_mpi
    from hvd_dcasgd.protocol.worker import Worker

    MPI = load_mpi()
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        sys.exit("run with exactly two ranks: mpirun -np 2 python benchmarks/bench_transport.py")
    rank = comm.Get_rank()
    model = torch.nn.Linear(1, args.numel, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    layout = ModelLayout.of(optimizer, model.named_parameters())
    message_bytes = PushMessage.size(layout, torch.float32)
    weight_bytes = layout.numel * 4
    rounds = args.repeats + 2  # the first two are warm-up

    raw_win = MPI.Win.Allocate(message_bytes + weight_bytes if rank == 0 else 0, 1, MPI.INFO_NULL, comm)
    raw_win.Lock_all(MPI.MODE_NOCHECK)
    control, mailboxes = open_windows(comm, layout, torch.float32, num_workers=1)
    send, recv = np.ones(message_bytes, np.uint8), np.empty(weight_bytes, np.uint8)
    if rank == 0:  # answer every push at once: two per round (channel, exchange)
        channel = ServerChannel(control, mailboxes, 1)
        answered = 0
        while answered < 2 * rounds:
            ready, _ = channel.poll()
            for m in ready:
                channel.reply(m)
                answered += 1
    else:
        worker_channel = WorkerChannel(control, mailboxes, 0)
        worker = Worker(optimizer, layout, [worker_channel], torch.float32)
        model.weight.grad = torch.randn_like(model.weight)

        def put():
            raw_win.Put(send, 0, (0, message_bytes, MPI.BYTE))
            raw_win.Flush(0)

        def get():
            raw_win.Get(recv, 0, (message_bytes, weight_bytes, MPI.BYTE))
            raw_win.Flush(0)

        def raw_round_trip():
            put()
            get()

        def channel_round_trip():
            worker_channel.push([(0, send)])
            worker_channel.pull(recv)

        # interleaved, so that the machine's noise hits all of them alike
        calls = dict(zip(FIGURES, (put, get, raw_round_trip, channel_round_trip, worker.exchange)))
        times = {name: [] for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        s = {k: statistics.median(v[2:]) for k, v in times.items()}
        mb = (message_bytes + weight_bytes) / 1e6
        print(f"round trip of {describe(message_bytes + weight_bytes, args.numel)}, one worker, "
              f"median of {args.repeats}, interleaved, MPI thread level {thread_level(MPI)}")
        print(f"  raw Put:            {s['put'] * 1e3:8.1f} ms  ({message_bytes / 1e9 / s['put']:5.2f} GB/s)")
        print(f"  raw Get:            {s['get'] * 1e3:8.1f} ms  ({weight_bytes / 1e9 / s['get']:5.2f} GB/s)")
        print(f"  raw Put+Get:        {s['raw'] * 1e3:8.1f} ms  ({mb / 1e3 / s['raw']:5.2f} GB/s)")
        print(f"  channel push+pull:  {s['channel'] * 1e3:8.1f} ms  ratio raw/channel  {s['raw'] / s['channel']:4.2f}")
        print(f"  worker exchange:    {s['exchange'] * 1e3:8.1f} ms  "
              f"ratio raw/exchange {s['raw'] / s['exchange']:4.2f}")
        if args.json:
            print("FIGURES " + json.dumps({**s, "message_bytes": message_bytes, "weight_bytes": weight_bytes,
                                           "thread_level": thread_level(MPI)}))
    comm.Barrier()
    raw_win.Unlock_all()
    raw_win.Free()
    control.free()
    mailboxes.free()


def describe(nbytes: int, numel: int) -> str:
    """``200 MB (25M float32 out and back)``."""
    if numel >= 100_000:
        return f"{nbytes / 1e6:.0f} MB ({numel / 1e6:g}M float32 out and back)"
    return f"{nbytes} bytes ({numel} float32 out and back)"


def thread_level(MPI) -> str:
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled", MPI.THREAD_SERIALIZED: "serialized",
              MPI.THREAD_MULTIPLE: "multiple"}
    return levels.get(MPI.Query_thread(), "unknown")


def launch(args) -> None:
    """Run :func:`measure` under mpirun once per path; print (and write) one table."""
    from hvd_dcasgd.common.process import run_command

    results = {}
    for name, mca, env in PATHS:
        cmd = mpirun(2, __file__, "--numel", args.numel, "--repeats", args.repeats, "--json", mca=mca)
        out = run_command(cmd, timeout=args.timeout, env=child_env(**env))
        lines = [line for line in out.stdout.splitlines() if line.startswith("FIGURES ")]
        if out.returncode != 0 or not lines:
            sys.exit(f"{name} failed{' (timed out)' if out.timed_out else ''}: {' '.join(cmd)}\n{out.stdout}")
        results[name] = json.loads(lines[-1][len("FIGURES "):])
    first = next(iter(results.values()))
    title = (f"round trip of {describe(first['message_bytes'] + first['weight_bytes'], args.numel)}, one worker, "
             f"median of {args.repeats} interleaved repetitions, each path one mpirun")
    print(title)
    rows = []
    for name, r in results.items():
        def rate(key: str, nbytes: int) -> str:
            return f"{r[key] * 1e3:.1f} ms, {nbytes / 1e9 / r[key]:.2f} GB/s"

        rows.append([name, r["thread_level"], rate("put", r["message_bytes"]), rate("get", r["weight_bytes"]),
                     rate("raw", r["message_bytes"] + r["weight_bytes"]),
                     f"{r['channel'] * 1e3:.1f} ms ({r['raw'] / r['channel']:.2f})",
                     f"{r['exchange'] * 1e3:.1f} ms ({r['raw'] / r['exchange']:.2f})"])
        print(f"  {name}: " + "; ".join(rows[-1][1:]))
    if args.markdown:
        header = ["Open MPI path", "thread level", "Put", "Get", "raw Put + Get",
                  "channel push + pull (ratio to raw)", "worker `step()` exchange (ratio to raw)"]
        command = docs_section.command("bench_transport.py", sys.argv[1:])
        docs_section.write(args.markdown, "bench_transport.py", command,
                           [f"{title[0].upper()}{title[1:]}.", "", *docs_section.table(header, rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--timeout", type=float, default=300, help="seconds for each mpirun (without mpirun)")
    parser.add_argument("--markdown", metavar="PATH", help="also write this benchmark's section of PATH "
                        "(docs/PERFORMANCE.md); without mpirun only")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if under_mpi_launcher():
        if args.markdown:
            sys.exit("--markdown compares every path: run without mpirun")
        measure(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()

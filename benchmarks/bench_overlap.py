"""(d) A worker's step with its push overlapped with backward, and without.

One server and one worker under ``mpirun``, once per Open MPI path (shared
memory, and TCP with ``--mca btl tcp,self --mca osc pt2pt``, without and with
the TCP transport's progress thread, which moves bytes while the worker
computes).  The worker
trains an MLP whose compute (forward + backward) takes about as long as its
exchange (the batch is sized to make it so, from a first measurement of
each), and times, in the same interleaved rounds:

- compute: forward + backward alone (nothing sent);
- exchange: ``step()`` alone, after a backward that sent nothing (Puts,
  flush, the server's update, Get);
- step without overlap: forward + backward + ``step()``, the whole gradient
  sent by ``step()`` (``fusion_threshold=0``);
- step with overlap: the same, each bucket of ``--fusion-threshold`` bytes
  Put from the gradient hook as soon as backward has finished it.

The bounds are ``compute + exchange`` (nothing overlapped) and
``max(compute, exchange)`` (everything overlapped); the figure of merit is
how far the overlapped step comes from the first towards the second.

    python benchmarks/bench_overlap.py [--width 1024] [--depth 4] [--rounds 15] [--markdown docs/PERFORMANCE.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import docs_section
from jobs import child_env, mpirun

PATHS = (
    ("one node, shared memory (default)", []),
    ("TCP, `--mca btl tcp,self --mca osc pt2pt`", ["--mca", "btl", "tcp,self", "--mca", "osc", "pt2pt"]),
    ("TCP as above, with `--mca btl_tcp_progress_thread 1`",
     ["--mca", "btl", "tcp,self", "--mca", "osc", "pt2pt", "--mca", "btl_tcp_progress_thread", "1"]),
)
KINDS = ("compute", "exchange", "step without overlap", "step with overlap")


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(args) -> None:
    """The job's ranks: rank 0 serves; rank 1 measures and prints one JSON line."""
    import hvd_dcasgd as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.depth)])
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-6),
                                         named_parameters=model.named_parameters(), compensation="none",
                                         fusion_threshold=0)
    worker = optimizer._session.worker
    batch = 8
    x = torch.randn(batch, args.width)

    def compute():
        optimizer.zero_grad()
        model(x).square().mean().backward()

    def exchange():
        compute()
        start = time.perf_counter()
        optimizer.step()
        return time.perf_counter() - start

    def step():
        compute()
        optimizer.step()

    # size the batch so that compute takes about as long as the exchange (twice: compute is not linear in it)
    exchange_time = statistics.median(exchange() for _ in range(5))
    for _ in range(2):
        compute_time = _median_time(compute, 3)
        batch = max(1, round(batch * exchange_time / compute_time))
        x = torch.randn(batch, args.width)
    contenders = {"compute": (0, compute), "exchange": (0, exchange), "step without overlap": (0, step),
                  "step with overlap": (args.fusion_threshold, step)}  # kind -> (bytes per bucket, call)
    times = {kind: [] for kind in KINDS}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for kind in KINDS:
            threshold, call = contenders[kind]
            worker.set_fusion_threshold(threshold)
            start = time.perf_counter()
            seconds = call()
            seconds = time.perf_counter() - start if seconds is None else seconds
            if round_:
                times[kind].append(seconds)
    worker.set_fusion_threshold(args.fusion_threshold)
    buckets = len(worker.buckets)
    worker.set_fusion_threshold(0)
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"batch": batch, "params": params, "buckets": buckets,
                      "seconds": {kind: statistics.median(t) for kind, t in times.items()}}), flush=True)
    hvd.shutdown()


def launch(args) -> None:
    from hvd_dcasgd.common.process import run_command

    results = {}
    for name, mca in PATHS:
        cmd = mpirun(2, __file__, "--run", "--width", args.width, "--depth", args.depth, "--rounds", args.rounds,
                     "--fusion-threshold", args.fusion_threshold, mca=mca)
        out = run_command(cmd, timeout=args.timeout, env=child_env(HVD_DCASGD_HOROVOD="0"))
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode != 0 or not lines:
            sys.exit(f"{name} failed{' (timed out)' if out.timed_out else ''}:\n{out.stdout}")
        results[name] = json.loads(lines[-1])
    first = next(iter(results.values()))
    title = (f"overlap: one worker, one server, an MLP of {args.depth} x Linear({args.width}, {args.width}) "
             f"({first['params'] / 1e6:.2f}M float32 parameters, {first['buckets']} buckets of at most "
             f"{args.fusion_threshold / 2**20:g} MiB), median of {args.rounds} interleaved rounds")
    print(title)
    rows = []
    for name, result in results.items():
        s = result["seconds"]
        low, high = max(s["compute"], s["exchange"]), s["compute"] + s["exchange"]
        way = (high - s["step with overlap"]) / (high - low) if high > low else float("nan")
        print(f"  {name}: batch {result['batch']}, compute {s['compute'] * 1e3:.1f} ms, exchange "
              f"{s['exchange'] * 1e3:.1f} ms, step without overlap {s['step without overlap'] * 1e3:.1f} ms, "
              f"with overlap {s['step with overlap'] * 1e3:.1f} ms; bounds max {low * 1e3:.1f} ms, sum "
              f"{high * 1e3:.1f} ms; way from the sum to the max {way:.2f}")
        rows.append([name, str(result["batch"]), *(f"{s[kind] * 1e3:.1f}" for kind in KINDS), f"{low * 1e3:.1f}",
                     f"{high * 1e3:.1f}", f"{way:.2f}"])
    if args.markdown:
        command = docs_section.command("bench_overlap.py", sys.argv[1:])
        docs_section.write(args.markdown, "bench_overlap.py", command, [
            f"{title[0].upper()}{title[1:]}.", "",
            *docs_section.table(["Open MPI path", "batch", "compute ms", "exchange ms", "step without overlap ms",
                                 "step with overlap ms", "max(compute, exchange) ms", "compute + exchange ms",
                                 "way from the sum to the max"], rows),
        ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--fusion-threshold", type=int, default=4 << 20, help="bytes per bucket (default 4 MiB)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each mpirun")
    parser.add_argument("--markdown", metavar="PATH", help="also write this benchmark's section of PATH "
                        "(docs/PERFORMANCE.md)")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    measure(args) if args.run else launch(args)


if __name__ == "__main__":
    main()

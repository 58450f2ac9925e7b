"""(d) One server against two: what each server moves and computes per update.

The same run as ``bench_end_to_end.py`` (workers pushing precomputed
gradients of a 1M-parameter model as fast as the servers answer), on one
server and on two (``HVD_DCASGD_SERVERS=2``), every run its own mpirun,
interleaved, Horovod's integration off.  On one machine two servers share the
cores with the workers, so the update rate is not expected to rise; what a
second server changes is each server's share: the bytes it moves per update
(its slice of the gradient in, its slice of the weights out: about half) and
the time it spends applying one update (about half).  Both come from each
server's own end-of-run summary.

    python benchmarks/bench_servers.py [--workers 4] [--numel 1000000] [--steps 300] [--rounds 3] [--markdown docs/PERFORMANCE.md]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys

import bench_end_to_end
import docs_section

MODES = ("none", "adaptive")
SERVERS = (1, 2)


def per_server(figures: dict) -> list:
    """Each server's own summary (one server: the summary itself)."""
    return figures.get("shards", [figures])


def launch(args) -> None:
    runs = {}
    for _, mode, servers in itertools.product(range(args.rounds), MODES, SERVERS):  # interleaved rounds
        figures = bench_end_to_end.run_once(args, mode, "0", servers)
        shards = per_server(figures)
        runs.setdefault((mode, servers), []).append((
            figures["updates_per_s"],
            max(s["bytes_in_per_push"] + s["bytes_out_per_answer"] for s in shards),
            max(s["apply_seconds_per_update"] for s in shards),
        ))
    med = {key: [statistics.median(r[i] for r in rs) for i in range(3)] for key, rs in runs.items()}
    rounds = f", median of {args.rounds} interleaved rounds" if args.rounds > 1 else ""
    print(f"servers: {args.workers} workers, {args.numel / 1e6:g}M float32 parameters, {args.steps} pushes per "
          f"worker{rounds}")
    rows = []
    for mode, servers in itertools.product(MODES, SERVERS):
        rate, moved, apply = med[mode, servers]
        one_rate, one_moved, one_apply = med[mode, 1]
        print(f"  {mode:9s} {servers} server(s) {rate:8.1f} updates/s  {moved / 1e6:7.3f} MB per server per update "
              f"(ratio to one {moved / one_moved:4.2f})  apply {apply * 1e3:7.3f} ms per update "
              f"(ratio to one {apply / one_apply:4.2f})")
        rows.append([f"`{mode}` ({bench_end_to_end.LABELS[mode]})", str(servers), f"{rate:.1f}",
                     f"{rate / one_rate:.2f}", f"{moved / 1e6:.3f}", f"{moved / one_moved:.2f}",
                     f"{apply * 1e3:.3f}", f"{apply / one_apply:.2f}"])
    if args.markdown:
        header = ["mode", "servers", "updates/s", "ratio to one server", "MB per server per update (in + out)",
                  "ratio to one server", "apply ms per update, per server", "ratio to one server"]
        summary = (f"{args.workers} workers, {args.numel / 1e6:g}M float32 parameters, {args.steps} pushes per "
                   f"worker, one mpirun per run{rounds}, `HVD_DCASGD_HOROVOD=0`. With two servers, the larger "
                   "of the two servers' figures.")
        command = docs_section.command("bench_servers.py", sys.argv[1:])
        docs_section.write(args.markdown, "bench_servers.py", command,
                           [summary, "", *docs_section.table(header, rows)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1, help="run every case this many times, interleaved; "
                        "report the median")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each mpirun")
    parser.add_argument("--markdown", metavar="PATH", help="also write this benchmark's section of PATH "
                        "(docs/PERFORMANCE.md)")
    launch(parser.parse_args())


if __name__ == "__main__":
    main()

"""(a) The server's update against a plain copy, in bytes per second.

For each update of a flat model (25M float32 parameters by default) the
bytes it reads and writes are counted from its transfers (:mod:`traffic`:
every torch operation and C kernel pass of one update), and divided by its
time; the ratio is that rate over a torch copy's (bytes read + written per
second) measured in the same run.  Every contender is built first, then all
are timed in the same interleaved rounds, so every ratio comes from one run
on this machine.

    python benchmarks/bench_apply.py [--numel 25000000] [--device cpu|cuda] [--markdown docs/PERFORMANCE.md]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import torch

import docs_section
import traffic
from common import flat_model, single_rank_server
from hvd_dcasgd import dcasgd_

COPY = "plain copy (torch) of 2.5 model sizes"
REFERENCE = "the paper's formula as a chain of torch ops (`dcasgd_` reference, `constant`; no step, no backup)"
METHODS = {"none": "ASGD", "constant": "DC-ASGD-c", "adaptive": "DC-ASGD-a", "sync": "SSGD, a round of one push"}
OPTIMIZERS = (
    ("SGD", lambda p: torch.optim.SGD(p, lr=1e-3), ("none", "constant", "adaptive", "sync")),
    ("SGD momentum 0.9", lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9), ("none", "constant", "adaptive", "sync")),
    ("Adam", lambda p: torch.optim.Adam(p, lr=1e-3), ("none", "adaptive")),
)


def figure(x: float) -> str:
    """Three significant figures, without an exponent."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--markdown", metavar="PATH", help="also write this benchmark's section of PATH "
                        "(docs/PERFORMANCE.md)")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    n = args.numel

    source = torch.randn(n * 5 // 2, device=device)  # about the bytes an update moves: both stay out of cache
    target = torch.empty_like(source)
    w, w_bak, g = (torch.randn(n, device=device) for _ in range(3))
    contenders = {  # name printed -> (the call, the update's path, label in the table)
        "plain copy of the same bytes": (lambda: target.copy_(source), "", COPY),
        "reference compensation (unfused torch ops), constant": (
            lambda: dcasgd_([g], [w], [w_bak], None, lambda_0=0.04, foreach=False, fused=False),
            "reference", REFERENCE),
    }
    for optimizer_name, make, modes in OPTIMIZERS:
        for mode in modes:
            model = flat_model(n)
            server = single_rank_server(model, make(model.parameters()), mode, workers=2, device=device)
            step = functools.partial(server.apply_round, [0]) if mode == "sync" else functools.partial(server.apply, 0)
            contenders[f"server.apply, {optimizer_name}, {mode}"] = (
                step, server.update.path, f"`{mode}` ({METHODS[mode]}), {optimizer_name}")
    times = {name: [] for name in contenders}
    for round_ in range(args.repeats + 1):  # round 0 warms up
        for name, (fn, _, _) in contenders.items():
            start = time.perf_counter()
            fn()
            sync()
            if round_:
                times[name].append(time.perf_counter() - start)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    moved = {name: traffic.count(fn) for name, (fn, _, _) in contenders.items()}  # bytes of one call each
    rates = {name: moved[name].total / seconds[name] for name in contenders}
    copy = rates["plain copy of the same bytes"]
    size = f"{n / 1e6:g}M" if n >= 100_000 else f"{n}"
    title = (f"update of {size} float32 parameters, device {device}, torch threads {torch.get_num_threads()}, "
             f"median of {args.repeats} interleaved rounds")
    print(title)
    for name, t in seconds.items():
        print(f"  {name:42s} {t * 1e3:7.1f} ms  read {moved[name].read / 1e6:8.1f} MB  written "
              f"{moved[name].written / 1e6:8.1f} MB  {rates[name] / 1e9:6.1f} GB/s  ratio {rates[name] / copy:4.2f}")

    if args.markdown:
        rows = [[label, f"`{path}`" if path else "", figure(seconds[name] * 1e3), figure(moved[name].read / 1e6),
                 figure(moved[name].written / 1e6), figure(rates[name] / 1e9), f"{rates[name] / copy:.2f}"]
                for name, (_, path, label) in contenders.items()]
        command = docs_section.command("bench_apply.py", sys.argv[1:])
        docs_section.write(args.markdown, "bench_apply.py", command, [
            f"{title[0].upper()}{title[1:]}.", "",
            *docs_section.table(["update", "path", "ms", "MB read", "MB written", "GB/s",
                                 "ratio to the copy's GB/s"], rows),
        ])


if __name__ == "__main__":
    main()

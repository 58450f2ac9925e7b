"""(c) End-to-end server updates/s: 4 workers, a 1M-parameter model.

Workers push precomputed gradients as fast as the server answers, so the
figure is the system's update rate (transport + compensation + optimizer),
not a model's compute.  Each mode runs under its own mpirun (``--rounds R``:
R times, interleaved, and the median is shown); the table shows updates/s, the
ratio to the raw RMA protocol (``raw_rma.py``: Put + flag, ``w -= lr * g`` in
numpy, Get -- the reference for what the transport allows) and the ratio to
plain ASGD (``none``), all measured in the same invocation.  Each mode's
update is also stated as memory traffic: the bytes one server update reads
and writes (counted from its transfers by :mod:`traffic`, on a server of the
same model in one process), times updates/s, against a torch copy's bytes/s
measured in every round.
With Horovod installed every mode also runs with the Horovod integration off
(``HVD_DCASGD_HOROVOD=0``: no Horovod background thread on the workers, MPI at
thread level serialized), interleaved, to show what the integration costs.

``--metrics-overhead`` measures instead what the server's metrics cost:
one mode (``--mode``, DC-ASGD-a by default) with ``HVD_DCASGD_METRICS`` on
(every ``--metrics-interval`` seconds) and off, the two back to back in each
round (their order alternating), and the ratio of updates/s on to off within
each round, over the rounds: geometric mean with its 95% t interval
(``scipy.stats``), median and range.

    python benchmarks/bench_end_to_end.py [--workers 4] [--numel 1000000] [--steps 300] [--markdown docs/PERFORMANCE.md]
    python benchmarks/bench_end_to_end.py --metrics-overhead [--mode adaptive] [--metrics-interval 1] [--rounds 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch

import docs_section
from evidence.stats import paired_difference, verdict
from jobs import child_env, mpirun

MODES = ("none", "constant", "adaptive", "sync")
RAW = "raw"  # the raw RMA protocol (raw_rma.py), run with the integration off
LABELS = {"none": "ASGD", "constant": "DC-ASGD-c", "adaptive": "DC-ASGD-a",
          "sync": "SSGD; one update per round of pushes"}


def train(args) -> None:
    import hvd_dcasgd as hvd

    if args.run == RAW:
        import raw_rma
        from hvd_dcasgd.runtime.mpi import load_mpi
        from hvd_dcasgd.protocol.transport import Backoff

        raw_rma.run(load_mpi(), args.numel, args.steps, Backoff())
        return

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(1, args.numel, bias=False)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-4), named_parameters=model.named_parameters(),
        compensation=args.run,
    )
    gradient = torch.randn_like(model.weight) * 1e-3
    for _ in range(args.steps):
        model.weight.grad = gradient
        optimizer.step()
    hvd.shutdown()


def measure_memory(args) -> None:
    """Print, as JSON, the bytes one server update of each mode reads and
    writes, and a copy's bytes/s (median of 9), on this process alone."""
    import time

    import traffic
    from common import flat_model, single_rank_server

    moved = {}
    for mode in MODES:
        model = flat_model(args.numel)
        server = single_rank_server(model, torch.optim.SGD(model.parameters(), lr=1e-4), mode, args.workers,
                                    torch.device("cpu"))
        step = (lambda: server.apply_round([0])) if mode == "sync" else (lambda: server.apply(0))
        step()
        counted = traffic.count(step)
        moved[mode] = [counted.read, counted.written]
    source = torch.randn(args.numel * 5 // 2)
    target = torch.empty_like(source)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - start)
    print(json.dumps({"bytes": moved, "copy_bytes_per_s": 2 * source.nbytes / statistics.median(times[1:])}))


def memory_once(args) -> dict:
    """One :func:`measure_memory` in a process of its own."""
    from hvd_dcasgd.common.process import run_command

    out = run_command([sys.executable, __file__, "--memory", "--numel", args.numel, "--workers", args.workers],
                      timeout=args.timeout, env=child_env())
    if out.returncode != 0:
        sys.exit(f"the memory measurement failed:\n{out.stdout}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_once(args, mode: str, horovod: str, servers: int = 1, **extra: str) -> dict:
    """One mpirun of ``mode`` (or the raw protocol): the server's end-of-run
    figures (``HVD_DCASGD_SUMMARY``; with several servers, the merged ones);
    ``extra``: more variables for the job."""
    from hvd_dcasgd.common.process import run_command

    with tempfile.TemporaryDirectory() as scratch:
        summary = Path(scratch) / "summary.json"
        cmd = mpirun(args.workers + servers, __file__, "--run", mode, "--numel", args.numel, "--steps", args.steps)
        env = child_env(HVD_DCASGD_HOROVOD=horovod, HVD_DCASGD_SUMMARY=str(summary), HVD_DCASGD_SERVERS=str(servers),
                        **extra)
        out = run_command(cmd, timeout=args.timeout, env=env)
        if out.returncode != 0 or not summary.exists():
            sys.exit(f"{mode} on {servers} server(s) failed{' (timed out)' if out.timed_out else ''}:\n{out.stdout}")
        return json.loads(summary.read_text())


def launch(args) -> None:
    settings = ("auto", "0") if importlib.util.find_spec("horovod") else ("0",)
    runs = {}
    order = [(RAW, "0"), *itertools.product(MODES, settings)]
    copies = []
    for _, (mode, horovod) in itertools.product(range(args.rounds), order):  # interleaved rounds
        if (mode, horovod) == order[0]:
            memory = memory_once(args)
            copies.append(memory["copy_bytes_per_s"])
        figures = run_once(args, mode, horovod)
        runs.setdefault((mode, horovod), []).append((figures["updates_per_s"], figures["gradients_per_s"]))
    moved = {mode: sum(memory["bytes"][mode]) for mode in MODES}  # the same in every round
    copy = statistics.median(copies)
    paired = _paired_ratios(runs, settings) if args.rounds > 1 else []
    rates = {key: tuple(statistics.median(r[i] for r in rs) for i in range(2)) for key, rs in runs.items()}
    rounds = f", median of {args.rounds} interleaved rounds" if args.rounds > 1 else ""
    title = (f"end to end: {args.workers} workers, {args.numel / 1e6:g}M float32 parameters, "
             f"{args.steps} pushes per worker, {os.cpu_count()} cores{rounds}")
    raw = rates.pop((RAW, "0"))[0]
    print(title)
    print(f"  a copy moves {copy / 1e9:.1f} GB/s (read + written, median of the rounds)")
    print(f"  raw RMA protocol (Put + flag, numpy w -= lr * g, Get) {raw:8.1f} updates/s")
    for (mode, horovod), (updates, gradients) in rates.items():
        label = "Horovod on " if horovod == "auto" else "Horovod off"
        read, written = memory["bytes"][mode]
        print(f"  {mode:9s} {label} {updates:8.1f} updates/s  {gradients:8.1f} gradients/s  "
              f"ratio to raw {updates / raw:4.2f}  ratio to none (updates) {updates / rates['none', horovod][0]:4.2f}"
              + (f"  on/off {updates / rates[mode, '0'][0]:4.2f}" if horovod == "auto" else "")
              + f"  update reads {read / 1e6:.1f} MB, writes {written / 1e6:.1f} MB: "
                f"{updates * moved[mode] / 1e9:.2f} GB/s, ratio to copy {updates * moved[mode] / copy:.2f}")
    for line in paired:
        print(f"  {line}")
    if args.markdown:
        header, rows = ["mode"], []
        for horovod in settings:
            label = "on" if horovod == "auto" else "off"
            header += [f"updates/s, Horovod {label}", "ratio to raw", "ratio to ASGD"]
        if len(settings) == 2:
            header.append("on / off")
        header.append("MB per update (read + written)")
        header += [f"GB/s, Horovod {'on' if horovod == 'auto' else 'off'} (ratio to the copy)" for horovod in settings]
        rows.append(["raw RMA protocol (`benchmarks/raw_rma.py`; no Horovod)"]
                    + [cell for horovod in settings
                       for cell in (f"{raw:.1f}", "1.00", f"{raw / rates['none', horovod][0]:.2f}")]
                    + ([""] if len(settings) == 2 else []) + [""] * (1 + len(settings)))
        for mode in MODES:
            row = [f"`{mode}` ({LABELS[mode]})"]
            for horovod in settings:
                row += [f"{rates[mode, horovod][0]:.1f}", f"{rates[mode, horovod][0] / raw:.2f}",
                        f"{rates[mode, horovod][0] / rates['none', horovod][0]:.2f}"]
            if len(settings) == 2:
                row.append(f"{rates[mode, 'auto'][0] / rates[mode, '0'][0]:.2f}")
            read, written = memory["bytes"][mode]
            row.append(f"{read / 1e6:.4g} + {written / 1e6:.4g}")
            row += [f"{rates[mode, horovod][0] * moved[mode] / 1e9:.2f} "
                    f"({rates[mode, horovod][0] * moved[mode] / copy:.2f})" for horovod in settings]
            rows.append(row)
        note = ("Horovod is not installed here: every run has the integration off." if len(settings) == 1
                else "Every mode runs with the integration on and with it off (`HVD_DCASGD_HOROVOD=0`).")
        summary = (f"End to end: {args.workers} workers, {args.numel / 1e6:g}M float32 parameters, {args.steps} "
                   f"pushes per worker, {args.workers + 1} processes, one mpirun per run{rounds}. {note} "
                   f"A torch copy moved {copy / 1e9:.1f} GB/s (read + written; median over the rounds).")
        command = docs_section.command("bench_end_to_end.py", sys.argv[1:])
        pairs = ["", "Each round's runs follow one another, so the ratios within a round are paired. Over the "
                 "rounds, each ratio's geometric mean with its 95% t interval, the median and the range, and "
                 "against the target, whether the interval lies above it (met), below it (missed) or across "
                 "it (not decided by this run):"] if paired else []
        docs_section.write(args.markdown, "bench_end_to_end.py", command,
                           [summary, "", *docs_section.table(header, rows), *pairs, *(f"- {line}" for line in paired)])


def metrics_overhead(args) -> None:
    """``--metrics-overhead``: updates/s of ``args.mode`` with the server's
    metrics on and off, paired within each round; the ratio on / off."""
    import scipy.stats

    horovod = "auto" if importlib.util.find_spec("horovod") else "0"
    print(f"metrics overhead: {LABELS[args.mode]}, {args.workers} workers, {args.numel / 1e6:g}M float32 "
          f"parameters, {args.steps} pushes per worker, {os.cpu_count()} cores, Horovod "
          f"{'on' if horovod == 'auto' else 'off'}, HVD_DCASGD_METRICS_INTERVAL={args.metrics_interval:g}, "
          f"{args.rounds} interleaved paired rounds", flush=True)
    on, off, seconds = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for metrics in ((True, False) if round_ % 2 == 0 else (False, True)):
                extra = {"HVD_DCASGD_METRICS": str(Path(scratch) / f"runs-{round_}"),
                         "HVD_DCASGD_METRICS_INTERVAL": f"{args.metrics_interval:g}"} if metrics else {}
                figures = run_once(args, args.mode, horovod, **extra)
                (on if metrics else off).append(figures["updates_per_s"])
                seconds.append(figures["seconds"])
            print(f"  round {round_ + 1}: {on[-1]:.1f} updates/s with metrics, {off[-1]:.1f} without "
                  f"(the server's runs: {seconds[-2]:.1f} s and {seconds[-1]:.1f} s)", flush=True)
        written = [p for p in Path(scratch).rglob("*") if p.is_file()]
    ratios = [a / b for a, b in zip(on, off)]
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) > 1:
        low, high = (math.exp(b) for b in scipy.stats.ttest_1samp(logs, 0.0).confidence_interval(0.95))
        interval = f", 95% t interval [{low:.3f}, {high:.3f}]"
    else:
        interval = ""
    print(f"  updates/s with metrics: {', '.join(f'{r:.1f}' for r in on)}")
    print(f"  updates/s without:      {', '.join(f'{r:.1f}' for r in off)}")
    print(f"  ratio on / off: geometric mean {math.exp(mean):.3f}{interval} (median "
          f"{statistics.median(ratios):.3f}, range {min(ratios):.3f} to {max(ratios):.3f})")
    folders = ", ".join(sorted({p.parent.name for p in written}))
    print(f"  files the runs with metrics wrote: {len(written)} ({folders})")


#: The rates the server should reach, as ratios within a round: ASGD to the
#: raw protocol, DC-ASGD-a to ASGD (DC-ASGD-c has none).
TARGETS = {"ASGD / raw": 0.9, "DC-ASGD-a / ASGD": 0.9}


def paired_ratio(top: list, bottom: list, target: Optional[float] = None) -> str:
    """One ratio over the rounds, as a line: the geometric mean of the
    per-round ratios with its 95% t interval (on their logarithms: a ratio
    and its inverse are equally far from 1), the median and the range, and,
    given a target, whether the interval lies above it, below it or across
    it.  The machine's load drifts between rounds; within one round the runs
    are back to back, so the ratio of a round is taken within it."""
    ratios = sorted(t[0] / b[0] for t, b in zip(top, bottom))
    logs = paired_difference([math.log(t[0]) for t in top], [math.log(b[0]) for b in bottom])
    low, high = (math.exp(bound) for bound in logs.t_interval)
    line = (f"{math.exp(logs.mean):.2f}, 95% interval [{low:.2f}, {high:.2f}] "
            f"(median {statistics.median(ratios):.2f}, range {ratios[0]:.2f} to {ratios[-1]:.2f})")
    if target is not None:
        line += f"; target {target:.2f}: {verdict((low, high), target)}"
    return line


def _paired_ratios(runs: dict, settings: tuple) -> list:
    """Per-round ratios (ASGD to raw, each DC-ASGD mode to ASGD), as lines."""
    lines = []
    for horovod in settings:
        label = "Horovod on" if horovod == "auto" else "Horovod off"
        pairs = [("ASGD / raw", runs["none", horovod], runs[RAW, "0"])]
        pairs += [(f"{LABELS[mode]} / ASGD", runs[mode, horovod], runs["none", horovod])
                  for mode in ("constant", "adaptive")]
        lines += [f"{name}, {label}: {paired_ratio(top, bottom, TARGETS.get(name))}" for name, top, bottom in pairs]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1, help="run every mode this many times, interleaved; "
                        "report the median")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each mpirun")
    parser.add_argument("--markdown", metavar="PATH", help="also write this benchmark's section of PATH "
                        "(docs/PERFORMANCE.md)")
    parser.add_argument("--metrics-overhead", action="store_true", help="measure the server's metrics "
                        "(HVD_DCASGD_METRICS) instead: --mode with them on and off, paired in each of --rounds")
    parser.add_argument("--mode", choices=MODES, default="adaptive", help="the mode --metrics-overhead runs")
    parser.add_argument("--metrics-interval", type=float, default=1.0, help="HVD_DCASGD_METRICS_INTERVAL for "
                        "--metrics-overhead (seconds)")
    parser.add_argument("--run", choices=(RAW, *MODES), help=argparse.SUPPRESS)
    parser.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory:
        measure_memory(args)
    elif args.metrics_overhead:
        metrics_overhead(args)
    else:
        train(args) if args.run else launch(args)


if __name__ == "__main__":
    main()

"""(c) End-to-end server updates/s: 4 workers, a 1M-parameter model.

Workers push precomputed gradients as fast as the server answers, so the
figure is the system's update rate (transport + compensation + optimizer),
not a model's compute.  Each mode runs once under mpirun; the table shows
updates/s and the ratio to plain ASGD (``none``) measured in the same run.
With Horovod installed every mode also runs with the Horovod integration off
(``HVD_DCASGD_HOROVOD=0``: no Horovod background thread on the workers, MPI at
thread level serialized), interleaved, to show what the integration costs.

    python benchmarks/bench_end_to_end.py [--workers 4] [--numel 1000000] [--steps 300]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys

import torch

MODES = ("none", "constant", "adaptive", "sync")


def train(args) -> None:
    import hvd_dcasgd as hvd

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


def launch(args) -> None:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    settings = ("auto", "0") if importlib.util.find_spec("horovod") else ("0",)
    rates = {}
    for mode in MODES:
        for horovod in settings:
            cmd = ["mpirun", *root, "--oversubscribe", "-np", str(args.workers + 1), sys.executable, __file__,
                   "--run", mode, "--numel", str(args.numel), "--steps", str(args.steps)]
            env = {**os.environ, "HVD_DCASGD_HOROVOD": horovod}
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            found = re.search(r"\(([\d.]+) updates/s\), \d+ gradients \(([\d.]+) gradients/s\)", out.stdout + out.stderr)
            if out.returncode != 0 or not found:
                sys.exit(f"{mode} failed:\n{out.stdout}{out.stderr}")
            rates[mode, horovod] = (float(found.group(1)), float(found.group(2)))
    print(f"end to end: {args.workers} workers, {args.numel / 1e6:g}M float32 parameters, "
          f"{args.steps} pushes per worker, {os.cpu_count()} cores")
    for (mode, horovod), (updates, gradients) in rates.items():
        label = "Horovod on " if horovod == "auto" else "Horovod off"
        print(f"  {mode:9s} {label} {updates:8.1f} updates/s  {gradients:8.1f} gradients/s  "
              f"ratio to none (updates) {updates / rates['none', horovod][0]:4.2f}"
              + (f"  on/off {updates / rates[mode, '0'][0]:4.2f}" if horovod == "auto" else ""))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--run", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    train(args) if args.run else launch(args)


if __name__ == "__main__":
    main()

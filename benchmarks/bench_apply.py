"""(a) The server's apply step against a plain copy of the same bytes.

One server update of a flat model (25M float32 parameters by default) reads
w, w_bak(m) and g and writes w and w_bak(m): five model-sized transfers.  The
baseline copies 2.5 model sizes (read 2.5 + write 2.5), the same bytes.  The
ratio copy_time / apply_time is the fraction of copy bandwidth reached.  Every
figure comes from one run on this machine.

    python benchmarks/bench_apply.py [--numel 25000000] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from common import flat_model, single_rank_server
from hvd_dcasgd import dcasgd_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    n = args.numel

    # every contender is built first, then timed in interleaved rounds, so that
    # the machine's noise falls on all of them alike
    source = torch.randn(n * 5 // 2, device=device)  # the bytes one update reads and writes
    target = torch.empty_like(source)
    w, w_bak, g = (torch.randn(n, device=device) for _ in range(3))
    contenders = {
        "plain copy of the same bytes": lambda: target.copy_(source),
        "reference compensation (unfused torch ops), constant": lambda: dcasgd_(
            [g], [w], [w_bak], None, lambda_0=0.04, foreach=False, fused=False),
    }
    for optimizer_name, make in (
        ("SGD", lambda p: torch.optim.SGD(p, lr=1e-3)),
        ("SGD momentum=0.9", lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9)),
    ):
        for mode in ("none", "constant", "adaptive", "sync"):
            model = flat_model(n)
            server = single_rank_server(model, make(model.parameters()), mode, workers=2, device=device)
            step = functools.partial(server.apply_round, [0]) if mode == "sync" else functools.partial(server.apply, 0)
            contenders[f"server.apply, {optimizer_name}, {mode}"] = step
    times = {name: [] for name in contenders}
    for round_ in range(args.repeats + 1):  # round 0 warms up
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            sync()
            if round_:
                times[name].append(time.perf_counter() - start)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    copy = seconds["plain copy of the same bytes"]
    print(f"apply step on {n / 1e6:.0f}M float32 parameters, device {device}, torch threads {torch.get_num_threads()}, "
          f"median of {args.repeats} interleaved rounds")
    for name, t in seconds.items():
        print(f"  {name:42s} {t * 1e3:7.1f} ms  ratio {copy / t:4.2f}")
    print(f"  (the copy moves {5 * n * 4 / 1e9 / copy:.1f} GB/s)")


if __name__ == "__main__":
    main()

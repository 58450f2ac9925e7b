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

import torch

from common import flat_model, median_seconds, single_rank_server
from hvd_dcasgd import dcasgd_


def copy_seconds(n: int, device: torch.device, repeats: int, sync) -> float:
    """A plain copy of 2.5 model sizes: the bytes one update reads and writes."""
    source = torch.randn(n * 5 // 2, device=device)
    target = torch.empty_like(source)
    return median_seconds(lambda: target.copy_(source), repeats, sync=sync)


def reference_seconds(n: int, device: torch.device, repeats: int, sync) -> float:
    """The paper's formula as a chain of torch ops (the reference)."""
    w, w_bak, g = (torch.randn(n, device=device) for _ in range(3))
    return median_seconds(
        lambda: dcasgd_([g], [w], [w_bak], None, lambda_0=0.04, lr=1e-3, foreach=False, fused=False),
        repeats, sync=sync,
    )


def apply_seconds(n: int, make_optimizer, mode: str, device: torch.device, repeats: int, sync) -> float:
    """One ``ParameterServer`` update on real (single-rank) windows."""
    model = flat_model(n)
    server = single_rank_server(model, make_optimizer(model.parameters()), mode, workers=2, device=device)
    step = (lambda: server.apply_round([0])) if mode == "sync" else (lambda: server.apply(0))
    return median_seconds(step, repeats, sync=sync)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    n = args.numel
    copy = copy_seconds(n, device, args.repeats, sync)
    print(f"apply step on {n / 1e6:.0f}M float32 parameters, device {device}, torch threads {torch.get_num_threads()}")
    print(f"  plain copy of the same bytes: {copy * 1e3:7.1f} ms  ({5 * n * 4 / 1e9 / copy:5.1f} GB/s)")
    unfused = reference_seconds(n, device, args.repeats, sync)
    print(f"  reference (unfused torch ops), constant:       {unfused * 1e3:7.1f} ms  ratio {copy / unfused:4.2f}")
    for optimizer_name, make in (
        ("SGD", lambda p: torch.optim.SGD(p, lr=1e-3)),
        ("SGD momentum=0.9", lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9)),
    ):
        for mode in ("none", "constant", "adaptive", "sync"):
            seconds = apply_seconds(n, make, mode, device, args.repeats, sync)
            print(f"  server.apply, {optimizer_name:16s} {mode:9s}: {seconds * 1e3:7.1f} ms  ratio {copy / seconds:4.2f}")


if __name__ == "__main__":
    main()

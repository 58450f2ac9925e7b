"""A deterministic training run for the tests.

Worker m's k-th gradient is the real gradient of a least-squares loss on a
batch generated from (m, k), at the weights the worker holds, so a run can be
replayed in one process from the server's trace.  Every rank initialises its
model from its own seed: the workers must start from the server's weights.
"""

import argparse
import atexit
import json
import os

import torch

import hvd_dcasgd as hvd

DIM_A, DIM_B, BATCH = 48, 16, 8


class Model(torch.nn.Module):
    def __init__(self, dim_b=DIM_B):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(DIM_A))
        self.b = torch.nn.Parameter(torch.randn(dim_b))
        self.register_buffer("running", torch.zeros(4))


def batch(worker: int, step: int):
    g = torch.Generator().manual_seed(7919 * worker + step)
    xa, xb = torch.randn(BATCH, DIM_A, generator=g), torch.randn(BATCH, DIM_B, generator=g)
    y = torch.randn(BATCH, generator=g)
    return xa, xb, y


def loss_on(model: Model, xa, xb, y):
    return ((xa @ model.a + xb @ model.b - y) ** 2).mean()


def make_optimizer(model: Model, args):
    groups = [{"params": [model.a]}, {"params": [model.b], "lr": args.lr * 0.5}]
    if args.optimizer == "adam":
        return torch.optim.Adam(groups, lr=args.lr, weight_decay=args.weight_decay)
    return torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, nesterov=args.nesterov)


def lr_factor(step: int) -> float:
    """The StepLR schedule the workers follow (halve every 5 pushes)."""
    return 0.5 ** (step // 5)


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--uneven", action="store_true", help="worker m runs steps*(m+1) steps")
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--nesterov", action="store_true")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    parser.add_argument("--compensation", default="adaptive")
    parser.add_argument("--schedule", action="store_true", help="StepLR on the workers")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--out", default=None, help="folder for final weights and a start report")
    parser.add_argument("--bad", default=None, choices=["shape", "mode", "nan", "nan-skip"])
    return parser.parse_args(argv)


def main():
    args = parse_args()

    hvd.init()
    world_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    torch.manual_seed(1000 + world_rank)
    model = Model(DIM_B + 1 if args.bad == "shape" and world_rank == 2 else DIM_B)
    if hvd.is_server() and args.out:  # the server exits inside DistributedOptimizer
        atexit.register(lambda: torch.save(model.state_dict(), os.path.join(args.out, "server.pt")))
    mode = "constant" if args.bad == "mode" and world_rank == 1 else args.compensation
    optimizer = hvd.DistributedOptimizer(
        make_optimizer(model, args),
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16 else hvd.Compression.none,
        compensation=mode,
        model=model,
    )
    start = {"rank": hvd.rank(), "a": model.a.detach().tolist()[:4]}
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 5, 0.5) if args.schedule else None
    model.running.fill_(float(hvd.rank()))
    steps = args.steps * (hvd.rank() + 1) if args.uneven else args.steps
    skipped = 0
    for k in range(steps):
        optimizer.zero_grad()
        loss_on(model, *batch(hvd.rank(), k)).backward()
        if args.bad in ("nan", "nan-skip") and hvd.rank() == 1 and k == 3:
            model.b.grad[0] = float("nan")
        try:
            optimizer.step()
        except hvd.HvdDcasgdError:
            if args.bad != "nan-skip":
                raise
            skipped += 1
        if scheduler is not None:
            scheduler.step()
    hvd.shutdown()
    if args.out:
        torch.save(model.state_dict(), os.path.join(args.out, f"worker{hvd.rank()}.pt"))
        with open(os.path.join(args.out, f"start{hvd.rank()}.json"), "w") as f:
            json.dump({**start, "skipped": skipped}, f)
    print(f"worker {hvd.rank()} done: {steps} steps, {skipped} skipped", flush=True)


if __name__ == "__main__":
    main()

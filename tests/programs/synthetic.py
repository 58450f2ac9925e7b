"""A deterministic training run for the tests.

Worker m's k-th gradient is the real gradient of a least-squares loss on
batches generated from (m, k), at the weights the worker holds, so a run can
be replayed in one process from the server's trace (see ``worker_gradient``,
which both use).  Every rank initialises its model from its own seed: the
workers must start from the server's weights.
"""

import argparse
import atexit
import json
import os
import sys
import threading
import time

import torch

import hvd_dcasgd as hvd

DIM_A, DIM_B, BATCH, CLIP = 48, 16, 8, 0.5


class Model(torch.nn.Module):
    def __init__(self, dim_b=DIM_B):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(DIM_A))
        self.b = torch.nn.Parameter(torch.randn(dim_b))
        self.frozen = torch.nn.Parameter(torch.randn(3), requires_grad=False)
        self.register_buffer("running", torch.zeros(4))
        self.register_buffer("batches", torch.zeros((), dtype=torch.int64))  # an integer counter


def batch(worker: int, step: int):
    g = torch.Generator().manual_seed(7919 * worker + step)
    xa, xb = torch.randn(BATCH, DIM_A, generator=g), torch.randn(BATCH, DIM_B, generator=g)
    y = torch.randn(BATCH, generator=g)
    return xa, xb, y


def loss_on(model: Model, xa, xb, y):
    return ((xa @ model.a + xb @ model.b - y) ** 2).mean()


def backward_passes(model: Model, worker: int, step: int, args) -> None:
    """The backward pass(es) of worker's push ``step``: two accumulated with
    ``--accumulate``."""
    for i in range(2 if args.accumulate else 1):
        loss_on(model, *(t.to(model.a.device) for t in batch(worker, step + 1000 * i))).backward()


def make_optimizer(model: Model, args):
    groups = [{"params": [model.a]}, {"params": [model.b], "lr": args.lr * 0.5}]
    if args.optimizer == "adam":
        return torch.optim.Adam(groups, lr=args.lr, weight_decay=args.weight_decay)
    return torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, nesterov=args.nesterov)


def lr_factor(step: int) -> float:
    """The StepLR schedule the workers follow (halve every 5 pushes)."""
    return 0.5 ** (step // 5)


RESTORED_A = 0.25  # what --restore loads on worker 0 after wrapping


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
    parser.add_argument("--compression", default="none", choices=["none", "fp16", "bf16"])
    parser.add_argument("--lr-scaling", default="none", choices=["none", "horovod"])
    parser.add_argument("--accumulate", action="store_true", help="backward_passes_per_step=2")
    parser.add_argument("--clip", action="store_true", help="Horovod's synchronize/clip/skip_synchronize idiom")
    parser.add_argument("--restore", action="store_true", help="worker 0 loads weights after wrapping, broadcasts")
    parser.add_argument("--no-model", action="store_true", help="no model= (buffers via broadcast_parameters)")
    parser.add_argument("--after-shutdown", action="store_true", help="try to step after shutdown")
    parser.add_argument("--out", default=None, help="folder for final weights and a start report")
    parser.add_argument("--mismatch", action="append", default=[], metavar="WHAT@RANK",
                        help="this world rank set up unlike the others: shape, name, dtype, mode, lambda, "
                             "compression, groups, schedule or lr_scaling (repeatable)")
    parser.add_argument("--bad", default=None, choices=["nan", "nan-skip",
                                                        "fp16-overflow", "nan-lr", "negative-lr", "nan-unchecked",
                                                        "stall", "hang",
                                                        "exit-early", "exit-early-status", "raise-early",
                                                        "thread", "atexit-raise", "server-raise", "diverge"])
    parser.add_argument("--save-at", type=int, default=None, help="worker 0 saves model and optimizer then")
    parser.add_argument("--restarted-steps", type=int, default=None,
                        help="once SLURM has restarted the job (SLURM_RESTART_COUNT), this many steps more")
    parser.add_argument("--resumed-steps", type=int, default=None,
                        help="once resumed from a checkpoint (pushes taken before), this many steps more")
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds each step sleeps (a slow model)")
    parser.add_argument("--big", type=int, default=0, help="a frozen buffer of this many floats (big checkpoints)")
    parser.add_argument("--worker-device", default="cpu", help="the workers' model's device (cuda: a GPU worker)")
    return parser.parse_args(argv)


def main():
    args = parse_args()
    hvd.init()
    world_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    if args.out:  # for the tests that signal one rank
        with open(os.path.join(args.out, f"pid{world_rank}"), "w") as f:
            f.write(str(os.getpid()))
    torch.manual_seed(1000 + world_rank)
    odd = world_rank == 2  # the rank a --bad launch makes different
    mismatched = {what: int(rank) for what, rank in (m.split("@") for m in args.mismatch)}

    def differs(what):  # this rank is set up unlike the others in ``what`` (--mismatch)
        return mismatched.get(what) == world_rank

    model = Model(DIM_B + 1 if differs("shape") else DIM_B)
    if args.big:
        model.register_buffer("ballast", torch.zeros(args.big))
    if args.bad in ("exit-early", "exit-early-status", "raise-early") and odd:  # before DistributedOptimizer
        if args.bad == "raise-early":
            raise ValueError("no data for this rank")
        sys.exit(0 if args.bad == "exit-early" else 3)
    if args.bad == "server-raise" and hvd.is_server():
        raise RuntimeError("the server's data could not be read")
    if args.bad == "atexit-raise":
        atexit.register(lambda: 1 / 0)
    if differs("dtype"):
        model = model.double()
    named = [("z" if n == "b" and differs("name") else n, p) for n, p in model.named_parameters()]
    if hvd.is_server() and args.out:  # the server exits inside DistributedOptimizer
        name = "server.pt" if world_rank == 0 else f"server{world_rank}.pt"  # several servers: each its own
        atexit.register(lambda: torch.save(model.state_dict(), os.path.join(args.out, name)))
    if not hvd.is_server():
        model.to(args.worker_device)
    base = make_optimizer(model, args)
    if differs("groups"):
        base = torch.optim.SGD(model.parameters(), lr=args.lr)
    optimizer = hvd.DistributedOptimizer(
        base,
        named_parameters=named,
        compression=getattr(hvd.Compression, "fp16" if differs("compression") else args.compression),
        backward_passes_per_step=2 if args.accumulate else 1,
        compensation="constant" if differs("mode") else args.compensation,
        lambda_0=0.5 if differs("lambda") else None,
        schedule="sync" if differs("schedule") else None,
        lr_scaling="horovod" if differs("lr_scaling") else args.lr_scaling,
        model=None if args.no_model else model,
        check_finite=args.bad != "nan-unchecked",
    )
    start = {"rank": hvd.rank(), "a": model.a.detach().tolist()[:4], "frozen": model.frozen.tolist()}
    if args.restore and hvd.rank() == 0:
        with torch.no_grad():
            model.a.fill_(RESTORED_A)
    if args.restore or args.no_model:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 5, 0.5) if args.schedule else None
    model.running.fill_(float(hvd.rank()))
    steps = args.steps * (hvd.rank() + 1) if args.uneven else args.steps
    skipped = 0
    first = optimizer.pushes  # a resumed job skips the steps the server has already taken
    if args.restarted_steps is not None and int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0:
        steps = first + args.restarted_steps  # a job that runs until it is preempted, then finishes
    if args.resumed_steps is not None and first > 0:
        steps = first + args.resumed_steps  # the same, however it was started again (requeued, submitted again)
    print(f"worker {hvd.rank()} starts at step {first}", flush=True)
    for k in range(first, steps):
        time.sleep(args.step_time)
        if args.bad == "thread" and hvd.rank() == 1 and k == 3:
            worker = threading.Thread(target=lambda: [][1], name="loader")
            worker.start()
            worker.join()
        optimizer.zero_grad()
        backward_passes(model, hvd.rank(), k, args)
        if args.bad in ("nan", "nan-skip") and hvd.rank() == 1 and k == 3:
            model.b.grad[0] = float("nan")
        if args.bad in ("nan-lr", "negative-lr") and hvd.rank() == 1 and k == 3:
            optimizer.param_groups[1]["lr"] = float("nan") if args.bad == "nan-lr" else -0.1
        if args.bad == "stall" and hvd.rank() == 1 and k == 3:  # a slow data loader
            time.sleep(3.5)
        if args.bad == "hang" and hvd.rank() == 1 and k == 3:  # a hung data loader
            time.sleep(600)
        if args.bad == "nan-unchecked" and hvd.rank() == 1 and k == 3:  # the worker's own check is off
            model.b.grad[0] = float("nan")
        if args.bad == "diverge" and hvd.rank() == 1 and k == args.steps // 2:  # finite, the step overflows
            model.b.grad[0] = 3e38
            optimizer.param_groups[1]["lr"] = 10.0
        if args.bad == "fp16-overflow" and hvd.rank() == 1 and k == 3:
            model.b.grad[0] = 1e5  # finite, beyond float16's largest value (65504)
        try:
            if args.clip:
                optimizer.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
        except hvd.HvdDcasgdError:
            if args.bad not in ("nan-skip", "diverge"):  # diverged weights: every later gradient is NaN
                raise
            skipped += 1
        if args.save_at == k and hvd.rank() == 0:  # a checkpoint saved by the script, Horovod's way
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, os.path.join(args.out, "saved.pt"))
        if scheduler is not None:
            scheduler.step()
        model.batches += 1
    print(f"worker {hvd.rank()} finished its steps", flush=True)
    hvd.shutdown()
    if args.after_shutdown:
        try:
            optimizer.step()
        except hvd.HvdDcasgdError as error:
            print(f"worker {hvd.rank()}: {error}", flush=True)
    if args.out:
        torch.save(model.state_dict(), os.path.join(args.out, f"worker{hvd.rank()}.pt"))
        with open(os.path.join(args.out, f"start{hvd.rank()}.json"), "w") as f:
            overlapped = optimizer._session.worker.overlapped if getattr(optimizer, "_session", None) else 0
            json.dump({**start, "skipped": skipped, "overlapped": overlapped}, f)  # buckets sent in backward
    print(f"worker {hvd.rank()} done: {steps} steps, {skipped} skipped", flush=True)


if __name__ == "__main__":
    main()

"""One timed real training run of an evidence task: a Horovod-style script
that runs under plain Horovod (``--plain-horovod``: ``horovodrun -np M``,
``import horovod.torch as hvd``, allreduce) or under this project
(``mpirun -np M+1``, ``import hvd_dcasgd as hvd``: rank 0 the parameter
server, the others the workers) -- the same script, only the import changed.

    horovodrun -np 4 -H localhost:4 python benchmarks/evidence/train_mpi.py --plain-horovod --task fashion --lr 0.05 --scale 4 --warmup 1 --out run.json
    mpirun -np 5 python benchmarks/evidence/train_mpi.py --task fashion --compensation adaptive --lr 0.05 --out run.json

Every step is padded to ``--step-time`` seconds (a sleep after the
computation: M+1 processes on a few cores then measure the protocol, not
their contention for the cores); ``--stragglers PATTERN`` slows steps by
one of the patterns of :mod:`stragglers` (none, the last worker constantly,
transient stretches on every worker, heavy-tailed step times), the same
steps of the same worker for every method run with the same ``--seed``.
The rate's schedule follows the epochs each worker has taken of its shard
(its samples times M over the training set), so that a method that trains
faster reaches the rate's drops sooner.
A worker trains until it has taken its share of the schedule's epochs or
``--seconds`` of wall-clock time have passed, whichever comes first (after
the schedule nothing is left to learn from): a synchronous method's
workers (Horovod, ``sync``), which must stop at the same step, agree on it
once every ``--agree-every`` seconds' worth of padded steps (of the
unslowed step time), in one small allreduce (a blocking collective at every
step would cost each step a round of the coordination the method already
does once), so they may train up to that many steps past ``--seconds``; an
asynchronous worker stops on its own clock.  Every ``--evaluate-every`` seconds
worker 0 copies the weights it holds (a copy, not an evaluation: the clock
does not stop); after training it evaluates the copies on the test set, in
the order they were taken, and writes the curve (seconds, test error), the
final error and every worker's (samples, seconds) to ``--out``.  With
``--target E`` it stops evaluating at the first copy whose error is at most
E: the time to the target is the same, and the copies after it cost nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stragglers import PATTERNS, factors  # noqa: E402
from tasks import TASKS, rate_at  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain-horovod", action="store_true", help="import horovod.torch (run under horovodrun)")
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--compensation", default="none", help="this project's method (not with --plain-horovod)")
    parser.add_argument("--constant", type=float, default=None,
                        help="DC-ASGD's lambda_0, or Gap-Aware's gamma (default: the method's)")
    parser.add_argument("--bound", type=float, default=None, help="DC-ASGD's bound (default: the method's)")
    parser.add_argument("--epochs", type=int, default=None, help="the schedule's epochs (default: the task's)")
    parser.add_argument("--lr", type=float, required=True, help="the base rate")
    parser.add_argument("--scale", type=float, default=1.0, help="the rate's multiplier (Horovod's recipe: M)")
    parser.add_argument("--warmup", type=float, default=0.0, help="epochs of linear warm-up to the scaled rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-time", type=float, required=True, help="pad every step to this many seconds")
    parser.add_argument("--seconds", type=float, required=True, help="train this long")
    parser.add_argument("--agree-every", type=float, default=1.0,
                        help="seconds of padded steps between the synchronous workers' agreements to stop")
    parser.add_argument("--stragglers", default="none", choices=sorted(PATTERNS),
                        help="which steps take longer than --step-time, and how much (stragglers.py)")
    parser.add_argument("--evaluate-every", type=float, default=0.5, help="seconds between worker 0's copies")
    parser.add_argument("--target", type=float, default=None,
                        help="a test error (fraction): evaluate no copy after the first that reaches it")
    parser.add_argument("--cache", default="build/evidence/data", help="where the data sets are kept")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    if args.plain_horovod:
        import horovod.torch as hvd
    else:
        import hvd_dcasgd as hvd
    from hvd_dcasgd.algorithm.simulator import error_rate, worker_batches

    hvd.init()
    torch.set_num_threads(1)
    task = TASKS[args.task]
    epochs = args.epochs or task.epochs
    (x, y), _, test = task.data(Path(args.cache))
    torch.manual_seed(args.seed)
    model = task.model()
    lr_at = lambda epoch: rate_at(args.lr, epoch, epochs, args.scale, args.warmup, hvd.size())  # noqa: E731
    optimizer = torch.optim.SGD(model.parameters(), lr=lr_at(0.0))
    if args.plain_horovod:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        lockstep = True
    else:
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compensation=args.compensation,
            **({} if args.constant is None else {"gamma" if args.compensation == "gap_aware" else "lambda_0":
                                                 args.constant}),
            **({} if args.bound is None else {"bound": args.bound}), model=model,
            lr_scaling="none",  # the rate as set here: the sequential one per gradient, or the scaled one per average
        )
        lockstep = optimizer.method in ("horovod", "sync")  # a synchronous round waits for every worker
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    slowdowns = factors(args.stragglers, hvd.rank(), hvd.size(), args.seed)
    # steps between the synchronous workers' agreements to stop
    agree_every = max(1, round(args.agree_every / args.step_time)) if args.step_time > 0 else 1
    batches = worker_batches(len(y), hvd.rank(), hvd.size(), task.batch_size, 1 << 20, args.seed)
    copies, samples = [], 0
    started = time.perf_counter()
    for step, (_, batch) in enumerate(batches):
        elapsed = time.perf_counter() - started
        over = elapsed >= args.seconds or samples * hvd.size() >= epochs * len(y)
        if lockstep:  # they stop at the same step: the first agreement past the time
            over = step % agree_every == 0 and bool(
                hvd.allreduce(torch.tensor(float(over)), op=hvd.Max, name="over").item())
        if over:
            break
        if hvd.rank() == 0 and elapsed >= len(copies) * args.evaluate_every:
            copies.append((elapsed, [p.detach().clone() for p in model.parameters()]))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(samples * hvd.size() / len(y))
        computing = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x[batch]), y[batch]).backward()
        time.sleep(max(0.0, args.step_time * next(slowdowns) - (time.perf_counter() - computing)))
        optimizer.step()
        samples += len(batch)
    seconds = time.perf_counter() - started
    per_worker = hvd.allgather(torch.tensor([[samples, seconds]], dtype=torch.float64))
    rank = hvd.rank()
    hvd.shutdown()
    if rank == 0:
        torch.set_num_threads(os.cpu_count() or 1)  # the other ranks have ended: evaluate on every core
        final = error_rate(model, test)
        curve = []
        for at, weights in copies:
            with torch.no_grad():
                for p, w in zip(model.parameters(), weights):
                    p.copy_(w)
            curve.append([at, error_rate(model, test)])
            if args.target is not None and curve[-1][1] <= args.target:
                break
        curve.append([seconds, final])
        Path(args.out).write_text(json.dumps({"curve": curve, "final_error": final, "per_worker": per_worker.tolist(),
                                              "launcher": "horovod" if args.plain_horovod else "hvd_dcasgd",
                                              "target": args.target}))


if __name__ == "__main__":
    main()

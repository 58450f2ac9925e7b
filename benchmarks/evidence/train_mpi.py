"""One real training run of an evidence task under mpirun: rank 0 is the
parameter server, ranks 1..M the workers, on the simulator's batches.

    mpirun -np 5 python benchmarks/evidence/train_mpi.py --task fashion --compensation adaptive --out run.json

Each worker sends the rate the simulator's workers send (the task's schedule
at its fractional epoch, times ``--scale``, with ``--warmup``), so replaying
the server's trace in the simulator gives the same weights bit for bit.

``--step-time T --seconds S`` pads every step to T seconds (a sleep after the
computation) and trains for S seconds of wall-clock time: fast workers then
draw more batches, and 5 processes on a 2-core machine measure the protocol,
not their contention for the cores.  ``--straggler F`` makes the last
worker's steps take F times T.  The rate's schedule then follows the time.

Worker 0 evaluates the weights it holds after each of its epochs (seconds
since the start, test error) and, after ``shutdown()``, the server's final
weights; it writes them, their checksum, and every worker's (samples,
seconds) to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hvd_dcasgd as hvd  # noqa: E402
from hvd_dcasgd.simulator import checksum, error_rate, steps_per_epoch, worker_batches  # noqa: E402
from tasks import TASKS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--compensation", choices=hvd.METHODS, required=True)
    parser.add_argument("--lambda-0", type=float, default=None, help="default: the compensation's")
    parser.add_argument("--epochs", type=int, default=None, help="default: the task's")
    parser.add_argument("--lr", type=float, default=None, help="the base rate (default: the task's)")
    parser.add_argument("--scale", type=float, default=1.0, help="the rate's multiplier")
    parser.add_argument("--warmup", type=float, default=0.0, help="epochs of linear warm-up to the scaled rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-time", type=float, default=0.0, help="pad every step to this many seconds")
    parser.add_argument("--seconds", type=float, default=0.0, help="with --step-time: train this long")
    parser.add_argument("--straggler", type=float, default=1.0, help="with --step-time: the last worker's factor")
    parser.add_argument("--cache", default="build/evidence/data", help="where the data sets are kept")
    parser.add_argument("--trace", default=None, help="the server's staleness trace")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.step_time and not args.seconds:
        parser.error("--step-time needs --seconds")

    hvd.init()
    torch.set_num_threads(1)
    task = TASKS[args.task] if args.lr is None else dataclasses.replace(TASKS[args.task], lr=args.lr)
    epochs = args.epochs or task.epochs
    (x, y), _, test = task.data(Path(args.cache))
    torch.manual_seed(args.seed)
    model = task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=task.lr_at(0, epochs, args.scale, args.warmup))
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compensation=args.compensation,
        lambda_0=args.lambda_0, model=model, trace=args.trace,
        lr_scaling="none",  # the rate as set here: the sequential one per gradient, or the scaled one per average
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    timed = args.step_time > 0
    step_time = args.step_time * (args.straggler if hvd.rank() == hvd.size() - 1 else 1.0)
    per_epoch = steps_per_epoch(len(y), hvd.rank(), hvd.size(), task.batch_size)
    batches = worker_batches(len(y), hvd.rank(), hvd.size(), task.batch_size, 1 << 20 if timed else epochs, args.seed)
    # a synchronous round (allreduce, or the server's) waits for every worker: they agree when to stop
    lockstep = optimizer.method in ("horovod", "sync")
    curve, samples, current = [], 0, 0
    started = time.perf_counter()
    for step, (epoch, batch) in enumerate(batches):
        elapsed = time.perf_counter() - started
        if timed:
            over = elapsed >= args.seconds
            if lockstep:
                over = bool(hvd.allreduce(torch.tensor(float(over)), op=hvd.Max).item())
            if over:
                break
        if epoch != current:
            if hvd.rank() == 0:
                curve.append([current + 1, elapsed, error_rate(model, test)])
            current = epoch
        at = elapsed / args.seconds * epochs if timed else step / per_epoch
        for group in optimizer.param_groups:
            group["lr"] = task.lr_at(at, epochs, args.scale, args.warmup)
        computing = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x[batch]), y[batch]).backward()
        if timed:
            time.sleep(max(0.0, step_time - (time.perf_counter() - computing)))
        optimizer.step()
        samples += len(batch)
    seconds = time.perf_counter() - started
    if hvd.rank() == 0:
        curve.append([current + 1, seconds, error_rate(model, test)])
    per_worker = hvd.allgather(torch.tensor([[samples, seconds]], dtype=torch.float64))
    hvd.shutdown()
    if hvd.rank() == 0:
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        result = {
            "method_run": optimizer.method, "workers": hvd.size(), "curve": curve,
            "final_error": error_rate(model, test), "checksum": checksum(weights), "per_worker": per_worker.tolist(),
        }
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()

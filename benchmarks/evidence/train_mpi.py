"""One real training run of an evidence task under mpirun: rank 0 is the
parameter server, ranks 1..M the workers, on the simulator's batches.

    mpirun -np 5 python benchmarks/evidence/train_mpi.py --task digits --compensation adaptive --out run.json

Worker 0 evaluates the weights it holds after each of its epochs (time since
the start, test error) and, after ``shutdown()``, the server's final weights;
it writes them with every worker's (samples, seconds) to ``--out``.
``--straggler F`` makes the last worker sleep after each step so that its
steps take F times its measured compute.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hvd_dcasgd as hvd  # noqa: E402
from hvd_dcasgd.simulator import error_rate, worker_batches  # noqa: E402
from tasks import TASKS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--compensation", choices=hvd.METHODS, required=True)
    parser.add_argument("--lambda-0", type=float, default=None, help="default: the task's")
    parser.add_argument("--epochs", type=int, default=None, help="default: the task's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--straggler", type=float, default=1.0)
    parser.add_argument("--cache", default="build/evidence-data", help="where the data sets are kept")
    parser.add_argument("--trace", default=None, help="the server's staleness trace")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    task = TASKS[args.task]
    epochs = args.epochs or task.epochs
    (x, y), test = task.data(Path(args.cache))
    torch.manual_seed(args.seed)
    model = task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=task.lr_at(0, epochs))
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compensation=args.compensation,
        lambda_0=args.lambda_0 if args.lambda_0 is not None else task.lambda_0(args.compensation),
        model=model, trace=args.trace, lr_scaling="none",  # the paper's setting: the sequential rate per gradient
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    straggler = hvd.rank() == hvd.size() - 1 and args.straggler > 1.0
    curve, samples, current = [], 0, 0
    started = time.perf_counter()
    for epoch, batch in worker_batches(len(y), hvd.rank(), hvd.size(), task.batch_size, epochs, args.seed):
        if epoch != current:
            if hvd.rank() == 0:
                curve.append([current + 1, time.perf_counter() - started, error_rate(model, test)])
            current = epoch
        for group in optimizer.param_groups:
            group["lr"] = task.lr_at(epoch, epochs)
        computing = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x[batch]), y[batch]).backward()
        if straggler:
            time.sleep((args.straggler - 1.0) * (time.perf_counter() - computing))
        optimizer.step()
        samples += len(batch)
    seconds = time.perf_counter() - started
    if hvd.rank() == 0:
        curve.append([epochs, seconds, error_rate(model, test)])
    per_worker = hvd.allgather(torch.tensor([[samples, seconds]], dtype=torch.float64))
    hvd.shutdown()
    if hvd.rank() == 0:
        result = {
            "task": args.task, "method": optimizer.method, "workers": hvd.size(), "seed": args.seed,
            "epochs": epochs, "straggler": args.straggler, "curve": curve,
            "final_error": error_rate(model, test), "per_worker": per_worker.tolist(),
        }
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()

"""The pilot that fixes each task's learning rate and epochs, on the
validation split only, with sequential SGD only, before any parallel method
runs: every rate of ``RATES`` for every budget of ``EPOCHS`` (the step
schedule stretched to the budget), two pilot seeds that no evaluation run uses.

The rule: the rate with the lowest mean validation error at the task's
largest affordable budget (``AFFORDABLE``: the standard evidence run trains
about 500 models and must fit in about 45 minutes on 2 cores); then the
smallest budget whose mean validation error at that rate is within
``PLATEAU`` points of that.  The page reports how far the chosen budget is
from the best validation error of any budget at that rate (how near sequential
SGD is to its plateau).  ``tasks.py`` holds the values chosen; the results page shows
this table and checks that they agree.

    python benchmarks/evidence/pilot.py            # docs/results/pilot.json, a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Dict, List, Tuple

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from tasks import TASKS  # noqa: E402

RATES = (0.025, 0.05, 0.1, 0.2, 0.4)
EPOCHS = (5, 10, 20, 40)
SEEDS = (100, 101)
PLATEAU = 0.5  # points of validation error
AFFORDABLE = {"fashion": 20, "digits": 40}  # epochs; Fashion-MNIST's 375 steps per epoch take about 0.25 s


def pilot_run(task_name: str, lr: float, epochs: int, seed: int, cache: str) -> float:
    """Sequential SGD's final validation error (%), at rate ``lr`` for ``epochs`` epochs."""
    import dataclasses

    import torch

    from hvd_dcasgd.simulator import simulate

    torch.set_num_threads(1)
    task = dataclasses.replace(TASKS[task_name], lr=lr)
    train, validation, _ = task.data(Path(cache))
    result = simulate(task.model, train, validation, compensation="none", workers=1, epochs=epochs,
                      batch_size=task.batch_size, lr=lambda e: task.lr_at(e, epochs), seed=seed)
    return 100 * result.final_error


def choose(errors: Dict[Tuple[float, int], List[float]], affordable: int) -> Tuple[float, int]:
    """The rule of the module's docstring, on validation errors by (rate, epochs)."""
    mean = {k: sum(v) / len(v) for k, v in errors.items()}
    lr = min((rate for rate, epochs in mean if epochs == affordable), key=lambda rate: mean[rate, affordable])
    epochs = min(e for rate, e in mean
                 if rate == lr and e <= affordable and mean[rate, e] <= mean[lr, affordable] + PLATEAU)
    return lr, epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=sorted(TASKS), choices=sorted(TASKS))
    parser.add_argument("--out", default="docs/results/pilot.json")
    parser.add_argument("--work", default="build/evidence", help="the data cache")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rates", type=float, nargs="+", default=RATES, help="(the tests' smaller grid)")
    parser.add_argument("--epochs", type=int, nargs="+", default=EPOCHS, help="(the tests' smaller grid)")
    parser.add_argument("--affordable", type=int, default=None, help="default: the task's in AFFORDABLE")
    args = parser.parse_args()
    cache = str(Path(args.work) / "data")
    pilot = {}
    for name in args.tasks:
        TASKS[name].data(Path(cache))
        affordable = args.affordable or AFFORDABLE[name]
        if affordable not in args.epochs:
            parser.error(f"the affordable budget ({affordable} epochs) must be one of --epochs")
        grid = [(lr, epochs, seed) for lr in args.rates for epochs in args.epochs for seed in SEEDS]
        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
            finals = list(pool.map(pilot_run, *zip(*[(name, lr, e, s, cache) for lr, e, s in grid])))
        errors: Dict[Tuple[float, int], List[float]] = {}
        for (lr, epochs, _), error in zip(grid, finals):
            errors.setdefault((lr, epochs), []).append(error)
        lr, epochs = choose(errors, affordable)
        pilot[name] = {"rates": list(args.rates), "epochs": list(args.epochs), "seeds": list(SEEDS),
                       "plateau": PLATEAU, "affordable": affordable,
                       "validation_error": [[lr_, e, v] for (lr_, e), v in sorted(errors.items())],
                       "chosen": {"lr": lr, "epochs": epochs}}
        print(f"{name}: lr {lr}, {epochs} epochs", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(pilot, indent=1))


if __name__ == "__main__":
    main()

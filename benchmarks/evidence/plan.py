"""What the evidence runs: the methods, the scales, and the planned runs of a
scale, each described by the fields its record in ``evidence.json`` keeps and
named by a stable key (``key_of``) that says what it runs.

The plan's order is the order in which ``run.py`` starts the runs: first the
real runs whose timings the page compares, one at a time (``Run.alone``), then
every other run, and a run that reads another's output (a simulator replay of a
real run's trace, ``Run.needs``) once that run is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

from tasks import TASKS

#: The paper's five methods, in its table's order: (key, label).  ``sgd`` is
#: one worker (sequential SGD); the others are compensation modes.
METHODS = [("sgd", "SGD"), ("none", "ASGD"), ("sync", "SSGD"), ("constant", "DC-ASGD-c"), ("adaptive", "DC-ASGD-a")]
LABELS = dict(METHODS, horovod="Horovod allreduce")
ASYNC = ("none", "constant", "adaptive")
DELAY_METHODS = ("none", "adaptive")  # simulated under every delay model
STRAGGLER_METHODS = ("none", "constant", "adaptive", "sync", "horovod")  # timed with a straggler


@dataclass(frozen=True)
class Scale:
    """How much of everything to run."""

    tasks: Tuple[str, ...]
    epochs: Optional[int]  # None: each task's own
    seeds: int
    sim_workers: Tuple[int, ...]
    mpi_workers: Tuple[int, ...]
    mpi_seeds: int
    mpi_methods: Tuple[str, ...]
    lambdas: Dict[str, Tuple[float, ...]]  # the sweep, besides each task's default
    delay_models: Tuple[str, ...]  # besides round-robin, compared at the first MPI worker count
    straggler: float  # 0: no straggler runs
    bench: bool  # the server-bound end-to-end benchmark

    def epochs_of(self, task: str) -> int:
        return self.epochs or TASKS[task].epochs

    @property
    def sweep_workers(self) -> int:
        """The lambda sweep's worker count: 8 where the table has it."""
        return 8 if 8 in self.sim_workers else self.sim_workers[-1]


SCALES = {
    "full": Scale(("digits", "mnist1d"), None, 3, (4, 8, 16), (4,), 3, tuple(m for m, _ in METHODS),
                  {"constant": (0.01, 0.16, 0.64), "adaptive": (0.5, 1.0, 4.0)}, ("random", "heavy-tailed"),
                  3.0, True),
    "quick": Scale(("digits", "mnist1d"), 4, 2, (4, 8), (4,), 1, tuple(m for m, _ in METHODS),
                   {"constant": (0.64,), "adaptive": (0.5,)}, ("random", "heavy-tailed"), 3.0, False),
    # the test suite's end-to-end check: every step, at the smallest size
    "tiny": Scale(("digits",), 2, 1, (2,), (2,), 1, ("adaptive",), {"constant": (0.64,), "adaptive": (0.5,)},
                  ("heavy-tailed",), 0.0, False),
}


@dataclass(frozen=True)
class Run:
    """One planned run.  ``spec`` holds the fields of its record that say what
    it runs (``source`` says which kind: ``simulator``, ``mpi`` or ``bench``)."""

    spec: Dict
    alone: bool = False  # timed: nothing else runs meanwhile
    needs: Optional[str] = None  # the key of the real run whose trace it replays

    @property
    def key(self) -> str:
        return key_of(self.spec)


def key_of(record: Dict) -> str:
    """The run's stable name, from the fields that say what it runs, so that a
    record written before records had keys gets the same one."""
    if record["source"] == "bench":
        return "bench/end-to-end"
    run = f"{record['task']}/{record['method']}/M{record['workers']}/e{record['epochs']}/s{record['seed']}"
    if record["source"] == "mpi":
        return f"mpi/{run}/x{record['straggler']:g}"
    lambda_0 = "" if record["lambda_0"] is None else f"/lambda{record['lambda_0']:g}"
    return f"sim/{run}/{record['delay']}{lambda_0}"


def simulator_spec(task: str, method: str, workers: int, seed: int, epochs: int, lambda_0=None,
                   delay: str = "round-robin") -> Dict:
    """A simulator run (``trace`` is filled in when a replay runs)."""
    lambda_0 = TASKS[task].lambda_0(method) if lambda_0 is None else lambda_0
    return {"source": "simulator", "task": task, "method": method, "workers": 1 if method == "sgd" else workers,
            "seed": seed, "epochs": epochs, "lambda_0": lambda_0, "delay": delay, "trace": None}


def mpi_spec(task: str, method: str, workers: int, seed: int, epochs: int, straggler: float = 1.0) -> Dict:
    """A real run: ``mpirun -np workers+1`` of ``train_mpi.py``."""
    return {"source": "mpi", "task": task, "method": method, "workers": 1 if method == "sgd" else workers,
            "seed": seed, "epochs": epochs, "straggler": straggler}


def plan(scale: Scale) -> List[Run]:
    """Every run of ``scale``, in the order they start, each key once."""
    timed, untimed = real_runs(scale)
    runs = [*timed, *([Run({"source": "bench"}, alone=True)] if scale.bench else []), *untimed,
            *simulator_runs(scale), *replays(timed + untimed)]
    unique: Dict[str, Run] = {}
    for run in runs:
        unique.setdefault(run.key, run)
    return list(unique.values())


def real_runs(scale: Scale) -> Tuple[List[Run], List[Run]]:
    """The MPI runs: those whose timings the wall-clock table compares (seed
    0 of the first task and worker count, and the straggler runs), and the
    others, which share the cores with the simulator runs."""
    timed, untimed = [], []
    first = (scale.tasks[0], scale.mpi_workers[0], 0)
    for task in scale.tasks:
        for workers in scale.mpi_workers:
            for seed in range(scale.mpi_seeds):
                for method in scale.mpi_methods:
                    if method != "sgd" or workers == scale.mpi_workers[0]:
                        run = mpi_spec(task, method, workers, seed, scale.epochs_of(task))
                        wallclock = bool(scale.straggler) and (task, workers, seed) == first
                        (timed if wallclock else untimed).append(Run(run, alone=wallclock))
    if scale.straggler:
        task, workers, seed = first
        timed.append(Run(mpi_spec(task, "horovod", workers, seed, scale.epochs_of(task)), alone=True))
        timed += [Run(mpi_spec(task, m, workers, seed, scale.epochs_of(task), scale.straggler), alone=True)
                  for m in STRAGGLER_METHODS]
    return timed, untimed


def simulator_runs(scale: Scale) -> Iterator[Run]:
    """Table 1, the lambda_0 sweep and the delay models, per task and seed."""
    for task in scale.tasks:
        epochs = scale.epochs_of(task)
        for seed in range(scale.seeds):
            yield Run(simulator_spec(task, "sgd", 1, seed, epochs))
            for workers in scale.sim_workers:
                yield from (Run(simulator_spec(task, m, workers, seed, epochs)) for m, _ in METHODS[1:])
            for method, values in scale.lambdas.items():
                yield from (Run(simulator_spec(task, method, scale.sweep_workers, seed, epochs, lambda_0=v))
                            for v in values)
            for delay in scale.delay_models:
                yield from (Run(simulator_spec(task, m, scale.mpi_workers[0], seed, epochs, delay=delay))
                            for m in DELAY_METHODS)


def replays(real: List[Run]) -> List[Run]:
    """The simulator on each asynchronous real run's trace (no straggler)."""
    return [Run(simulator_spec(**{k: r.spec[k] for k in ("task", "method", "workers", "seed", "epochs")},
                               delay="trace"), needs=r.key)
            for r in real if r.spec["method"] in ASYNC and r.spec["straggler"] == 1.0]

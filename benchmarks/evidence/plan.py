"""What the evidence runs: the methods, the settings, the scales, and the
planned runs of a scale, each described by the fields its record in
``evidence.json`` keeps and named by a stable key (``key_of``).

Planning happens in two phases.  The *tuning* runs (validation split, pilot
seeds) come first; a method's tuned value (DC-ASGD's lambda_0, SSGD's rate
scale) is chosen from them by ``tuned_values``, and only then are that
method's evaluation runs planned: ``plan(scale, records)`` lists what can be
planned from the records so far, and ``run.py`` plans again after every wave.

The order is the order in which ``run.py`` starts the runs: the timed real
runs first, one at a time (``Run.alone``), then every other run; a simulator
replay of a real run's trace (``Run.needs``) once that run is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from tasks import TASKS

ASYNC = ("none", "constant", "adaptive", "staleness", "gap_aware")
SYNC = ("ssgd", "horovod", "ssgd_paper")


@dataclass(frozen=True)
class Method:
    """A row of the tables: what the server runs and how the rate is set.

    ``scale`` is a fixed multiplier of the rate as a fraction of M (the rate
    is the sequential one times ``max(1, scale * M)``: 1.0 is Horovod's
    recipe, 0.0 the paper-literal rate); ``tuned`` names the hyperparameter
    tuned on the validation split over ``grid`` (``None``: nothing tuned).  A
    tuned ``scale`` is an absolute multiplier k, capped at M: the rate is the
    sequential one times ``min(k, M)``, so the largest stable k is found once
    and a large M is not forced past it."""

    key: str
    label: str
    mode: str  # the server's compensation mode (hvd_dcasgd's `compensation=`)
    tuned: Optional[str] = None  # "lambda_0" or "scale"
    grid: Tuple[float, ...] = ()
    scale: Optional[float] = None  # fixed multiplier as a fraction of M (synchronous methods)
    warmup: bool = False


METHODS: Dict[str, Method] = {m.key: m for m in [
    Method("sgd", "SGD (M=1)", "none"),
    Method("none", "ASGD", "none"),
    Method("constant", "DC-ASGD-c", "constant", "lambda_0", (0.04, 0.16, 0.64)),
    Method("adaptive", "DC-ASGD-a", "adaptive", "lambda_0", (0.5, 2.0, 8.0)),
    Method("staleness", "staleness-aware rate", "staleness"),
    Method("gap_aware", "Gap-Aware", "gap_aware"),
    Method("ssgd", "SSGD (rate x k, warm-up, k tuned)", "sync", "scale", (1.0, 2.0, 4.0), warmup=True),
    Method("horovod", "Horovod recipe (rate x M, warm-up)", "horovod", scale=1.0, warmup=True),
    Method("ssgd_paper", "SSGD, paper-literal (rate x 1)", "sync", scale=0.0),
]}
LABELS = {key: method.label for key, method in METHODS.items()}

#: Delay settings: the event-driven ones are the main settings; round-robin
#: is the paper's reference.  ``one-slow`` runs for a fixed virtual time.
JITTER = 0.25  # log-normal sigma of a step time
SLOWDOWN = 3.0  # the straggler's step time, in units of the others'
DELAYS = {"event": "homogeneous, event-driven (jitter 0.25), fixed epochs",
          "one-slow": "one worker 3x slower, event-driven (jitter 0.25), fixed virtual time",
          "round-robin": "round-robin (every gradient M-1 updates stale), fixed epochs"}

TUNING_SEEDS = (100, 101)  # the pilot's seeds: no evaluation run uses them
STABLE_ERROR = 0.8  # a tuning run ending above this validation error (or NaN) diverged


@dataclass(frozen=True)
class Scale:
    """How much of everything to run."""

    tasks: Tuple[str, ...]
    epochs: Optional[int]  # None: each task's own
    seeds: int
    workers: Tuple[int, ...]  # the simulator's values of M
    tune_workers: Tuple[int, ...]  # where lambda_0 and SSGD's scale are tuned (the sweep plot)
    main_methods: Tuple[str, ...]  # the event-driven, fixed-epochs table
    slow_methods: Tuple[str, ...]  # with one slow worker, fixed virtual time
    reference_methods: Tuple[str, ...]  # round-robin
    mpi_workers: int
    mpi_seeds: int
    mpi_methods: Tuple[str, ...]
    timed_methods: Tuple[str, ...]  # real runs padded to a step time, with and without a straggler
    timed_repeats: int
    step_time: float  # seconds
    timed_seconds: float  # each timed run's budget
    lr: Optional[float] = None  # the base rate, when not the task's (the runs' keys then say so)

    def epochs_of(self, task: str) -> int:
        return self.epochs or TASKS[task].epochs


ALL = tuple(METHODS)
SCALES = {
    "full": Scale(("fashion",), None, 8, (4, 8, 16, 32), (8, 16), ALL,
                  ("none", "constant", "adaptive", "gap_aware", "ssgd", "horovod"), ("none", "constant", "adaptive"),
                  4, 3, ALL, ("none", "adaptive", "gap_aware", "ssgd", "horovod"), 3, 0.02, 6.0),
    "quick": Scale(("digits",), None, 4, (4, 8), (8,), ALL, ("none", "adaptive", "ssgd"), ("none", "adaptive"),
                   4, 1, ("sgd", "none", "adaptive", "ssgd"), ("none", "ssgd"), 1, 0.02, 3.0),
    # the main table, its tuning and the timed real runs again at half the pilot's rate: a sensitivity check,
    # decided after the full scale's asynchronous runs diverged at the pilot's rate (the largest of its grid);
    # the timed runs train 12 s, about 6 epochs, where the full scale's 6 s reached no method's target
    "half-rate": Scale(("fashion",), None, 8, (4, 8, 16, 32), (8, 16), ALL, (), (), 4, 0, (),
                       ("none", "adaptive", "gap_aware", "ssgd", "horovod"), 3, 0.02, 12.0, lr=0.2),
    # the test suite's end-to-end check: every step, at the smallest size
    "tiny": Scale(("digits",), 2, 2, (2,), (2,), ("sgd", "none", "adaptive", "ssgd", "horovod"), ("none", "ssgd"),
                  ("none",), 2, 1, ("adaptive",), ("none", "ssgd"), 1, 0.01, 1.5),
}


@dataclass(frozen=True)
class Run:
    """One planned run.  ``spec`` holds the fields of its record that say what
    it runs (``source`` says which kind: ``simulator`` or ``mpi``)."""

    spec: Dict
    alone: bool = False  # timed: nothing else runs meanwhile
    needs: Optional[str] = None  # the key of the real run whose trace it replays

    @property
    def key(self) -> str:
        return key_of(self.spec)


def key_of(record: Dict) -> str:
    """The run's stable name, from the fields that say what it runs."""
    run = f"{record['task']}/{record['method']}/M{record['workers']}/e{record['epochs']}/s{record['seed']}"
    settings = "".join(f"/{name}={record[name]:g}" for name in ("lr", "lambda_0", "scale", "warmup")
                       if record.get(name) is not None)
    if record["source"] == "mpi":
        timing = f"/t{record['step_time']:g}x{record['straggler']:g}r{record['repeat']}" if record["step_time"] else ""
        return f"mpi/{run}{settings}{timing}"
    return f"sim/{run}/{record['delay']}/{record['split']}{settings}"


def warmup_epochs(epochs: int) -> float:
    """Goyal et al.'s gradual warm-up, 5 of 90 epochs, in proportion, at least one."""
    return max(1.0, round(epochs * 5 / 90))


def rate_settings(method: str, workers: int, epochs: int, value: Optional[float] = None) -> Dict:
    """The spec fields that set ``method``'s rate and compensation at
    ``workers`` workers: ``lambda_0`` (DC-ASGD), ``scale`` (the rate's
    multiplier) and ``warmup`` (epochs), with ``value`` for the tuned one."""
    m = METHODS[method]
    fields = {"lambda_0": None, "scale": 1.0, "warmup": None}
    if m.tuned == "lambda_0":
        fields["lambda_0"] = value
    if m.tuned == "scale" and value is not None:
        fields["scale"] = float(min(value, workers))  # k, capped at M
    elif m.scale is not None and workers > 1:
        fields["scale"] = float(max(1.0, m.scale * workers))
    if m.warmup and fields["scale"] > 1.0:
        fields["warmup"] = warmup_epochs(epochs)
    return fields


def base_rate(lr: Optional[float]) -> Dict:
    """The ``lr`` field of a spec: present only when the scale sets the rate."""
    return {} if lr is None else {"lr": lr}


def simulator_spec(task: str, method: str, workers: int, seed: int, epochs: int, delay: str = "event",
                   split: str = "test", value: Optional[float] = None, lr: Optional[float] = None) -> Dict:
    """A simulator run (``trace`` is filled in when a replay runs)."""
    workers = 1 if method == "sgd" else workers
    return {"source": "simulator", "task": task, "method": method, "workers": workers, "seed": seed,
            "epochs": epochs, "delay": delay, "split": split, **base_rate(lr),
            **rate_settings(method, workers, epochs, value), "trace": None}


def mpi_spec(task: str, method: str, workers: int, seed: int, epochs: int, value: Optional[float] = None,
             step_time: float = 0.0, straggler: float = 1.0, repeat: int = 0, seconds: float = 0.0,
             lr: Optional[float] = None) -> Dict:
    """A real run, ``mpirun -np workers+1 train_mpi.py``; with ``step_time``,
    padded steps for ``seconds`` of wall-clock time."""
    workers = 1 if method == "sgd" else workers
    return {"source": "mpi", "task": task, "method": method, "workers": workers, "seed": seed, "epochs": epochs,
            **base_rate(lr), **rate_settings(method, workers, epochs, value), "step_time": step_time, "straggler": straggler,
            "repeat": repeat, "seconds": seconds}


# --- tuning ---------------------------------------------------------------------
def tuning_runs(scale: Scale) -> Iterator[Run]:
    """Every tuned method at every grid value, on the validation split."""
    for task in scale.tasks:
        for method in scale.main_methods:
            for value in METHODS[method].grid:
                for workers in scale.tune_workers:
                    for seed in TUNING_SEEDS:
                        yield Run(simulator_spec(task, method, workers, seed, scale.epochs_of(task), split="validation",
                                                 value=value, lr=scale.lr))


def tuning_errors(by_key: Dict[str, Dict], scale: Scale, task: str, method: str) -> Dict[float, List[float]]:
    """Final validation errors of ``method``'s tuning runs, by grid value,
    for the values whose runs are all recorded (two values may share runs:
    at a small M, the values above M are capped to the same k)."""
    found: Dict[float, List[float]] = {}
    for value in METHODS[method].grid:
        keys = [key_of(simulator_spec(task, method, workers, seed, scale.epochs_of(task), split="validation",
                                      value=value, lr=scale.lr))
                for workers in scale.tune_workers for seed in TUNING_SEEDS]
        if all(k in by_key for k in keys):
            found[value] = [by_key[k]["final_error"] for k in keys]
    return found


def tuned_values(scale: Scale, records: List[Dict]) -> Dict[Tuple[str, str], float]:
    """(task, method) -> the chosen value, for every tuned method whose
    tuning runs are all recorded: the value with the lowest mean validation
    error among the stable ones (every run below ``STABLE_ERROR``); with none
    stable, the smallest.  SSGD's k is capped at M where it is applied."""
    by_key = {r["key"]: r for r in records if "failed" not in r}
    chosen = {}
    for task in scale.tasks:
        for method in scale.main_methods:
            grid = METHODS[method].grid
            errors = tuning_errors(by_key, scale, task, method)
            if not grid or len(errors) != len(grid):
                continue
            stable = [v for v in grid if all(e == e and e < STABLE_ERROR for e in errors[v])]
            mean = {v: sum(errors[v]) / len(errors[v]) for v in grid}
            chosen[task, method] = min(stable, key=lambda v: (mean[v], v)) if stable else min(grid)
    return chosen


# --- the plan -------------------------------------------------------------------
def plan(scale: Scale, records: Sequence[Dict] = ()) -> List[Run]:
    """Every run of ``scale`` that can be planned from ``records``, in the
    order they start, each key once: the tuning runs, and the evaluation
    runs of every method whose value is known."""
    chosen = tuned_values(scale, list(records))
    timed, untimed = real_runs(scale, chosen)
    runs = [*timed, *tuning_runs(scale), *untimed, *simulator_runs(scale, chosen), *replays(untimed)]
    unique: Dict[str, Run] = {}
    for run in runs:
        unique.setdefault(run.key, run)
    return list(unique.values())


def value_of(chosen: Dict[Tuple[str, str], float], task: str, method: str) -> Tuple[bool, Optional[float]]:
    """Whether ``method`` can be planned on ``task``, and its tuned value."""
    if not METHODS[method].grid:
        return True, None
    return (task, method) in chosen, chosen.get((task, method))


def simulator_runs(scale: Scale, chosen: Dict[Tuple[str, str], float]) -> Iterator[Run]:
    """The main table, the straggler's and round-robin's, per task and seed."""
    for task in scale.tasks:
        epochs = scale.epochs_of(task)
        for seed in range(scale.seeds):
            for delay, methods in (("event", scale.main_methods), ("one-slow", scale.slow_methods),
                                   ("round-robin", scale.reference_methods)):
                for workers in scale.workers:
                    for method in methods:
                        ready, value = value_of(chosen, task, method)
                        if ready and not (method == "sgd" and delay != "event"):
                            yield Run(simulator_spec(task, method, workers, seed, epochs, delay, value=value,
                                                     lr=scale.lr))


def real_runs(scale: Scale, chosen: Dict[Tuple[str, str], float]) -> Tuple[List[Run], List[Run]]:
    """The MPI runs: the timed ones (padded steps, with and without a
    straggler, repeats interleaved) and the others (as fast as they go, the
    same epochs as the simulator)."""
    timed, untimed = [], []
    for task in scale.tasks:
        epochs = scale.epochs_of(task)
        for repeat in range(scale.timed_repeats):
            for straggler in (1.0, SLOWDOWN):
                for method in scale.timed_methods:
                    ready, value = value_of(chosen, task, method)
                    if ready:
                        timed.append(Run(mpi_spec(task, method, scale.mpi_workers, 0, epochs, value, scale.step_time,
                                                  straggler, repeat, scale.timed_seconds, scale.lr), alone=True))
        for seed in range(scale.mpi_seeds):
            for method in scale.mpi_methods:
                ready, value = value_of(chosen, task, method)
                if ready:
                    untimed.append(Run(mpi_spec(task, method, scale.mpi_workers, seed, epochs, value, lr=scale.lr)))
    return timed, untimed


def replays(real: List[Run]) -> List[Run]:
    """The simulator on each asynchronous real run's trace."""
    return [Run({**simulator_spec(r.spec["task"], r.spec["method"], r.spec["workers"], r.spec["seed"],
                                  r.spec["epochs"], "trace", lr=r.spec.get("lr")),
                 **{k: r.spec[k] for k in ("lambda_0", "scale", "warmup")}}, needs=r.key)
            for r in real if r.spec["method"] in ASYNC]

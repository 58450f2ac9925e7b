"""What the evidence runs (``docs/results/PLAN.md`` in code): the methods and
how each is tuned, the scales, and the planned runs of a scale, each described
by the fields its record in ``evidence.json`` keeps and named by a stable key
(``key_of``).

Planning happens in phases.  The *tuning* runs (validation split, tuning
seeds, every method over the common rate grid and its constant's grid at
every M) come first; each method's values are chosen from them by ``choose``,
and only then are its evaluation runs planned: ``plan(scale, records)`` lists
what can be planned from the records so far, and ``run.py`` plans again after
every wave.  The time-to-accuracy study (``study="time"``) needs the accuracy
study's tuned values and sequential SGD's test error, its target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from tasks import TASKS

CHANCE = 0.85  # a final error this high: the run learned nothing (ten balanced classes: chance is 90%)
TARGET_MARGIN = 0.02  # the time study's target: sequential SGD's mean final test error + 2 points
MOMENTUM = 0.9
MOMENTUM_GRID_FACTOR = 0.1  # momentum 0.9 multiplies the effective step by 10: its grid is the common one / 10


@dataclass(frozen=True)
class Method:
    """A row of the tables: what the server runs, its constant (tuned
    jointly with the rate over ``constants``), and how the rate is applied:
    ``rate_scale`` "M" multiplies the grid's rate by M (Horovod's recipe);
    ``sync`` methods average every worker's gradient per step and warm up."""

    key: str
    label: str
    mode: str  # the server's compensation mode (hvd_dcasgd's `compensation=`)
    constant: Optional[str] = None  # "lambda_0" or "gamma"
    constants: Tuple[float, ...] = ()
    rate_scale: str = "1"
    sync: bool = False


METHODS: Dict[str, Method] = {m.key: m for m in [
    Method("sgd", "SGD (M=1)", "none"),
    Method("none", "ASGD", "none"),
    Method("constant", "DC-ASGD-c", "constant", "lambda_0", (0.04, 0.16, 0.64)),
    Method("adaptive", "DC-ASGD-a", "adaptive", "lambda_0", (0.5, 2.0, 8.0)),
    Method("gap_aware", "Gap-Aware", "gap_aware", "gamma", (0.99, 0.999, 0.9999)),
    Method("staleness", "staleness-aware rate", "staleness"),
    Method("ssgd", "SSGD (warm-up)", "sync", sync=True),
    Method("horovod", "Horovod recipe (rate x M, warm-up)", "sync", rate_scale="M", sync=True),
]}
LABELS = {key: method.label for key, method in METHODS.items()}
#: DC-ASGD at ASGD's own best rate, only its lambda_0 tuned there: (row name, method)
AT_ASGD_RATE = {"constant@asgd": "constant", "adaptive@asgd": "adaptive"}
LABELS.update({row: f"{LABELS[method]} @ASGD rate" for row, method in AT_ASGD_RATE.items()})

JITTER = 0.25  # log-normal sigma of a step time (event-driven delays)
DELAYS = {"event": "event-driven: every step takes 1 unit times a log-normal factor (sigma 0.25); the push that "
                   "finishes first is applied first",
          "round-robin": "round-robin: every gradient exactly M-1 updates stale (the paper's analysis)"}
OPTIMIZERS = {"sgd": "plain SGD on the server (the paper's update)", "momentum": f"SGD with momentum {MOMENTUM:g}"}


@dataclass(frozen=True)
class Setting:
    """One table: an optimizer and a delay, at some M, for some methods."""

    optimizer: str
    delay: str
    workers: Tuple[int, ...]
    methods: Tuple[str, ...]
    tuned_in: Optional[Tuple[str, str]] = None  # (optimizer, delay) whose tuned values it uses; None: its own
    at_asgd_rate: bool = False  # rows of DC-ASGD at ASGD's own best rate, only lambda_0 tuned there


@dataclass(frozen=True)
class Scale:
    """How much of everything to run."""

    task: str
    seeds: int
    tuning_seeds: Tuple[int, ...]
    rates: Tuple[float, ...]  # the common grid (plain SGD), largest first
    settings: Tuple[Setting, ...]
    epochs: Optional[int] = None  # None: the task's
    constants: Dict[str, Tuple[float, ...]] = field(default_factory=dict)  # a method's grid, when not its own
    # the time-to-accuracy study: real jobs
    timed_workers: Tuple[int, ...] = ()
    timed_seeds: int = 0
    timed_methods: Tuple[str, ...] = ()  # "horovodrun" is plain Horovod; "later" the best later method
    step_time: float = 0.1
    seconds: float = 60.0
    evaluate_every: float = 0.5

    def epochs_of(self) -> int:
        return self.epochs or TASKS[self.task].epochs

    def grid(self, optimizer: str) -> Tuple[float, ...]:
        factor = MOMENTUM_GRID_FACTOR if optimizer == "momentum" else 1.0
        return tuple(round(rate * factor, 12) for rate in self.rates)

    def constants_of(self, method: str) -> Tuple[Optional[float], ...]:
        return self.constants.get(method, METHODS[method].constants) or (None,)


ALL = ("none", "constant", "adaptive", "gap_aware", "staleness", "ssgd", "horovod")
TIMED = ("horovodrun", "ssgd", "none", "adaptive", "later")
SCALES = {
    "standard": Scale("fashion", 10, (100,), (0.4, 0.2, 0.1, 0.05, 0.025, 0.0125), (
        Setting("sgd", "event", (4, 8, 16, 32), ALL, at_asgd_rate=True),
        Setting("momentum", "event", (8, 16), ("none", "adaptive", "ssgd")),
        Setting("sgd", "round-robin", (8, 16), ("none", "adaptive"), tuned_in=("sgd", "event")),
    ), timed_workers=(4, 8), timed_seeds=5, timed_methods=TIMED),
    # for trying things: its numbers are never results
    "quick": Scale("digits", 2, (100,), (0.2, 0.1, 0.05), (
        Setting("sgd", "event", (4, 8), ALL, at_asgd_rate=True),
        Setting("momentum", "event", (4,), ("none", "adaptive")),
        Setting("sgd", "round-robin", (8,), ("none", "adaptive"), tuned_in=("sgd", "event")),
    ), timed_workers=(4,), timed_seeds=2, timed_methods=TIMED, step_time=0.05, seconds=10.0),
    # the test suite's end-to-end check: every step, at the smallest size
    "tiny": Scale("digits", 2, (100,), (0.1, 0.05), (
        Setting("sgd", "event", (4,), ("none", "adaptive", "ssgd", "horovod"), at_asgd_rate=True),
        Setting("sgd", "round-robin", (4,), ("none",), tuned_in=("sgd", "event")),
    ), epochs=1, constants={"adaptive": (0.5, 2.0)}, timed_workers=(4,), timed_seeds=1,
        timed_methods=("horovodrun", "none"), step_time=0.01, seconds=2.0, evaluate_every=0.25),
}


@dataclass(frozen=True)
class Run:
    """One planned run.  ``spec`` holds the fields of its record that say what
    it runs (``source`` says which kind: ``simulator``, ``mpi`` or ``horovodrun``)."""

    spec: Dict

    @property
    def key(self) -> str:
        return key_of(self.spec)


def key_of(record: Dict) -> str:
    """The run's stable name, from the fields that say what it runs."""
    run = f"{record['task']}/{record['method']}/M{record['workers']}/e{record['epochs']}/s{record['seed']}"
    settings = "".join(f"/{name}={record[name]:g}" for name in ("lr", "constant", "scale", "warmup")
                       if record.get(name) is not None)
    if record["source"] == "simulator":
        return f"sim/{run}/{record['optimizer']}/{record['delay']}/{record['split']}{settings}"
    timing = f"/t{record['step_time']:g}x{record['straggler']:g}/until{record['seconds']:g}"
    return f"{record['source']}/{run}{settings}{timing}"


def rate_fields(method: str, workers: int, epochs: int, lr: float, constant: Optional[float]) -> Dict:
    """The spec fields that set ``method``'s rate and constant at ``workers``."""
    m = METHODS[method]
    sync = m.sync and workers > 1
    return {"lr": lr, "constant": constant, "scale": float(workers) if m.rate_scale == "M" and workers > 1 else 1.0,
            "warmup": float(max(1, round(epochs * 5 / 90))) if sync else None}


def simulator_spec(scale: Scale, method: str, workers: int, seed: int, lr: float, constant: Optional[float] = None,
                   optimizer: str = "sgd", delay: str = "event", split: str = "test") -> Dict:
    workers = 1 if method == "sgd" else workers
    epochs = scale.epochs_of()
    return {"source": "simulator", "task": scale.task, "method": method, "workers": workers, "seed": seed,
            "epochs": epochs, "optimizer": optimizer, "delay": delay, "split": split,
            **rate_fields(method, workers, epochs, lr, constant)}


def trained(record: Dict) -> bool:
    """Whether a run learned something: no NaN or Inf, and below chance."""
    return not record.get("diverged") and record["final_error"] < CHANCE


# --- tuning ---------------------------------------------------------------------
def tuning_cells(scale: Scale) -> Iterator[Tuple[str, int, str]]:
    """(optimizer, M, method) of every tuned cell; sequential SGD once per optimizer, at M=1."""
    for s in scale.settings:
        if s.tuned_in is None:
            yield s.optimizer, 1, "sgd"
            for workers in s.workers:
                for method in s.methods:
                    yield s.optimizer, workers, method


def tuning_specs(scale: Scale, optimizer: str, workers: int,
                 method: str) -> Iterator[Tuple[float, Optional[float], int, Dict]]:
    """(rate, constant, seed, spec) of every tuning run of one cell."""
    for lr in scale.grid(optimizer):
        for constant in scale.constants_of(method):
            for seed in scale.tuning_seeds:
                yield lr, constant, seed, simulator_spec(scale, method, workers, seed, lr, constant, optimizer,
                                                         split="validation")


def tuning_runs(scale: Scale) -> Iterator[Run]:
    for optimizer, workers, method in tuning_cells(scale):
        for *_, spec in tuning_specs(scale, optimizer, workers, method):
            yield Run(spec)


@dataclass(frozen=True)
class Choice:
    """A method's tuned values at one M: the rate and the constant, how they
    were chosen (``tuned``, or ``fallback`` where no grid point trained),
    whether the rate is at an edge of the grid, and the validation error (%)
    of every grid point (``None``: it did not train)."""

    lr: float
    constant: Optional[float]
    status: str
    edge: bool
    errors: Dict[Tuple[float, Optional[float]], Optional[float]]

    def width(self) -> float:
        """The width of the contiguous run of grid rates around the chosen one
        whose validation error (at its best constant) is within 1 point of
        the best, as max / min (1: only the best rate)."""
        by_rate = self.by_rate()
        rates = sorted(by_rate)
        i = rates.index(self.lr)
        best = by_rate[self.lr]
        if best is None:
            return float("nan")
        near = lambda r: by_rate[r] is not None and by_rate[r] <= best + 1.0  # noqa: E731
        low = high = i
        while low > 0 and near(rates[low - 1]):
            low -= 1
        while high < len(rates) - 1 and near(rates[high + 1]):
            high += 1
        return rates[high] / rates[low]

    def by_rate(self) -> Dict[float, Optional[float]]:
        """Each rate's validation error at its best constant."""
        found: Dict[float, Optional[float]] = {}
        for (lr, _), error in self.errors.items():
            if error is not None and (found.get(lr) is None or error < found[lr]):
                found[lr] = error
            found.setdefault(lr, None)
        return found


def choose(scale: Scale, records: Dict[str, Dict], optimizer: str, workers: int, method: str,
           lr: Optional[float] = None) -> Optional[Choice]:
    """``method``'s choice at ``workers`` from its tuning runs (``None`` until
    they are all recorded): the grid point with the lowest mean validation
    error among those whose every run trained, ties to the smaller rate and
    constant; with none trained, the smallest rate and constant, as a
    fallback.  With ``lr``, only that rate's points (DC-ASGD at ASGD's rate)."""
    errors: Dict[Tuple[float, Optional[float]], Optional[float]] = {}
    runs: Dict[Tuple[float, Optional[float]], List[Dict]] = {}
    for grid_lr, constant, _, spec in tuning_specs(scale, optimizer, workers, method):
        record = records.get(key_of(spec))
        if record is None:
            return None
        runs.setdefault((grid_lr, constant), []).append(record)
    for point, found in runs.items():
        errors[point] = (100 * sum(r["final_error"] for r in found) / len(found)
                         if all(trained(r) for r in found) else None)
    candidates = [p for p in errors if lr is None or p[0] == lr]
    stable = [p for p in candidates if errors[p] is not None]
    order = lambda p: (p[0], -1.0 if p[1] is None else p[1])  # noqa: E731
    if stable:
        point, status = min(stable, key=lambda p: (errors[p], *order(p))), "tuned"
    else:
        point, status = min(candidates, key=order), "fallback"
    grid = scale.grid(optimizer)
    return Choice(point[0], point[1], status, point[0] in (min(grid), max(grid)), errors)


def choices(scale: Scale, records: Dict[str, Dict]) -> Dict[Tuple[str, int, str], Choice]:
    """(optimizer, M, row) -> Choice for every cell whose tuning is recorded,
    with the rows of DC-ASGD at ASGD's rate where ASGD's is known."""
    chosen = {}
    for optimizer, workers, method in tuning_cells(scale):
        choice = choose(scale, records, optimizer, workers, method)
        if choice is not None:
            chosen[optimizer, workers, method] = choice
    for (optimizer, workers, method), choice in list(chosen.items()):
        if method != "none":
            continue
        for row, dc in AT_ASGD_RATE.items():
            if (optimizer, workers, dc) in chosen:
                chosen[optimizer, workers, row] = choose(scale, records, optimizer, workers, dc, lr=choice.lr)
    return chosen


def method_of(row: str) -> str:
    return AT_ASGD_RATE.get(row, row)


def rows_of(setting: Setting) -> Tuple[str, ...]:
    """The rows of a setting's table: its methods, and DC-ASGD at ASGD's rate where the setting has them."""
    extra = tuple(row for row, dc in AT_ASGD_RATE.items()
                  if setting.at_asgd_rate and dc in setting.methods and "none" in setting.methods)
    return setting.methods + extra


# --- the plan -------------------------------------------------------------------
def evaluation_spec(scale: Scale, setting: Setting, workers: int, row: str, seed: int, choice: Choice) -> Dict:
    return simulator_spec(scale, method_of(row), workers, seed, choice.lr, choice.constant, setting.optimizer,
                          setting.delay)


def evaluation_runs(scale: Scale, chosen: Dict[Tuple[str, int, str], Choice]) -> Iterator[Run]:
    for seed in range(scale.seeds):
        for setting in scale.settings:
            tuned_optimizer = (setting.tuned_in or (setting.optimizer, setting.delay))[0]
            if setting.tuned_in is None and (tuned_optimizer, 1, "sgd") in chosen:
                yield Run(evaluation_spec(scale, setting, 1, "sgd", seed, chosen[tuned_optimizer, 1, "sgd"]))
            for workers in setting.workers:
                for row in rows_of(setting):
                    choice = chosen.get((tuned_optimizer, workers, row))
                    if choice is not None:
                        yield Run(evaluation_spec(scale, setting, workers, row, seed, choice))


def plan(scale: Scale, records: Sequence[Dict] = (), study: str = "accuracy") -> List[Run]:
    """Every run of ``scale``'s ``study`` that can be planned from
    ``records``, in the order they start, each key once."""
    done = {r["key"]: r for r in records if "failed" not in r}
    chosen = choices(scale, done)
    runs = list(tuning_runs(scale)) + list(evaluation_runs(scale, chosen))
    if study == "time":
        runs = timed_runs(scale, done, chosen)
    unique: Dict[str, Run] = {}
    for run in runs:
        unique.setdefault(run.key, run)
    return list(unique.values())


# --- the time-to-accuracy study ---------------------------------------------------
def target(scale: Scale, records: Dict[str, Dict]) -> Optional[float]:
    """Sequential SGD's mean final test error (plain SGD, every evaluation
    seed) plus ``TARGET_MARGIN``; ``None`` until all of them are recorded."""
    choice = choose(scale, records, "sgd", 1, "sgd")
    if choice is None:
        return None
    setting = next(s for s in scale.settings if s.optimizer == "sgd" and s.tuned_in is None)
    found = [records.get(key_of(evaluation_spec(scale, setting, 1, "sgd", seed, choice)))
             for seed in range(scale.seeds)]
    if any(r is None for r in found):
        return None
    return round(sum(r["final_error"] for r in found) / len(found) + TARGET_MARGIN, 4)


def later_method(scale: Scale, records: Dict[str, Dict], chosen, workers: int) -> Optional[str]:
    """Gap-Aware or the staleness-aware rate, whichever has the lower mean
    test error at ``workers`` (plain SGD, event-driven); ``None`` until known."""
    setting = next(s for s in scale.settings if s.optimizer == "sgd" and s.tuned_in is None)
    means = {}
    for method in ("gap_aware", "staleness"):
        if method not in setting.methods:
            continue
        choice = chosen.get(("sgd", workers, method))
        if choice is None:
            return None
        found = [records.get(key_of(evaluation_spec(scale, setting, workers, method, seed, choice)))
                 for seed in range(scale.seeds)]
        if any(r is None for r in found):
            return None
        means[method] = sum(r["final_error"] for r in found) / len(found)
    return min(means, key=means.get) if means else None


def timed_spec(scale: Scale, method: str, workers: int, seed: int, choice: Choice, straggler: float,
               goal: float) -> Dict:
    source = "horovodrun" if method == "horovodrun" else "mpi"
    rated = "horovod" if method == "horovodrun" else method
    return {"source": source, "task": scale.task, "method": method, "workers": workers, "seed": seed,
            "epochs": scale.epochs_of(), **rate_fields(rated, workers, scale.epochs_of(), choice.lr, choice.constant),
            "step_time": scale.step_time, "straggler": straggler, "seconds": scale.seconds,
            "evaluate_every": scale.evaluate_every, "target": goal}


def timed_runs(scale: Scale, records: Dict[str, Dict], chosen) -> List[Run]:
    """Real jobs, seeds interleaved (seed, then straggler, then method),
    each at its tuned values from the accuracy study; none until the target
    is known."""
    goal = target(scale, records)
    if goal is None:
        return []
    runs = []
    for seed in range(scale.timed_seeds):
        for straggler in (1.0, 3.0):
            for workers in scale.timed_workers:
                later = later_method(scale, records, chosen, workers)
                for name in scale.timed_methods:
                    method = {"later": later, "horovodrun": "horovodrun"}.get(name, name)
                    tuned = "horovod" if method == "horovodrun" else method
                    choice = chosen.get(("sgd", workers, tuned)) if tuned else None
                    if method is not None and choice is not None:
                        runs.append(Run(timed_spec(scale, method, workers, seed, choice, straggler, goal)))
    return runs

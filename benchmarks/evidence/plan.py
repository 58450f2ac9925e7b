"""What the evidence runs (``docs/results/PLAN.md`` in code): the methods,
how each is tuned, the scales, and the planned runs of a scale, each described
by the fields its record in ``evidence.json`` keeps and named by a stable key
(``key_of``).

Planning happens in waves.  A method's tuning at one M (validation split,
every tuning seed) starts on its initial grid: three rates around its centre
(``CENTRES``) times its constants' grids.  ``tune`` reads the records of the
cells planned so far and either chooses (the eligible cell with the lowest
mean validation error) or extends the grid where the best cell sits at an
edge; only once a method's choice is final are its evaluation runs planned.
``plan(scale, records)`` lists what can be planned from the records so far,
and ``run.py`` plans again after every wave.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from tasks import TASKS

CHANCE = 0.85  # a final error this high: the run learned nothing (ten balanced classes: chance is 90%)
CHANCE_ERROR = 0.9  # the error a run that did not train counts at (intention to treat)
JITTER = 0.25  # log-normal sigma of a step time (event-driven delays)
DELAY = ("event-driven: every step takes 1 unit times a log-normal factor (sigma 0.25); the push that finishes "
         "first is applied first")
#: Tie tolerance when comparing mean validation errors (fractions): float noise is not a difference.
TIE = 1e-9


@dataclass(frozen=True)
class Method:
    """A row of the tables: what the server runs, the constants tuned jointly
    with the rate (``tuned``: the ``Compensation`` setting's name, in order),
    the settings held fixed, and how the rate is applied: ``rate_scale`` "M"
    multiplies the base rate by M (Horovod's recipe); ``sync`` methods
    average every worker's gradient per step and warm up."""

    key: str
    label: str
    mode: str  # the server's compensation mode (hvd_dcasgd's `Compensation(mode)`)
    tuned: Tuple[str, ...] = ()  # "lambda_0", "bound", "gamma"
    fixed: Tuple[Tuple[str, float], ...] = ()  # settings passed as they are, not tuned
    rate_scale: str = "1"
    sync: bool = False


METHODS: Dict[str, Method] = {m.key: m for m in [
    Method("sgd", "SGD (M=1)", "none"),
    Method("none", "ASGD", "none"),
    Method("adaptive", "bounded DC-ASGD-a", "adaptive", ("lambda_0", "bound")),
    Method("adaptive_paper", "DC-ASGD-a (paper, unbounded)", "adaptive", ("lambda_0",), (("bound", math.inf),)),
    Method("gap_aware", "Gap-Aware", "gap_aware", ("gamma",)),
    Method("ssgd", "SSGD (warm-up)", "sync", sync=True),
    Method("horovod", "Horovod recipe (rate x M, warm-up)", "sync", rate_scale="M", sync=True),
]}
#: The record field each tuned setting is kept in (``key_of`` names both fields).
FIELDS = {"lambda_0": "constant", "gamma": "constant", "bound": "bound"}
#: The initial grids of the tuned settings (a scale may replace them).
GRIDS = {"lambda_0": (2.0, 8.0, 32.0), "bound": (0.5, 1.0), "gamma": (0.999, 0.9999, 0.99999)}

#: The package's defaults before this study, fixed here: the "out of the box" cells run them at ASGD's tuned rate.
OUT_OF_THE_BOX = {"adaptive": (("lambda_0", 2.0), ("bound", 1.0)), "gap_aware": (("gamma", 0.999),)}
#: Rows beside the methods: (row, method) of the out-of-the-box cells.
DEFAULT_ROWS = {"adaptive@default": "adaptive", "gap_aware@default": "gap_aware"}
LABELS = {key: method.label for key, method in METHODS.items()}
LABELS.update({"adaptive@default": "bounded DC-ASGD-a, defaults before this study, ASGD's rate",
               "gap_aware@default": "Gap-Aware, default before this study, ASGD's rate"})

#: Design 2's tuned rates (its records: docs/results/design-2/results/evidence.json), the centre of each
#: initial rate grid; DC-ASGD-a's for both forms of it.
CENTRES: Dict[str, Dict[int, float]] = {
    "sgd": {1: 0.4},
    "none": {4: 0.2, 8: 0.1, 16: 0.025, 32: 0.0125},
    "adaptive": {4: 0.2, 8: 0.2, 16: 0.1, 32: 0.1},
    "adaptive_paper": {4: 0.2, 8: 0.2, 16: 0.1, 32: 0.1},
    "gap_aware": {4: 0.4, 8: 0.4, 16: 0.2, 32: 0.1},
    "ssgd": {4: 0.4, 8: 0.4, 16: 0.4, 32: 0.4},
    "horovod": {4: 0.2, 8: 0.05, 16: 0.025, 32: 0.0125},
}


def clean(value: float) -> float:
    """A grid value without float noise from repeated multiplication."""
    return float(f"{value:.12g}")


def step(name: str, value: float, direction: int) -> Optional[float]:
    """One grid step of setting ``name`` from ``value``, up (+1) or down (-1):
    rates x2, lambda_0 x4, bound x2, gamma's 1 - gamma /10 (up) or x10
    (down); ``None`` where the step leaves the setting's range."""
    if name == "gamma":
        gap = clean(clean(1.0 - value) * 10.0 ** -direction)
        return clean(1.0 - gap) if 0.0 < gap < 1.0 else None
    factor = {"rate": 2.0, "lambda_0": 4.0, "bound": 2.0}[name]
    return clean(value * factor ** direction)


@dataclass(frozen=True)
class Scale:
    """How much of everything to run."""

    task: str
    seeds: int  # evaluation seeds 0 .. seeds-1
    tuning_seeds: Tuple[int, ...]
    workers: Tuple[int, ...]
    methods: Tuple[str, ...]  # without "sgd", which runs once at M=1
    centres: Dict[str, Dict[int, float]]
    rate_steps: Tuple[int, ...] = (1, 0, -1)  # the initial rates: centre x 2^k
    grids: Dict[str, Tuple[float, ...]] = field(default_factory=dict)  # a setting's grid, when not GRIDS'
    extensions: int = 3  # at most this many grid extensions per dimension per (method, M)
    epochs: Optional[int] = None  # None: the task's

    def epochs_of(self) -> int:
        return self.epochs or TASKS[self.task].epochs

    def rates(self, method: str, workers: int) -> Tuple[float, ...]:
        centre = self.centres[method][1 if method == "sgd" else workers]
        return tuple(clean(centre * 2.0 ** k) for k in self.rate_steps)

    def grid(self, name: str) -> Tuple[float, ...]:
        return self.grids.get(name, GRIDS[name])


STUDY = ("none", "adaptive", "adaptive_paper", "gap_aware", "ssgd", "horovod")
SCALES = {
    "standard": Scale("fashion", 10, (100, 101, 102), (4, 8, 16, 32), STUDY, CENTRES),
    # for trying things: its numbers are never results
    "quick": Scale("digits", 2, (100, 101), (4, 8), STUDY,
                   {m: {w: 0.1 for w in (1, 4, 8)} for m in ("sgd", *STUDY)}, extensions=1),
    # the test suite's end-to-end check: every step, at the smallest size (no extension)
    "tiny": Scale("digits", 2, (100,), (4,), STUDY, {m: {1: 0.1, 4: 0.1} for m in ("sgd", *STUDY)},
                  rate_steps=(0, -1), grids={"lambda_0": (2.0,), "bound": (1.0,), "gamma": (0.999,)},
                  extensions=0, epochs=1),
}


@dataclass(frozen=True)
class Run:
    """One planned run; ``spec`` holds the fields of its record that say what it runs."""

    spec: Dict

    @property
    def key(self) -> str:
        return key_of(self.spec)


def key_of(record: Dict) -> str:
    """The run's stable name, from the fields that say what it runs."""
    run = f"{record['task']}/{record['method']}/M{record['workers']}/e{record['epochs']}/s{record['seed']}"
    settings = "".join(f"/{name}={record[name]:.12g}" for name in ("lr", "constant", "bound", "scale", "warmup")
                       if record.get(name) is not None)
    return f"{record['source']}/{run}/{record['optimizer']}/{record['delay']}/{record['split']}{settings}"


def rate_fields(method: str, workers: int, epochs: int, lr: float) -> Dict:
    """The spec fields that set ``method``'s rate at ``workers``: Horovod's
    recipe scales it by M; a synchronous method warms up over the first
    epochs (5 of 90, in proportion, at least one)."""
    m = METHODS[method]
    sync = m.sync and workers > 1
    return {"lr": lr, "scale": float(workers) if m.rate_scale == "M" and workers > 1 else 1.0,
            "warmup": float(max(1, round(epochs * 5 / 90))) if sync else None}


Point = Tuple[float, Tuple[float, ...]]  # (rate, the tuned settings' values in the method's order)


def simulator_spec(scale: Scale, method: str, workers: int, seed: int, point: Point, split: str = "test") -> Dict:
    lr, values = point
    workers = 1 if method == "sgd" else workers
    epochs = scale.epochs_of()
    settings = dict(zip(METHODS[method].tuned, values))
    return {"source": "simulator", "task": scale.task, "method": method, "workers": workers, "seed": seed,
            "epochs": epochs, "optimizer": "sgd", "delay": "event", "split": split,
            "constant": settings.get("lambda_0", settings.get("gamma")), "bound": settings.get("bound"),
            **rate_fields(method, workers, epochs, lr)}


def settings_of(record: Dict) -> Dict[str, float]:
    """The ``Compensation`` settings of a record's method: the tuned ones from
    its fields, then the method's fixed ones."""
    method = METHODS[record["method"]]
    return {**{name: record[FIELDS[name]] for name in method.tuned}, **dict(method.fixed)}


def trained(record: Dict) -> bool:
    """Whether a run learned something: no NaN or Inf, and below chance."""
    return not record.get("diverged") and record["final_error"] < CHANCE


def itt_error(record: Dict) -> float:
    """The run's final error, intention to treat: a run that did not train counts at chance (90%)."""
    return record["final_error"] if trained(record) else CHANCE_ERROR


# --- tuning ---------------------------------------------------------------------
def tuning_cells(scale: Scale) -> Iterator[Tuple[int, str]]:
    """(M, method) of every tuned cell; sequential SGD once, at M=1."""
    yield 1, "sgd"
    for workers in scale.workers:
        for method in scale.methods:
            yield workers, method


def initial_grid(scale: Scale, workers: int, method: str) -> List[Point]:
    names = METHODS[method].tuned
    return [(lr, values) for lr in scale.rates(method, workers)
            for values in itertools.product(*(scale.grid(name) for name in names))]


@dataclass(frozen=True)
class Cell:
    """A tuning cell's outcome over the tuning seeds: whether every run
    trained, and the mean validation error (%, over every seed)."""

    trained: bool
    error: float


@dataclass(frozen=True)
class Tuning:
    """A method's tuning at one M, as far as the records go.  ``cells``: every
    cell planned so far (initial grid and extensions), in the order planned;
    ``outcomes``: those whose runs are all recorded; ``extensions``: how many
    grid extensions each dimension took; ``choice``: the chosen point once
    tuning is over (``None`` while cells are unrecorded), with ``status``
    "tuned" (an eligible cell) or "fallback" (none eligible: the smallest rate
    and constants), and ``edges``: the dimensions where the last best cell
    sat at an edge that the extensions could not move (flagged on the page)."""

    method: str
    workers: int
    cells: Tuple[Point, ...]
    outcomes: Dict[Point, Cell]
    extensions: Dict[str, int]
    choice: Optional[Point] = None
    status: Optional[str] = None
    edges: Tuple[str, ...] = ()

    @property
    def names(self) -> Tuple[str, ...]:
        return ("rate", *METHODS[self.method].tuned)

    def eligible(self, point: Point) -> bool:
        """Trained, and the cell one rate step up (same constants) trained too."""
        margin = self.outcomes.get(margin_of(point))
        return self.outcomes[point].trained and margin is not None and margin.trained

    def settings(self) -> Dict[str, float]:
        """The chosen values of the tuned settings, by name."""
        return dict(zip(METHODS[self.method].tuned, self.choice[1])) if self.choice else {}


def margin_of(point: Point) -> Point:
    return step("rate", point[0], +1), point[1]


def moved(point: Point, dimension: int, value: float) -> Point:
    """``point`` with dimension ``dimension`` (0: the rate) set to ``value``."""
    if dimension == 0:
        return value, point[1]
    values = list(point[1])
    values[dimension - 1] = value
    return point[0], tuple(values)


def order(point: Point) -> Tuple:
    """Ties go to the smaller rate, then the smaller constants."""
    return (point[0], *point[1])


def tuning_records(scale: Scale, records: Dict[str, Dict], workers: int, method: str,
                   point: Point) -> Optional[List[Dict]]:
    found = [records.get(key_of(simulator_spec(scale, method, workers, seed, point, "validation")))
             for seed in scale.tuning_seeds]
    return None if any(r is None for r in found) else found


def tune(scale: Scale, records: Dict[str, Dict], workers: int, method: str) -> Tuning:
    """``method``'s tuning at ``workers``, replayed from the records, wave by wave.

    A cell *trained* when every tuning seed's run trained; it is *eligible*
    when it trained and its margin cell (rate x 2, same constants) trained.
    The *leader* is the best (lowest mean validation error, ties to smaller
    rate then constants) of the eligible cells and of the trained cells whose
    margin cell has not been run; with none, the best trained cell.  Where
    the leader's margin cell has not been run, or its value of a dimension
    is the smallest or largest of that dimension's values so far, that
    dimension is extended by one step beyond it at the leader's point, with
    the new cell's margin cell (at most ``scale.extensions`` times per
    dimension), and the leader is found again once they are recorded.  When
    nothing is left to extend, the choice is the best eligible cell
    ("tuned"), else the smallest rate and constants ("fallback"); where the
    leader still asked for an extension then, those dimensions are the
    choice's ``edges`` (a leader whose margin cell could not be run is never
    the choice, and its rate is flagged)."""
    names = ("rate", *METHODS[method].tuned)
    cells: List[Point] = list(initial_grid(scale, workers, method))
    extensions = {name: 0 for name in names}
    while True:
        outcomes: Dict[Point, Cell] = {}
        for point in cells:
            found = tuning_records(scale, records, workers, method, point)
            if found is not None:
                outcomes[point] = Cell(all(trained(r) for r in found),
                                       100 * sum(r["final_error"] for r in found) / len(found))
        state = Tuning(method, workers, tuple(cells), outcomes, dict(extensions))
        if len(outcomes) < len(cells):
            return state
        rank = lambda p: (round(outcomes[p].error, 7), *order(p))  # noqa: E731
        eligible = [p for p in cells if state.eligible(p)]
        pending = [p for p in cells if outcomes[p].trained and margin_of(p) not in outcomes]
        trained_cells = [p for p in cells if outcomes[p].trained]
        pool = eligible + pending or trained_cells
        leader = min(pool, key=rank) if pool else None
        wanted = extensions_at(leader, cells, names) if leader is not None else []
        allowed = [(d, value) for d, value in wanted if value is not None and extensions[names[d]] < scale.extensions]
        new: List[Point] = []
        for d, value in allowed:
            cell = moved(leader, d, value)
            for point in (cell, margin_of(cell)):
                if point not in cells and point not in new:
                    new.append(point)
        if new:
            for d, _ in allowed:
                extensions[names[d]] += 1
            cells += new
            continue
        edges = tuple(sorted({names[d] for d, _ in wanted}, key=names.index))
        if eligible:
            return Tuning(method, workers, tuple(cells), outcomes, dict(extensions), min(eligible, key=rank),
                          "tuned", edges)
        return Tuning(method, workers, tuple(cells), outcomes, dict(extensions), min(cells, key=order), "fallback",
                      edges)


def extensions_at(leader: Point, cells: Sequence[Point], names: Tuple[str, ...]) -> List[Tuple[int, Optional[float]]]:
    """(dimension, new value) of every extension the leader asks for: the rate
    up where its margin cell has not been run, down where its rate is the
    smallest planned; a constant up or down where its value is the largest or
    smallest planned (``None``: the step leaves the setting's range)."""
    wanted = []
    for d, name in enumerate(names):
        values = [p[0] if d == 0 else p[1][d - 1] for p in cells]
        value = leader[0] if d == 0 else leader[1][d - 1]
        up = margin_of(leader) not in cells if d == 0 else value == max(values)
        if up:
            wanted.append((d, step(name, value, +1)))
        if value == min(values):
            wanted.append((d, step(name, value, -1)))
    return wanted


def tunings(scale: Scale, records: Dict[str, Dict]) -> Dict[Tuple[int, str], Tuning]:
    """(M, method) -> its tuning so far, for every tuned cell."""
    return {(workers, method): tune(scale, records, workers, method) for workers, method in tuning_cells(scale)}


def tuning_runs(scale: Scale, tuned: Dict[Tuple[int, str], Tuning]) -> Iterator[Run]:
    for (workers, method), tuning in tuned.items():
        for point in tuning.cells:
            for seed in scale.tuning_seeds:
                yield Run(simulator_spec(scale, method, workers, seed, point, "validation"))


# --- evaluation -------------------------------------------------------------------
def method_of(row: str) -> str:
    return DEFAULT_ROWS.get(row, row)


def rows(scale: Scale) -> Tuple[str, ...]:
    """The rows of a table at one M: the methods, then the out-of-the-box cells."""
    return scale.methods + tuple(row for row, method in DEFAULT_ROWS.items() if method in scale.methods)


def evaluation_point(tuned: Dict[Tuple[int, str], Tuning], workers: int, row: str) -> Optional[Point]:
    """The point a row runs at on the test split: its method's choice; an
    out-of-the-box row, the package's defaults at ASGD's chosen rate.  ``None``
    until the tuning it needs is over."""
    if row in DEFAULT_ROWS:
        asgd = tuned.get((workers, "none"))
        if asgd is None or asgd.choice is None:
            return None
        return asgd.choice[0], tuple(value for _, value in OUT_OF_THE_BOX[DEFAULT_ROWS[row]])
    tuning = tuned.get((1 if row == "sgd" else workers, row))
    return None if tuning is None else tuning.choice


def evaluation_spec(scale: Scale, workers: int, row: str, seed: int, point: Point) -> Dict:
    return simulator_spec(scale, method_of(row), workers, seed, point)


def evaluation_runs(scale: Scale, tuned: Dict[Tuple[int, str], Tuning]) -> Iterator[Run]:
    for seed in range(scale.seeds):
        point = evaluation_point(tuned, 1, "sgd")
        if point is not None:
            yield Run(evaluation_spec(scale, 1, "sgd", seed, point))
        for workers in scale.workers:
            for row in rows(scale):
                point = evaluation_point(tuned, workers, row)
                if point is not None:
                    yield Run(evaluation_spec(scale, workers, row, seed, point))


def plan(scale: Scale, records: Sequence[Dict] = ()) -> List[Run]:
    """Every run of ``scale`` that can be planned from ``records``, in the
    order they start, each key once."""
    done = {r["key"]: r for r in records if "failed" not in r}
    tuned = tunings(scale, done)
    unique: Dict[str, Run] = {}
    for run in itertools.chain(tuning_runs(scale, tuned), evaluation_runs(scale, tuned)):
        unique.setdefault(run.key, run)
    return list(unique.values())


def initial_runs(scale: Scale) -> Dict[str, int]:
    """The runs of the initial waves, without extensions: the tuning grid's,
    and the evaluation's (every row at every M, SGD once; an out-of-the-box
    cell that turns out to be a tuned one runs once, which this count ignores)."""
    tuning = sum(len(initial_grid(scale, w, m)) * len(scale.tuning_seeds) for w, m in tuning_cells(scale))
    evaluation = scale.seeds * (1 + len(scale.workers) * len(rows(scale)))
    return {"tuning": tuning, "evaluation": evaluation, "total": tuning + evaluation}

"""The time-to-accuracy study's design in code: real jobs of
``train_mpi.py``, each method at the values the accuracy study chose, under
each straggler pattern of :mod:`stragglers`, against a target error chosen
before any timed run from the synchronous baseline's own untimed runs.

* **Methods** (:data:`TIMED`): plain Horovod under ``horovodrun`` with the
  recipe of docs/PERFORMANCE.md's sync-pace section (Open MPI's yield when
  idle, which brought it to its padding's pace), this project's ``sync`` (the
  same algorithm: at Horovod's rate), and the asynchronous methods.  Each
  runs at the point the accuracy study chose for it at that M (its rate, its
  constants): Horovod and ``sync`` at the Horovod recipe's.
* **The target**: the synchronous baseline's untimed runs are the
  simulator's runs of the Horovod recipe (``sync``, bit for bit the same
  arithmetic, counted in epochs rather than seconds) at the same M and
  epochs, on the test split, with seeds of their own
  (:attr:`TimeScale.target_seeds`).  The target is the worst of their final
  errors plus half a point, rounded up to the next half point
  (:func:`target_from`): each of them reaches it before the end of its
  schedule, and real runs, whose final errors scatter around the
  simulator's, have room to.
* **A timed run** trains until its schedule's epochs are done or
  ``seconds`` of wall-clock time have passed, its steps padded to
  ``step_time``; worker 0 copies its weights every ``evaluate_every``
  seconds; the time to target is the time of the first copy at or below the
  target (:func:`time_to_target`; ``None``: not within the run, a censored
  time).

Every run is named by a stable key (:func:`key_of`) from the fields that say
what it runs, as the accuracy study's are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from plan import METHODS, Point, rate_fields
from stragglers import pattern_named


@dataclass(frozen=True)
class Timed:
    """A method of the time study: the accuracy study's row whose chosen
    point it runs at, and how it is launched (``horovodrun``: plain Horovod;
    ``mpi``: this project, with its server's compensation ``mode``)."""

    key: str
    label: str
    row: str
    source: str
    mode: Optional[str] = None


TIMED: Dict[str, Timed] = {t.key: t for t in [
    Timed("horovod", "Horovod (horovodrun, yield when idle)", "horovod", "horovodrun"),
    Timed("sync", "SSGD (this project's sync, Horovod's rate)", "horovod", "mpi", "sync"),
    Timed("none", "ASGD", "none", "mpi", "none"),
    Timed("adaptive", "bounded DC-ASGD-a", "adaptive", "mpi", "adaptive"),
    Timed("gap_aware", "Gap-Aware", "gap_aware", "mpi", "gap_aware"),
]}
#: Open MPI's setting that brought plain Horovod to its padding's pace on this
#: machine (docs/PERFORMANCE.md, the sync-pace section): a rank waiting in MPI
#: yields its core.
HOROVOD_RECIPE = {"OMPI_MCA_mpi_yield_when_idle": "1"}


@dataclass(frozen=True)
class TimeScale:
    """How much of the time study to run."""

    task: str
    workers: Tuple[int, ...]
    patterns: Tuple[str, ...]
    methods: Tuple[str, ...]
    seeds: int  # timed seeds 0 .. seeds-1, the same for every method (paired)
    target_seeds: Tuple[int, ...]  # the untimed runs' seeds, which choose the target
    step_time: float
    seconds: float
    evaluate_every: float
    epochs: int  # the rate schedule's epochs (the accuracy study's)
    accuracy: str = "standard"  # the accuracy study's scale whose choices the methods run at
    points: Optional[Dict[str, Point]] = None  # instead, these points, by accuracy-study row (the tests')


SCALES = {
    "standard": TimeScale("fashion", (4,), ("none", "constant", "transient", "heavy"), tuple(TIMED), 5,
                          (200, 201, 202, 203, 204), step_time=0.1, seconds=120.0, evaluate_every=1.0, epochs=4),
    # the test suite's end-to-end check: its numbers are never results
    "tiny": TimeScale("digits", (2,), ("none", "constant"), ("horovod", "sync", "adaptive"), 1, (200,),
                      step_time=0.02, seconds=3.0, evaluate_every=0.5, epochs=1, accuracy="tiny",
                      points={"horovod": (0.1, ()), "adaptive": (0.1, (8.0, 1.0))}),
}


def chosen_points(scale: TimeScale, accuracy_records: Sequence[Dict]) -> Dict[Tuple[int, str], Point]:
    """(M, accuracy-study row) -> the point each timed method runs at: the
    accuracy study's choice at that M (from its records), or the scale's own
    ``points``.  A row whose tuning is not over is missing, with its runs."""
    rows = {TIMED[m].row for m in scale.methods}
    if scale.points is not None:
        return {(w, row): scale.points[row] for w in scale.workers for row in rows}
    from plan import SCALES as ACCURACY, tune

    done = {r["key"]: r for r in accuracy_records if "failed" not in r}
    chosen = {(w, row): tune(ACCURACY[scale.accuracy], done, w, row).choice for w in scale.workers for row in rows}
    return {cell: point for cell, point in chosen.items() if point is not None}


def untimed_specs(scale: TimeScale, points: Dict[Tuple[int, str], Point]) -> List[Dict]:
    """The synchronous baseline's untimed runs at each M: the simulator's
    Horovod recipe, on the test split, at the time study's epochs, with the
    target's own seeds."""
    from plan import SCALES as ACCURACY, simulator_spec

    accuracy = ACCURACY[scale.accuracy]
    specs = []
    for workers in scale.workers:
        for seed in scale.target_seeds:
            spec = simulator_spec(accuracy, "horovod", workers, seed, points[(workers, "horovod")], "test")
            specs.append({**spec, "epochs": scale.epochs, **rate_fields("horovod", workers, scale.epochs,
                                                                            spec["lr"])})
    return specs


def timed_specs(scale: TimeScale, points: Dict[Tuple[int, str], Point], targets: Dict[int, float]) -> List[Dict]:
    """Every timed run, in the order they run: seed by seed, pattern by
    pattern, every method in turn (its order rotating with the seed), so
    that the machine's drift over a sitting meets every method alike."""
    specs = []
    for seed in range(scale.seeds):
        for pattern in scale.patterns:
            for workers in scale.workers:
                turn = seed % len(scale.methods)
                for method in scale.methods[turn:] + scale.methods[:turn]:
                    point = points.get((workers, TIMED[method].row))
                    if point is not None:
                        specs.append(timed_spec(scale, method, workers, pattern, seed, point, targets[workers]))
    return specs


#: The target's slack above the worst untimed final error (a fraction: half a point).
SLACK = 0.005


def target_from(errors: Sequence[float]) -> float:
    """The target: the worst of the untimed runs' final errors (fractions)
    plus half a point, rounded up to the next half point (real runs' final
    errors scatter around the simulator's)."""
    if not errors:
        raise ValueError("no untimed run of the synchronous baseline: the target is chosen from them")
    return math.ceil((max(errors) + SLACK) * 200 - 1e-9) / 200


def time_to_target(curve: Sequence[Sequence[float]], target: float) -> Optional[float]:
    """The seconds of the first point of ``curve`` ((seconds, error) in time
    order) at or below ``target``; ``None`` when none is (censored)."""
    for seconds, error in curve:
        if error <= target:
            return seconds
    return None


def timed_spec(scale: TimeScale, method: str, workers: int, pattern: str, seed: int, point: Point,
               target: float) -> Dict:
    """The fields of a timed run's record that say what it runs."""
    timed = TIMED[method]
    pattern_named(pattern)  # an unknown pattern is refused here, before any run
    lr, values = point
    settings = dict(zip(METHODS[timed.row].tuned, values))
    return {"source": timed.source, "task": scale.task, "method": method, "workers": workers, "seed": seed,
            "epochs": scale.epochs, "pattern": pattern, "step_time": scale.step_time, "seconds": scale.seconds,
            "evaluate_every": scale.evaluate_every, "target": target,
            "constant": settings.get("lambda_0", settings.get("gamma")), "bound": settings.get("bound"),
            **rate_fields(timed.row, workers, scale.epochs, lr)}


def key_of(spec: Dict) -> str:
    """A timed run's stable name."""
    settings = "".join(f"/{name}={spec[name]:.12g}" for name in ("lr", "constant", "bound", "scale", "warmup")
                       if spec.get(name) is not None)
    return (f"{spec['source']}/{spec['task']}/{spec['method']}/M{spec['workers']}/e{spec['epochs']}/"
            f"{spec['pattern']}/s{spec['seed']}/t{spec['step_time']:g}/for{spec['seconds']:g}/"
            f"every{spec['evaluate_every']:g}/target{spec['target']:.12g}{settings}")


def options(spec: Dict, cache: str, out: str) -> List[str]:
    """``train_mpi.py``'s options for the run ``spec``."""
    given = [("--task", spec["task"]), ("--lr", spec["lr"]), ("--scale", spec["scale"]),
             ("--warmup", spec["warmup"] or 0.0), ("--epochs", spec["epochs"]), ("--seed", spec["seed"]),
             ("--step-time", spec["step_time"]), ("--seconds", spec["seconds"]),
             ("--stragglers", spec["pattern"]), ("--evaluate-every", spec["evaluate_every"]),
             ("--target", spec["target"]), ("--constant", spec["constant"]), ("--bound", spec["bound"]),
             ("--cache", cache), ("--out", out)]
    if spec["source"] == "mpi":
        given.insert(0, ("--compensation", TIMED[spec["method"]].mode))
    return [str(part) for name, value in given if value is not None for part in (name, value)]


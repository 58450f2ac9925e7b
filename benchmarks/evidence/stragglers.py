"""Straggler patterns of the time study: how much longer than the padded step
time each step of each worker takes.

Each pattern is a function registered in :data:`PATTERNS` that, given a
worker, the number of workers and the run's seed, returns the factors of
that worker's steps, one per step, as an endless iterator.  The factors come
from a generator seeded by (seed, worker) alone, so that every method run
with the same seed meets the same slowdowns at the same steps of the same
worker: the seeds are paired across methods.

* ``none``: every step takes the step time;
* ``constant``: the last worker's steps take ``factor`` (3) times as long,
  the others' the step time;
* ``transient``: each worker, independently, is slowed ``factor`` (5) times
  for stretches of steps, a fraction ``fraction`` (0.1) of its steps in all,
  the stretches ``stretch`` (10) steps long on average (a two-state Markov
  chain, started in its stationary distribution);
* ``heavy``: every step of every worker takes a Pareto factor (shape
  ``shape`` 2, scale 1: at least the step time, median 1.41 times it, its
  variance unbounded), capped at ``cap`` (50) so that one step cannot outlast
  a run.

    factors = PATTERNS["transient"](worker=2, workers=4, seed=0)
    next(factors)  # the factor of worker 2's first step
"""

from __future__ import annotations

import itertools
from typing import Callable, Dict, Iterator

import numpy as np

Pattern = Callable[..., Iterator[float]]
PATTERNS: Dict[str, Pattern] = {}


def pattern(name: str) -> Callable[[Pattern], Pattern]:
    """Register a straggler pattern under ``name``."""
    def register(function: Pattern) -> Pattern:
        PATTERNS[name] = function
        return function
    return register


def _generator(seed: int, worker: int) -> np.random.Generator:
    return np.random.default_rng([seed, worker])


@pattern("none")
def no_straggler(worker: int, workers: int, seed: int) -> Iterator[float]:
    return itertools.repeat(1.0)


@pattern("constant")
def constant(worker: int, workers: int, seed: int, factor: float = 3.0) -> Iterator[float]:
    return itertools.repeat(factor if worker == workers - 1 else 1.0)


@pattern("transient")
def transient(worker: int, workers: int, seed: int, factor: float = 5.0, fraction: float = 0.1,
              stretch: float = 10.0) -> Iterator[float]:
    rng = _generator(seed, worker)
    leave = 1.0 / stretch  # a slowed stretch ends after each step with this probability
    enter = leave * fraction / (1.0 - fraction)  # so that a fraction of the steps is slowed, in the long run
    slowed = rng.random() < fraction
    while True:
        yield factor if slowed else 1.0
        slowed = rng.random() >= leave if slowed else rng.random() < enter


@pattern("heavy")
def heavy(worker: int, workers: int, seed: int, shape: float = 2.0, cap: float = 50.0) -> Iterator[float]:
    rng = _generator(seed, worker)
    while True:
        yield min(cap, 1.0 + float(rng.pareto(shape)))  # numpy's pareto is Lomax: 1 + it is Pareto with scale 1


def pattern_named(name: str) -> Pattern:
    """The pattern registered as ``name``; a sentence naming the known ones where there is none."""
    if name not in PATTERNS:
        raise ValueError(f"straggler pattern {name!r}: choose one of {', '.join(sorted(PATTERNS))}")
    return PATTERNS[name]


def factors(name: str, worker: int, workers: int, seed: int) -> Iterator[float]:
    """The step-time factors of ``worker``'s steps under the pattern ``name``."""
    return pattern_named(name)(worker=worker, workers=workers, seed=seed)

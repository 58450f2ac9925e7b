"""The time-to-accuracy study's figures, from its records (``time_run.py``):
per straggler pattern, M and method, the images/s per worker against the
padding's bound, the fraction of runs that reached the target, the median
time to it, and the ratio of times against Horovod, paired by seed.

A run that did not reach the target within its budget has a censored time:
more than the budget.  In a ratio it counts at the budget, which makes the
ratio a bound: where only Horovod's times are censored the method's ratio is
at most the figure (it is at least that much faster); where only the
method's are, at least the figure; a seed where both are censored says
nothing and is left out.  The interval is the 95% t interval of the mean of
the log ratios (unbounded with fewer than two seeds).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from stats import mean_interval
from tasks import TASKS
from timing import time_to_target

BASELINE = "horovod"
EXACT, AT_MOST, AT_LEAST, MIXED = "exact", "at most", "at least", "a bound each way"


@dataclass(frozen=True)
class Cell:
    """One (pattern, M, method) cell's runs, summarised."""

    runs: int
    images_per_s: float  # per worker, the mean over runs of the mean over workers
    pace: float  # images_per_s over the padding's bound
    reached: int  # runs that reached the target within the budget
    median_seconds: Optional[float]  # None: the median run did not reach it (censored)


@dataclass(frozen=True)
class Ratio:
    """A method's time over Horovod's, paired by seed."""

    ratio: float
    interval: Tuple[float, float]
    seeds: int  # the seeds used (where at least one side reached the target)
    kind: str  # EXACT, AT_MOST, AT_LEAST or MIXED


def seconds_to_target(record: Dict) -> Optional[float]:
    return time_to_target(record["curve"], record["target"])


def cell(records: Sequence[Dict]) -> Cell:
    bound = TASKS[records[0]["task"]].batch_size / records[0]["step_time"]
    rates = [statistics.fmean(samples / seconds for samples, seconds in r["per_worker"]) for r in records]
    times = sorted(math.inf if t is None else t for t in map(seconds_to_target, records))
    median = statistics.median(times)
    return Cell(len(records), statistics.fmean(rates), statistics.fmean(rates) / bound,
                sum(t != math.inf for t in times), None if median == math.inf else median)


def ratio(method: Sequence[Dict], baseline: Sequence[Dict]) -> Optional[Ratio]:
    """``method``'s times over ``baseline``'s, paired by seed; ``None`` where
    no seed has a time on either side."""
    by_seed = {r["seed"]: r for r in baseline}
    logs, censored_method, censored_baseline = [], False, False
    for record in method:
        other = by_seed.get(record["seed"])
        if other is None:
            continue
        mine, theirs = seconds_to_target(record), seconds_to_target(other)
        if mine is None and theirs is None:
            continue
        censored_method |= mine is None
        censored_baseline |= theirs is None
        budget = record["seconds"]
        logs.append(math.log((budget if mine is None else mine) / (budget if theirs is None else theirs)))
    if not logs:
        return None
    kind = MIXED if censored_method and censored_baseline else AT_LEAST if censored_method \
        else AT_MOST if censored_baseline else EXACT
    mean, half = mean_interval(logs)
    interval = (0.0, math.inf) if len(logs) < 2 else (math.exp(mean - half), math.exp(mean + half))
    return Ratio(math.exp(mean), interval, len(logs), kind)


def cells(records: Sequence[Dict]) -> Dict[Tuple[str, int, str], List[Dict]]:
    """The successful records by (pattern, M, method)."""
    grouped: Dict[Tuple[str, int, str], List[Dict]] = {}
    for r in records:
        if "failed" not in r:
            grouped.setdefault((r["pattern"], r["workers"], r["method"]), []).append(r)
    return grouped

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
from pathlib import Path
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


# --- the predictions (docs/results/TIME_PLAN.md, section 8) -----------------------
HOLDS, REFUTED, UNDECIDED = "holds", "refuted", "not decided"


def below(r: Optional[Ratio], limit: float) -> str:
    """Whether a ratio lies below ``limit``: holds when its whole interval
    does, refuted when its whole interval lies above, else not decided."""
    if r is None:
        return UNDECIDED
    low, high = r.interval
    return HOLDS if high < limit else REFUTED if low > limit else UNDECIDED


def within(r: Optional[Ratio], low_limit: float, high_limit: float) -> str:
    if r is None:
        return UNDECIDED
    low, high = r.interval
    if low_limit <= low and high <= high_limit:
        return HOLDS
    return REFUTED if high < low_limit or low > high_limit else UNDECIDED


def every(verdicts: Sequence[str]) -> str:
    """All hold: holds; any refuted: refuted; else not decided."""
    return REFUTED if REFUTED in verdicts else HOLDS if all(v == HOLDS for v in verdicts) else UNDECIDED


def predictions(grouped: Dict[Tuple[str, int, str], List[Dict]], workers: int,
                seeds: int) -> List[Tuple[str, str, str]]:
    """(name, what it says, verdict) for T1 to T6 at ``workers``: a
    prediction is decided only on complete cells (``seeds`` runs each)."""
    def runs(pattern: str, method: str) -> List[Dict]:
        found = grouped.get((pattern, workers, method), [])
        return found if len(found) >= seeds else []

    def vs_horovod(pattern: str, method: str) -> Optional[Ratio]:
        return ratio(runs(pattern, method), runs(pattern, BASELINE))

    def pace_at_least(method: str) -> str:
        return UNDECIDED if not runs("none", method) else HOLDS if cell(runs("none", method)).pace >= 0.9 else REFUTED

    def reached(pattern: str, method: str, at_least: int) -> str:
        found = runs(pattern, method)
        if not found:
            return UNDECIDED
        return HOLDS if cell(found).reached >= at_least else REFUTED

    asynchronous = ("none", "adaptive", "gap_aware")
    return [
        ("T1", "no straggler: Horovod and sync train at least 0.9 of the bound",
         every([pace_at_least("horovod"), pace_at_least("sync")])),
        ("T2", "no straggler: sync's time within [0.85, 1.15] of Horovod's", within(vs_horovod("none", "sync"), 0.85, 1.15)),
        ("T3", "no straggler: bounded DC-ASGD-a's time below Horovod's", below(vs_horovod("none", "adaptive"), 1.0)),
        ("T4", "constant: Horovod reaches the target in 4 of 5 runs; each asynchronous method's ratio below 0.6",
         every([reached("constant", "horovod", 4), *(below(vs_horovod("constant", m), 0.6) for m in asynchronous)])),
        ("T5", "transient: bounded DC-ASGD-a's ratio below 0.75", below(vs_horovod("transient", "adaptive"), 0.75)),
        ("T6", "heavy: bounded DC-ASGD-a reaches the target in 5 of 5 runs, its ratio below 0.75",
         every([reached("heavy", "adaptive", 5), below(vs_horovod("heavy", "adaptive"), 0.75)])),
    ]


# --- the page's section ---------------------------------------------------------------
PATTERN_WORDS = {"none": "no straggler", "constant": "one worker constantly 3x slower",
                 "transient": "every worker slowed 5x for stretches, 10% of its steps",
                 "heavy": "heavy-tailed step times (Pareto, shape 2)"}


def _seconds(value: Optional[float], budget: float) -> str:
    return f"> {budget:g} s" if value is None else f"{value:.0f} s"


def _ratio_cells(r: Optional[Ratio]) -> List[str]:
    if r is None:
        return ["-", "-", "-"]
    low, high = r.interval
    figure = {AT_MOST: f"at most {r.ratio:.2f}", AT_LEAST: f"at least {r.ratio:.2f}",
              MIXED: f"{r.ratio:.2f} ({MIXED})"}.get(r.kind, f"{r.ratio:.2f}")
    interval = "-" if math.isinf(high) else f"[{low:.2f}, {high:.2f}]"
    return [figure, interval, str(r.seeds)]


def section_lines(evidence: Dict, plan_link: str, planned: int, seeds: int) -> List[str]:
    """The results page's section of the time study, from its records."""
    from timing import TIMED

    records = [r for r in evidence["records"] if "failed" not in r]
    failed = len(evidence["records"]) - len(records)
    grouped = cells(records)
    commits = sorted({s.get("commit") or "unknown" for s in evidence["sessions"]})
    clean = all(s.get("clean") for s in evidence["sessions"])
    lines = ["## Time to accuracy against Horovod", "",
             f"Planned in [{plan_link}]({plan_link}), committed before any timed run and revised after a first sitting "
             f"of three runs, post hoc (its section 12). {len(records)} of {planned} "
             f"timed runs recorded" + (f" ({failed} failed, rerun on resuming)" if failed else "")
             + f"; commit{'s' if len(commits) > 1 else ''} {', '.join(c[:7] for c in commits)}, "
             + ("every sitting on a clean tree" if clean else "**a sitting on a tree with uncommitted changes**")
             + "." + ("" if len(records) >= planned else " **In progress: a prediction on an incomplete cell is "
                                                          "not decided.**"), ""]
    for workers, target in sorted((int(w), t) for w, t in evidence["targets"].items()):
        untimed = sorted(r["final_error"] for r in evidence["untimed"] if r["workers"] == workers)
        lines += [f"M = {workers}: target **{target:.1%}** test error, the worst of the Horovod recipe's untimed "
                  f"final errors ({', '.join(f'{e:.2%}' for e in untimed)}) plus half a point, rounded up to half a "
                  "point.", ""]
        paces = {m: cell(grouped[("none", workers, m)]).pace for m in ("horovod", "sync")
                 if len(grouped.get(("none", workers, m), [])) >= seeds}
        compared = paces.get(BASELINE, 1.0) >= 0.9
        if not compared:
            lines += [f"Horovod trained {paces[BASELINE]:.2f} of the padding's bound with no straggler, below 0.9: "
                      "by the plan, no ratio against it is reported at this M.", ""]
        for pattern in PATTERN_WORDS:
            found = {m: grouped[(pattern, workers, m)] for m in TIMED if (pattern, workers, m) in grouped}
            if not found:
                continue
            budget = next(iter(found.values()))[0]["seconds"]
            lines += [f"**{pattern}**: {PATTERN_WORDS[pattern]}.", "",
                      "| method | runs | images/s per worker (of the padding's bound) | reached the target | "
                      "median time to target | time / Horovod's | 95% interval | seeds |", "|" + "---|" * 8]
            for method, runs in found.items():
                c = cell(runs)
                vs = None if method == BASELINE or not compared else ratio(runs, found.get(BASELINE, []))
                label = TIMED[method].label + (" (below its machine's pace)" if paces.get(method, 1.0) < 0.9 else "")
                lines.append("| " + " | ".join([label, str(c.runs), f"{c.images_per_s:.0f} "
                                                f"({c.pace:.2f})", f"{c.reached} of {c.runs}",
                                                _seconds(c.median_seconds, budget),
                                                *(["1"] + ["-", "-"] if method == BASELINE else _ratio_cells(vs))])
                             + " |")
            lines.append("")
        lines += ["Predictions ([" + plan_link + "](" + plan_link + "), section 8):", "",
                  "| | prediction | verdict |", "|---|---|---|",
                  *(f"| {name} | {says} | {verdict} |" for name, says, verdict in predictions(grouped, workers, seeds)),
                  ""]
    return lines


def write_section(out: Path) -> List[str]:
    """The section from ``out/results/time/evidence.json``; none (an empty
    list) where the study has no records yet."""
    from time_run import load
    from timing import SCALES

    path = Path(out) / "results" / "time" / "evidence.json"
    if not path.exists():
        return []
    evidence = load(path)
    scale = SCALES[evidence["scale"]]
    planned = scale.seeds * len(scale.patterns) * len(scale.methods) * len(scale.workers)
    return section_lines(evidence, "results/TIME_PLAN.md", planned, scale.seeds)

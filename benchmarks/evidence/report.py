"""The evidence's page: ``OUT/RESULTS.md`` and the plots in ``OUT/results``,
from ``OUT/results/evidence.json`` (and the pilot's ``pilot.json``) alone --
no training, a few seconds.

    python benchmarks/evidence/report.py            # docs/RESULTS.md from docs/results/evidence.json
    python benchmarks/evidence/report.py --out DIR

``run.py`` calls it after its runs; the page is a function of the records, so
running it again writes the same page.  With ``--readme`` (the default for
``--out docs``) it also rewrites the two headline lines between the markers in
the README.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from statistics import mean
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import claims  # noqa: E402
from plan import (  # noqa: E402
    ASYNC, DELAYS, LABELS, METHODS, SCALES, STABLE_ERROR, SYNC, TUNING_SEEDS, Scale, key_of, tuned_values,
    tuning_errors, warmup_epochs,
)
from plots import plots  # noqa: E402
from records import by_seed, load, select  # noqa: E402
from stats import Difference, holm, paired_difference, recovery_ratio, t_quantile  # noqa: E402
from tasks import TASKS  # noqa: E402

LATER_TARGET = 0.25  # set after the standard run, where no method reached the task's target in the timed runs' 6 s
AT_CHANCE = 0.85  # a final error this high: the run learned nothing (ten balanced classes: chance is 90%)
SENSITIVITY = "half-rate"  # the folder (next to RESULTS.md) of the sensitivity check's own page, when it ran
HEADLINE = ("<!-- results headline: written by benchmarks/evidence/report.py -->",
            "<!-- end of results headline -->")


def write_report(out: Path, readme: Optional[Path] = None) -> List[str]:
    """Write ``out/RESULTS.md`` and the plots from ``out/results/evidence.json``
    (and the headline into ``readme``); returns the plots' file names."""
    evidence = load(Path(out) / "results" / "evidence.json")
    scale = SCALES[evidence["scale"]]
    pilots = [Path(out) / "results" / "pilot.json", Path(out).parent / "results" / "pilot.json"]  # a check's: above
    pilot = next((json.loads(p.read_text()) for p in pilots if p.exists()), {})
    names = plots(evidence["records"], scale, Path(out) / "results")
    report = Report(evidence, scale, pilot)
    checks = Path(out) / SENSITIVITY / "results" / "evidence.json"
    if checks.exists():
        sensitivity = load(checks)
        report.sensitivity = Report(sensitivity, SCALES[sensitivity["scale"]], pilot)
    (Path(out) / "RESULTS.md").write_text(report.page())
    if readme is not None:
        update_readme(readme, report.headline())
    return names


def default_readme(out: Path) -> Optional[Path]:
    """This repository's README when ``out`` is its docs folder, else None."""
    root = Path(__file__).resolve().parent.parent.parent
    return root / "README.md" if Path(out).resolve() == root / "docs" else None


def update_readme(readme: Path, lines: List[str]) -> None:
    """Replace what lies between the headline markers of ``readme``."""
    text = readme.read_text()
    start, end = (re.escape(marker) for marker in HEADLINE)
    block = "\n".join([HEADLINE[0], *lines, HEADLINE[1]])
    if not re.search(start + ".*?" + end, text, re.S):
        raise ValueError(f"{readme} has no headline markers {HEADLINE}")
    readme.write_text(re.sub(start + ".*?" + end, lambda _: block, text, flags=re.S))


# --- formatting -------------------------------------------------------------
def table(header: Sequence[str], rows: List[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def ci_cell(values: Sequence[float]) -> str:
    """Mean ± the half-width of its 95% t interval (n in a sub-script-like suffix)."""
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.2f} (n=1)"
    m = mean(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return f"{m:.2f} ± {t_quantile(0.975, len(values) - 1) * sd / math.sqrt(len(values)):.2f}"


def interval(bounds: Tuple[float, float]) -> str:
    return f"[{bounds[0]:+.2f}, {bounds[1]:+.2f}]"


def p_value(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


class Comparison:
    """``worse - better`` paired by seed at every M, Holm-corrected over M."""

    def __init__(self, records: List[Dict], task: str, worse: str, better: str, workers: Sequence[int],
                 delay: str = "event"):
        self.worse, self.better = worse, better
        self.rows: List[Tuple[int, Difference]] = []
        for m in workers:
            a = errors(records, task, worse, m, delay)
            b = errors(records, task, better, m, delay)
            seeds = sorted(set(a) & set(b))
            if len(seeds) >= 2:
                self.rows.append((m, paired_difference([a[s] for s in seeds], [b[s] for s in seeds])))
        self.adjusted = dict(zip([m for m, _ in self.rows], holm([d.p for _, d in self.rows])))

    def at(self, workers: int) -> Optional[Difference]:
        return next((d for m, d in self.rows if m == workers), None)


def errors(records: List[Dict], task: str, method: str, workers: int, delay: str = "event",
           split: str = "test") -> Dict[int, float]:
    """Final test errors (%) by seed of ``method``'s simulator runs."""
    return by_seed(records, source="simulator", task=task, method=method, delay=delay, split=split,
                   workers=1 if method == "sgd" else workers)


# --- the page -------------------------------------------------------------------
class Report:
    def __init__(self, evidence: Dict, scale: Scale, pilot: Dict):
        self.records, self.sessions = evidence["records"], evidence["sessions"]
        self.scale, self.scale_name, self.pilot = scale, evidence["scale"], pilot
        self.task = scale.tasks[0]
        self.penalties = Comparison(self.records, self.task, "none", "sgd", scale.workers)
        self.verdicts: Dict[str, Dict[int, str]] = {}
        self.sensitivity: Optional["Report"] = None  # the same tables at another rate, when they ran

    def page(self) -> str:
        sections = [
            ["# Results: does delay compensation help?", "",
             "Written by `benchmarks/evidence/report.py` from `results/evidence.json`; do not edit by hand.", "",
             *self.provenance()],
            self.predictions(), self.setup(), self.main_section(), self.comparisons_section(),
            self.recovery_section(),
            # the parts this scale runs
            *([self.straggler_section()] if self.scale.slow_methods else []),
            *([self.reference_section()] if self.scale.reference_methods else []),
            *([self.real_section()] if self.scale.mpi_seeds and self.scale.mpi_methods else []),
            *([self.timed_section()] if self.scale.timed_repeats and self.scale.timed_methods else []),
            self.tuning_section(), self.verdict_section(), self.sensitivity_section(),
            self.reading_section(),
            self.commands(), self.failed_section(),
        ]
        return "\n".join(line for section in sections for line in [*section, ""]).rstrip() + "\n"

    # -- provenance and set-up
    def provenance(self) -> List[str]:
        if not self.sessions:
            return [f"{self.scale_name} scale; no session recorded."]
        first, last = self.sessions[0], self.sessions[-1]
        minutes = sum(s["seconds"] for s in self.sessions) / 60
        resumed = f" in {len(self.sessions)} sessions, each resuming the one before," if len(self.sessions) > 1 else ""
        note = "" if self.scale_name not in ("quick", "tiny") else (
            f" The {self.scale_name} scale runs fewer seeds, tasks and values of M than the standard one: its "
            "numbers show the shape of the comparison, not the evidence.")
        return [f"Generated by `{last['command']}` ({self.scale_name} scale){resumed} in {minutes:.1f} minutes "
                f"on {last['machine']}; load average before {first['load_before'][0]:.1f}, after "
                f"{last['load_after'][0]:.1f}.{note}"]

    def predictions(self) -> List[str]:
        lines = ["## What was predicted, before the runs", "",
                 "Written in `benchmarks/evidence/claims.py` and committed before the standard run started (commit "
                 "8eeef50). While it ran, before any of its results was read, the rules were made precise (refuted "
                 "takes precedence, the test's power stated) and prediction 7 was added (commit 3accc24).", ""]
        lines += [f"{i}. {text}" for i, text in enumerate(
            [claims.WITHIN_CLAIM, *(c.text for c in claims.CLAIMS), claims.GROWTH_CLAIM, claims.THROUGHPUT_CLAIM], 1)]
        return lines + ["", "The rules:", "", *(f"- {rule}" for rule in claims.RULES)]

    def setup(self) -> List[str]:
        task = TASKS[self.task]
        epochs = self.scale.epochs_of(self.task)
        sizes = "{:,} training / {:,} validation / {:,} test".format(*task.sizes)
        data = {"fashion": f"Fashion-MNIST (Debian's `dataset-fashion-mnist`), 14x14, {sizes} images (a fixed "
                           "subset of the 60,000 training images, a disjoint fixed validation split from the same "
                           "60,000, the full test set)",
                "digits": f"scikit-learn's 8x8 digits, {sizes} images"}[self.task]
        chosen = tuned_values(self.scale, self.records)
        rows = []
        for key, method in METHODS.items():
            if key not in self.scale.main_methods:
                continue
            value = chosen.get((self.task, key))
            how = {"lambda_0": f"lambda_0 = {value:g} (tuned)" if value is not None else "lambda_0: not tuned yet",
                   "scale": f"rate x min(k, M), k = {value:g} (tuned), warm-up" if value is not None else "not tuned yet"
                   }.get(method.tuned, "")
            if key == "horovod":
                how = "rate x M, warm-up (Horovod's docs)"
            elif key == "ssgd_paper":
                how = "rate x 1, no warm-up"
            elif key == "adaptive":
                how += ", MeanSquare momentum 0.95, eps 1e-7"
            elif key == "gap_aware":
                how = "no hyperparameter tuned (see `hvd_dcasgd/compensation.py`)"
            elif key == "staleness":
                how = "rate / max(1, staleness)"
            rows.append([method.label, f"`{method.mode}`", how])
        return [
            "## Set-up", "",
            f"Task: {data}. Model: `{task.model.__name__}` (`benchmarks/evidence/tasks.py`). Plain SGD on the "
            f"server (no momentum, no weight decay, the paper's update); batch {task.batch_size} per worker; "
            f"{epochs} epochs (an epoch is one pass over the training set by all workers together); rate "
            f"{self.scale.lr or task.lr:g}"
            + (f" (half the pilot's {task.lr:g}: a check decided after the standard run's asynchronous runs "
               "diverged at the pilot's rate)" if self.scale.lr else "") + f", divided by 10 at 50% and 75% of the epochs, each worker sending the rate of its own "
            "fractional epoch. The rate and the epochs come from the pilot below (sequential SGD on the validation "
            "split only, before any parallel run).", "",
            table(["method", "server mode", "rate and hyperparameters"], rows), "",
            f"Warm-up: the rate rises linearly from the sequential rate to the scaled one over the first "
            f"{warmup_epochs(epochs):g} epoch(s) (Goyal et al.'s 5 of 90 epochs, in proportion, at least one). "
            f"Tuned values: the lowest mean validation error over pilot seeds {', '.join(map(str, TUNING_SEEDS))} at "
            f"M = {', '.join(map(str, self.scale.tune_workers))}, among the values whose runs all stayed below "
            f"{100 * STABLE_ERROR:.0f}% error (SSGD's multiplier k over {', '.join(f'{v:g}' for v in METHODS['ssgd'].grid)}, "
            "capped at M where it is applied, so that a large M is not forced past the largest stable rate). "
            f"Evaluation seeds 0 to {self.scale.seeds - 1}: a seed fixes the initial weights, every worker's "
            "batches and the delays, so the methods are compared paired.", "",
            "Delays (`hvd_dcasgd.simulator`): " + "; ".join(f"**{name}**: {text}" for name, text in DELAYS.items())
            + ". The simulator runs M virtual workers against the project's own `ParameterServer` on MPI windows "
            "of one rank; the real runs are `mpirun -np M+1 python benchmarks/evidence/train_mpi.py`.",
            "", *self.pilot_lines(),
        ]

    def pilot_lines(self) -> List[str]:
        pilot = self.pilot.get(self.task)
        if not pilot:
            return ["No pilot recorded for this task (`python benchmarks/evidence/pilot.py`)."]
        task = TASKS[self.task]
        grid: Dict[Tuple[float, int], float] = {(lr, e): mean(v) for lr, e, v in pilot["validation_error"]}
        rows = [[f"{lr:g}", *(f"{grid[lr, e]:.2f}" for e in pilot["epochs"])] for lr in pilot["rates"]]
        chosen = pilot["chosen"]
        agrees = (chosen["lr"], chosen["epochs"]) == (task.lr, task.epochs)
        best = min(grid[chosen["lr"], e] for e in pilot["epochs"])
        return [
            f"### The pilot: sequential SGD's validation error (%), mean of seeds "
            f"{', '.join(map(str, pilot['seeds']))}", "",
            table(["rate \\ epochs", *map(str, pilot["epochs"])], rows), "",
            f"Rule (`benchmarks/evidence/pilot.py`): the rate with the lowest validation error at the largest "
            f"affordable budget ({pilot['affordable']} epochs), then the fewest epochs within {pilot['plateau']} "
            f"points of it: rate {chosen['lr']:g}, {chosen['epochs']} epochs"
            + (" (the values in `tasks.py`)." if agrees else
               f" -- **`tasks.py` holds rate {task.lr:g}, {task.epochs} epochs instead**.")
            + f" At that rate sequential SGD's validation error is {grid[chosen['lr'], chosen['epochs']] - best:.2f} "
            "points above the best of any budget in the pilot: how far it stands from its plateau."
            + (" The rate chosen is the largest of the grid: a larger one might do better still."
               if chosen["lr"] == max(pilot["rates"]) else ""),
        ]

    # -- the main table and its comparisons
    def main_section(self) -> List[str]:
        lines = ["## Final test error (%), event-driven delays, fixed epochs", "",
                 f"Mean ± half-width of the 95% t interval over {self.scale.seeds} paired seeds. "
                 f"Sequential SGD: {ci_cell(list(errors(self.records, self.task, 'sgd', 1).values()))}. "
                 "The paper (CIFAR-10, ResNet-20): M=4 ASGD 9.27, SSGD 9.17, DC-ASGD-c 8.67, DC-ASGD-a 8.19; "
                 "M=8 10.26, 10.10, 9.27, 8.57; sequential 8.65.", ""]
        methods = [m for m in self.scale.main_methods if m != "sgd"]
        rows = [[str(w), *(ci_cell(list(errors(self.records, self.task, m, w).values()))
                           + diverged_note(self.records, self.task, m, w) for m in methods)]
                for w in self.scale.workers]
        return lines + [table(["M", *(LABELS[m] for m in methods)], rows), "",
                        "(k of n diverged): runs whose weights became NaN or Inf (the server refused the gradient "
                        "that held them); they count at chance, 90% error. Curves leave them out.", "",
                        f"![error against epochs](results/error_vs_epoch_{self.task}.png)"]

    def comparisons(self) -> List[Tuple[str, Comparison]]:
        pairs = [("ASGD's penalty: ASGD - SGD", self.penalties)]
        for claim in claims.CLAIMS:
            if claim.setting == "event" and {claim.worse, claim.better} <= set(self.scale.main_methods):
                pairs.append((f"{LABELS[claim.worse]} - {LABELS[claim.better]}",
                              Comparison(self.records, self.task, claim.worse, claim.better, self.scale.workers)))
        if "ssgd" in self.scale.main_methods and "horovod" in self.scale.main_methods:
            pairs.append(("Horovod recipe - tuned SSGD",
                          Comparison(self.records, self.task, "horovod", "ssgd", self.scale.workers)))
        pairs.append(("DC-ASGD-a - SGD", Comparison(self.records, self.task, "adaptive", "sgd", self.scale.workers)))
        return pairs

    def comparisons_section(self) -> List[str]:
        rows = []
        for name, comparison in self.comparisons():
            for m, d in comparison.rows:
                rows.append([name, m, f"{d.mean:+.2f}", interval(d.t_interval), interval(d.bootstrap_interval),
                             p_value(d.wilcoxon_p), p_value(d.sign_p), p_value(comparison.adjusted[m])])
        return ["## Paired differences (percentage points; positive: the second method ends lower)", "",
                table(["difference", "M", "mean", "95% t interval", "95% bootstrap", "Wilcoxon p", "sign p",
                       "Holm p"], rows)]

    def recovery_section(self) -> List[str]:
        rows = []
        for method in ("adaptive", "constant", "gap_aware", "staleness"):
            if method not in self.scale.main_methods:
                continue
            for w in self.scale.workers:
                asgd, dc, sgd = (errors(self.records, self.task, m, w) for m in ("none", method, "sgd"))
                seeds = sorted(set(asgd) & set(dc) & set(sgd))
                penalty = self.penalties.at(w)
                if len(seeds) < 2 or penalty is None:
                    continue
                if not claims.penalty_shown(penalty.t_interval, penalty.mean):
                    rows.append([LABELS[method], w, "not computed", f"(ASGD's penalty {penalty.mean:+.2f} "
                                 f"{interval(penalty.t_interval)}: nothing to recover)"])
                    continue
                r = recovery_ratio([asgd[s] for s in seeds], [dc[s] for s in seeds], [sgd[s] for s in seeds])
                rows.append([LABELS[method], w, f"{r.value:.2f}", interval(r.interval)])
        return ["## Recovery ratio R = (ASGD - method) / (ASGD - SGD)", "",
                "R = 1: the method recovers all of ASGD's loss against sequential SGD; 0: none of it; 95% "
                "bootstrap interval over seeds. Computed only where ASGD's penalty is shown (the rules above).", "", table(["method", "M", "R", "95% interval"], rows), "",
                "![recovery ratio](results/recovery_ratio.png)"]

    def straggler_section(self) -> List[str]:
        methods = list(self.scale.slow_methods)
        rows = []
        for w in self.scale.workers:
            asgd = [r for r in select(self.records, source="simulator", task=self.task, method="none", workers=w,
                                      delay="one-slow") if "samples" in r]
            base = mean(r["samples"] for r in asgd) if asgd else None
            cells = []
            for m in methods:
                found = select(self.records, source="simulator", task=self.task, method=m, workers=w,
                               delay="one-slow")
                counted = [r["samples"] for r in found if "samples" in r]
                share = f" ({mean(counted) / base:.2f})" if counted and base else ""
                cells.append(ci_cell([100 * r["final_error"] for r in found]) + share
                             + diverged_note(self.records, self.task, m, w, "one-slow"))
            rows.append([str(w), *cells])
        claim = next(c for c in claims.CLAIMS if c.setting == "one-slow")
        comparison = Comparison(self.records, self.task, claim.worse, claim.better, self.scale.workers, "one-slow")
        self.record_verdicts(claim.key, comparison, penalty=False)
        diffs = [[m, f"{d.mean:+.2f}", interval(d.t_interval), p_value(comparison.adjusted[m]),
                  self.verdicts[claim.key][m]] for m, d in comparison.rows]
        return ["## One worker 3x slower, fixed virtual time", "",
                "Final test error (%) after a virtual time of the epochs above times a fast worker's steps per "
                "epoch (a step takes 1 unit on average before jitter, the straggler's 3; with the jitter a "
                "homogeneous run needs about 3% longer for the epochs); in brackets the training examples "
                "processed, relative to ASGD's.", "",
                table(["M", *(LABELS[m] for m in methods)], rows), "",
                f"{LABELS[claim.worse]} - {LABELS[claim.better]}, paired:", "",
                table(["M", "mean", "95% t interval", "Holm p", "verdict"], diffs), "",
                f"![error against virtual time](results/error_vs_time_{self.task}.png)"]

    def reference_section(self) -> List[str]:
        methods = list(self.scale.reference_methods)
        rows = [[str(w), *(ci_cell(list(errors(self.records, self.task, m, w, "round-robin").values()))
                           + diverged_note(self.records, self.task, m, w, "round-robin") for m in methods)]
                for w in self.scale.workers]
        return ["## The paper's reference delays: round-robin (every gradient M-1 updates stale)", "",
                table(["M", *(LABELS[m] for m in methods)], rows)]

    # -- the real system
    def real_section(self) -> List[str]:
        w = self.scale.mpi_workers
        rows = []
        for m in self.scale.mpi_methods:
            real = [r for r in select(self.records, source="mpi", task=self.task, method=m, step_time=0.0)]
            seeds = sorted(r["seed"] for r in real)
            simulated = errors(self.records, self.task, m, w)
            replays = {r["seed"]: r for r in select(self.records, source="simulator", task=self.task, method=m,
                                                    delay="trace")}
            replayable = [r for r in real if not r.get("diverged")]
            same = sum(1 for r in replayable if r["seed"] in replays
                       and replays[r["seed"]].get("checksum") == r["checksum"])
            diverged = len(real) - len(replayable)
            rows.append([LABELS[m], ci_cell([100 * r["final_error"] for r in real]),
                         ci_cell([simulated[s] for s in seeds if s in simulated]),
                         f"{same} of {len(replayable)}" + (f" ({diverged} diverged: no trace)" if diverged else "")
                         if m in ASYNC else
                         "(one worker: no replay)" if m == "sgd" else "(synchronous: no replay)"])
        return ["## The real system against the simulator (M=%d)" % w, "",
                "Final test error (%) of the real MPI runs (as fast as they go) and of the event-driven simulator "
                "on the same seeds; each asynchronous real run's server trace replayed in the simulator "
                "(`TraceOrder`) on the same batches and initial weights, compared by a SHA-256 of the final "
                "weights. The real runs that are not timed share the cores with the simulator's processes, which "
                "changes their order of pushes as any load would; the replays show that nothing else changes.", "",
                table(["method", "real MPI", "simulator (event-driven)", "replays bit-identical"], rows), "",
                "![staleness](results/staleness.png)"]

    def timed_section(self) -> List[str]:
        rows, retention_rows = [], []
        target = TASKS[self.task].target_error
        for m in self.scale.timed_methods:
            by_straggler = {}
            for straggler in (1.0, 3.0):
                found = [r for r in select(self.records, source="mpi", task=self.task, method=m)
                         if r["step_time"] and r["straggler"] == straggler and not r.get("diverged")]
                if not found:
                    continue
                rates = {r["repeat"]: sum(s for s, _ in r["per_worker"]) / max(t for _, t in r["per_worker"])
                         for r in found}
                by_straggler[straggler] = rates
                rows.append([LABELS[m], f"{straggler:g}x", len(found),
                             f"{mean(rates.values()):.0f} ({min(rates.values()):.0f}-{max(rates.values()):.0f})",
                             seconds_to(found, target), seconds_to(found, LATER_TARGET),
                             ci_cell([100 * r["final_error"] for r in found])])
            pairs = sorted(set(by_straggler.get(1.0, {})) & set(by_straggler.get(3.0, {})))
            if pairs:
                ratio = mean(by_straggler[3.0][k] / by_straggler[1.0][k] for k in pairs)
                predicted = claims.predicted_retention(m in SYNC, self.scale.mpi_workers)
                close = abs(ratio - predicted) <= claims.THROUGHPUT_TOLERANCE
                retention_rows.append([LABELS[m], f"{predicted:.2f}", f"{ratio:.2f}",
                                       "as predicted" if close else f"off by {ratio - predicted:+.2f}"])
        task = TASKS[self.task]
        return ["## Time that means something: real runs padded to a step time", "",
                f"M={self.scale.mpi_workers}, every step padded to {1000 * self.scale.step_time:.0f} ms (a sleep after "
                f"the computation, so that {self.scale.mpi_workers + 1} processes on this machine's cores measure the "
                f"protocol), {self.scale.timed_seconds:g} s of training, the schedule following the time; with a "
                f"straggler the last worker's steps take 3 times as long. {self.scale.timed_repeats} repeats, "
                "interleaved (repeat, then straggler, then method), one at a time. samples/s: all workers' samples "
                "over the longest worker's time, mean (min-max); seconds to the target: the first of worker 0's "
                f"evaluations (after each of its epochs) at or below {100 * task.target_error:.0f}% test error.", "",
                f"The first target was set before the runs; the second, {100 * LATER_TARGET:.0f}%, after seeing the "
                "standard run, where no method reached the first within its 6 s.", "",
                table(["method", "straggler", "runs", "samples/s", f"s to {100 * target:.0f}%",
                       f"s to {100 * LATER_TARGET:.0f}% (set after the standard run)", "final error %"], rows),
                "", "Throughput kept with the straggler (samples/s with it over without, paired by repeat):", "",
                table(["method", "predicted", "measured", "verdict"], retention_rows)]

    def tuning_section(self) -> List[str]:
        rows = []
        chosen = tuned_values(self.scale, self.records)
        by_key = {r["key"]: r for r in self.records if "failed" not in r}
        for key, method in METHODS.items():
            if not method.grid or key not in self.scale.main_methods:
                continue
            found = tuning_errors(by_key, self.scale, self.task, key)
            for value in method.grid:
                errs = found.get(value)
                rows.append([method.label, method.tuned, f"{value:g}",
                             f"{100 * mean(errs):.2f}" if errs else "not run",
                             "chosen" if chosen.get((self.task, key)) == value else ""])
        return ["## Tuning on the validation split", "",
                f"Mean final validation error (%) over seeds {', '.join(map(str, TUNING_SEEDS))} and M = "
                f"{', '.join(map(str, self.scale.tune_workers))}; each method tuned over three values (SSGD's "
                "multiplier k of the rate, capped at M).", "", table(["method", "tuned", "value", "validation error", ""], rows), "",
                "![tuning sweep](results/lambda_sweep.png)"]

    # -- verdicts
    def record_verdicts(self, key: str, comparison: Comparison, penalty: bool) -> None:
        verdicts = {}
        for m, d in comparison.rows:
            shown = True
            if penalty:
                p = self.penalties.at(m)
                shown = p is not None and claims.penalty_shown(p.t_interval, p.mean)
            verdicts[m] = claims.verdict(d.t_interval, comparison.adjusted[m], shown)
        self.verdicts[key] = verdicts

    def verdict_section(self) -> List[str]:
        rows = []
        within = Comparison(self.records, self.task, "adaptive", "sgd", [w for w in (4, 8) if w in self.scale.workers])
        for m, d in within.rows:
            rows.append(["1. DC-ASGD-a within 0.5 of SGD", m, f"{d.mean:+.2f} {interval(d.t_interval)}",
                         claims.within_verdict(d.t_interval)])
        self.verdicts["within"] = {m: claims.within_verdict(d.t_interval) for m, d in within.rows}
        for i, claim in enumerate(claims.CLAIMS, 2):
            if not {claim.worse, claim.better} <= set(self.scale.main_methods):
                continue
            workers = [w for w in self.scale.workers if claim.workers is None or w in claim.workers]
            comparison = Comparison(self.records, self.task, claim.worse, claim.better, workers, claim.setting)
            self.record_verdicts(claim.key, comparison, claim.needs_penalty)
            for m, d in comparison.rows:
                rows.append([f"{i}. {LABELS[claim.better]} below {LABELS[claim.worse]}"
                             + (" (one slow worker)" if claim.setting == "one-slow" else ""), m,
                             f"{d.mean:+.2f} {interval(d.t_interval)}", self.verdicts[claim.key][m]])
        growth = self.growth()
        if growth is not None:
            rows.append([f"{len(claims.CLAIMS) + 2}. the gap grows with M",
                         f"{self.scale.workers[-1]} vs {self.scale.workers[0]}",
                         f"{growth.mean:+.2f} {interval(growth.t_interval)}", claims.growth_verdict(growth.t_interval)])
        return ["## Verdicts", "", "Each prediction, at each M, by the rules above (difference: mean and 95% t "
                "interval, points).", "", table(["claim", "M", "difference", "verdict"], rows)]

    def sensitivity_section(self) -> List[str]:
        """The main table and the verdicts of the check at another rate, and a link to its own page."""
        if self.sensitivity is None:
            return []
        other = self.sensitivity
        keep = lambda lines: [line for line in lines[1:] if not line.startswith("![")]  # noqa: E731
        rate = other.scale.lr or TASKS[other.task].lr
        return [f"## Sensitivity: the same comparison at rate {rate:g}", "",
                f"Decided after this run, when most asynchronous runs at the pilot's rate diverged: the main table, "
                f"its tuning, its verdicts and the timed real runs (for {other.scale.timed_seconds:g} s) again at rate "
                f"{rate:g} (half the pilot's), everything else the same. Its own page, with the paired differences and the plots: "
                f"[{SENSITIVITY}/RESULTS.md]({SENSITIVITY}/RESULTS.md).", "",
                "### Final test error (%)", *keep(other.main_section()), "### Verdicts", *keep(other.verdict_section()),
                *(["### Time to a target: real runs padded to a step time", *keep(other.timed_section())]
                  if other.scale.timed_repeats and other.scale.timed_methods else [])]

    def growth(self) -> Optional[Difference]:
        """Per seed, (ASGD - DC-ASGD-a) at the largest M minus at the smallest."""
        small, large = self.scale.workers[0], self.scale.workers[-1]
        if small == large:
            return None
        gaps = {}
        for w in (small, large):
            a, d = errors(self.records, self.task, "none", w), errors(self.records, self.task, "adaptive", w)
            gaps[w] = {s: a[s] - d[s] for s in set(a) & set(d)}
        seeds = sorted(set(gaps[small]) & set(gaps[large]))
        if len(seeds) < 2:
            return None
        return paired_difference([gaps[large][s] for s in seeds], [gaps[small][s] for s in seeds])

    def reading_section(self) -> List[str]:
        lines = ["## Reading: when to use which", ""]
        for w in self.scale.workers:
            means = {m: mean(v.values()) for m in self.scale.main_methods if m != "sgd"
                     for v in [errors(self.records, self.task, m, w)] if v}
            if len(means) < 2:
                continue
            best, runner = sorted(means, key=means.get)[:2]
            d = Comparison(self.records, self.task, runner, best, [w]).at(w)
            separated = d is not None and d.t_interval[0] > 0
            lines.append(f"- M={w}, fixed epochs: lowest error {LABELS[best]} ({means[best]:.2f}%), then "
                         f"{LABELS[runner]} ({means[runner]:.2f}%): "
                         + ("the gap is outside the noise." if separated else "the two are within the noise."))
        for w in self.scale.workers:
            means = {m: mean(100 * r["final_error"] for r in found) for m in self.scale.slow_methods
                     for found in [select(self.records, source="simulator", task=self.task, method=m, workers=w,
                                          delay="one-slow")] if found}
            if means:
                best = min(means, key=means.get)
                lines.append(f"- M={w}, one slow worker, fixed time: lowest error {LABELS[best]} ({means[best]:.2f}%).")
        return lines

    def headline(self) -> List[str]:
        """Two lines for the README, from the tables and the verdicts."""
        if not self.verdicts:
            self.verdict_section()
        name = {"fashion": "Fashion-MNIST", "digits": "digits"}[self.task]
        counts = []
        for m in ("none", "constant", "adaptive", "staleness", "gap_aware", "horovod"):
            found = [r for w in self.scale.workers for r in select(
                self.records, source="simulator", task=self.task, method=m, delay="event", split="test", workers=w)]
            if found:
                counts.append(f"{LABELS[m]} {sum(1 for r in found if r['final_error'] >= AT_CHANCE)}/{len(found)}")
        best = []
        for w in self.scale.workers:
            means = {m: mean(v.values()) for m in self.scale.main_methods if m != "sgd"
                     for v in [errors(self.records, self.task, m, w)] if v}
            if means:
                top = min(means, key=means.get)
                best.append(f"M={w} {LABELS[top]} {means[top]:.1f}%")
        sgd = list(errors(self.records, self.task, "sgd", 1).values())
        verdicts = lambda key: ", ".join(f"M={m} {v}" for m, v in self.verdicts.get(key, {}).items())  # noqa: E731
        rate = self.scale.lr or TASKS[self.task].lr
        second = f"DC-ASGD-a below ASGD: {verdicts('dc-a-over-asgd')}"
        if self.sensitivity is not None:
            self.sensitivity.verdict_section()
            found = self.sensitivity.verdicts.get("dc-a-over-asgd", {})
            if found:
                second += "; at half the rate: " + ", ".join(f"M={m} {v}" for m, v in found.items())
        return [f"On {name} ({self.scale.seeds} paired seeds, rate {rate:g}: sequential SGD's best on the validation "
                f"split, {mean(sgd):.1f}% test error), runs that diverged or ended near chance (at least "
                f"{100 * AT_CHANCE:.0f}% error) over M = "
                f"{', '.join(map(str, self.scale.workers))}: {', '.join(counts)}; lowest error: {', '.join(best)}.",
                f"{second}. Verdicts by rules written before the runs; details, intervals, the straggler and timing "
                "results: [docs/RESULTS.md](docs/RESULTS.md)."]

    def commands(self) -> List[str]:
        return ["## Commands", "", "```bash",
                "python benchmarks/evidence/pilot.py          # the pilot (results/pilot.json), a few minutes",
                "python benchmarks/evidence/run.py            # every run of this page, resumable, about 45 minutes",
                "python benchmarks/evidence/run.py --quick    # digits, about 4 minutes (another --out)",
                "python benchmarks/evidence/report.py         # this page from the records, seconds",
                "```", "", "Every run's settings, command line (real runs) and results are in "
                "`results/evidence.json`."]

    def failed_section(self) -> List[str]:
        failed = [r for r in self.records if "failed" in r]
        return ["## Runs that failed", "", *([f"- {key_of(r)}: {' / '.join(r['failed'][-3:])}" for r in failed]
                                             or ["None."])]


def diverged_note(records: List[Dict], task: str, method: str, workers: int, delay: str = "event") -> str:
    """" (k of n diverged)" where some of the runs diverged."""
    found = select(records, source="simulator", task=task, method=method, delay=delay, split="test",
                   workers=1 if method == "sgd" else workers)
    k = sum(1 for r in found if r.get("diverged"))
    return f" ({k} of {len(found)} diverged)" if k else ""


def seconds_to(found: List[Dict], target: float) -> str:
    """Mean seconds to ``target`` over the runs that reached it, and how many did."""
    reach = [first_below(r["curve"], target) for r in found]
    reached = [t for t in reach if t is not None]
    if not reached:
        return "not reached"
    return f"{mean(reached):.2f}" + (f" ({len(reached)} of {len(reach)})" if len(reached) != len(reach) else "")


def first_below(curve: List[List[float]], target: float) -> Optional[float]:
    """Seconds at the first evaluation at or below ``target`` (a fraction)."""
    return next((seconds for _, seconds, error in curve if error <= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description="RESULTS.md and the plots from the recorded evidence.")
    parser.add_argument("--out", default="docs", help="reads OUT/results/evidence.json, writes OUT/RESULTS.md")
    parser.add_argument("--readme", default=None, help="the README whose headline to rewrite "
                        "(default: this repository's, when --out is its docs/)")
    args = parser.parse_args()
    out = Path(args.out)
    names = write_report(out, Path(args.readme) if args.readme else default_readme(out))
    print(f"wrote {out / 'RESULTS.md'} and {len(names)} plots", flush=True)


if __name__ == "__main__":
    main()

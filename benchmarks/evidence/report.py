"""The evidence's page: ``OUT/RESULTS.md`` and the plots in ``OUT/results``,
from ``OUT/results/evidence.json`` alone -- no training, a few seconds.

    python benchmarks/evidence/report.py            # docs/RESULTS.md from docs/results/evidence.json
    python benchmarks/evidence/report.py --out DIR

``run.py`` calls it after its runs; the page is a function of the records, so
running it again writes the same page.  Without records (the standard study
not run yet) the page says so.  With ``--readme`` (the default for ``--out
docs``) it also rewrites the headline between the markers in the README.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from statistics import median
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import claims  # noqa: E402
from plan import (  # noqa: E402
    AT_ASGD_RATE, CHANCE, DELAYS, LABELS, METHODS, OPTIMIZERS, SCALES, Choice, Scale, Setting, choices,
    evaluation_spec, key_of, rows_of, target, trained, tuning_cells,
)
from plots import plots  # noqa: E402
from records import load  # noqa: E402
from stats import Difference, divergence_test, holm, mean_interval, paired_difference  # noqa: E402
from tasks import TASKS  # noqa: E402

HEADLINE = ("<!-- results headline: written by benchmarks/evidence/report.py -->",
            "<!-- end of results headline -->")
PLAN = "results/PLAN.md"
ARCHIVE = "results/design-1/RESULTS.md"


def write_report(out: Path, readme: Optional[Path] = None) -> List[str]:
    """Write ``out/RESULTS.md`` and the plots from ``out/results/evidence.json``
    (and the headline into ``readme``); returns the plots' file names."""
    path = Path(out) / "results" / "evidence.json"
    evidence = load(path) if path.exists() else None
    if evidence is None or not evidence["records"]:
        report, names = None, []
        page = pending_page()
    else:
        report = Report(evidence)
        names = plots(report, Path(out) / "results")
        page = report.page()
    (Path(out) / "RESULTS.md").write_text(page)
    if readme is not None:
        update_readme(readme, report.headline() if report else pending_headline())
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
    """Mean ± the half-width of its 95% t interval."""
    if not values:
        return "-"
    m, half = mean_interval(values)
    return f"{m:.2f} (n=1)" if len(values) == 1 else f"{m:.2f} ± {half:.2f}"


def interval(bounds: Tuple[float, float]) -> str:
    return "n/a" if any(math.isnan(b) for b in bounds) else f"[{bounds[0]:+.2f}, {bounds[1]:+.2f}]"


def both_trained(a: Dict[int, Dict], b: Dict[int, Dict]) -> List[int]:
    """The seeds, in order, where the runs of both cells trained."""
    return [s for s in sorted(set(a) & set(b)) if trained(a[s]) and trained(b[s])]


def error_difference(a: Dict[int, Dict], b: Dict[int, Dict], seeds: Sequence[int]) -> Difference:
    """a - b in points of final test error, paired over ``seeds``."""
    return paired_difference([100 * a[s]["final_error"] for s in seeds], [100 * b[s]["final_error"] for s in seeds])


def p_value(p: Optional[float]) -> str:
    return "-" if p is None else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def archive_lines() -> List[str]:
    return [f"The first design's page and records are archived in [{ARCHIVE}]({ARCHIVE}), with the design flaws "
            "that made this one necessary listed at its top (one rate for every method, chosen for sequential SGD at "
            "the edge of its grid, so that ASGD diverged or ended at chance in 28 of 32 runs at M = 4 and 8; a "
            "lambda_0 called tuned that was a fallback; the regime where compensation can show itself never "
            "sampled; verdicts where both methods sat at chance; an MLP; changes during and after the run not on "
            "the page; no time to accuracy)."]


def pending_page() -> str:
    lines = ["# Results: does delay compensation help, and does asynchronous training beat Horovod?", "",
             "Written by `benchmarks/evidence/report.py`; do not edit by hand.", "",
             "**The standard study of the second design is pending.** Its design, rules and predictions were "
             f"committed before any of its runs ([{PLAN}]({PLAN}), commit {claims.PLAN_COMMIT}); it runs on a "
             "frozen commit with", "", "```bash",
             "python benchmarks/evidence/run.py                 # the accuracy study (simulator), about 80 min on 2 cores",
             "python benchmarks/evidence/run.py --study time    # time to accuracy against real Horovod, about 2 h",
             "```", "", "and this page is then regenerated from its records alone. Until then there is no result of "
             "this design to read here.", "", *archive_lines()]
    return "\n".join(lines) + "\n"


def pending_headline() -> List[str]:
    return ["The comparison of methods is being re-run with every method tuned on its own "
            f"([docs/{PLAN}](docs/{PLAN})); the first design's results are archived with their known flaws in "
            f"[docs/{ARCHIVE}](docs/{ARCHIVE}).",
            "Until the new study is run, no recommendation between methods follows from the evidence."]


# --- the study's numbers ------------------------------------------------------
class Report:
    """The records read through the plan: choices, cells, claims, Holm."""

    def __init__(self, evidence: Dict):
        self.records, self.sessions = evidence["records"], evidence["sessions"]
        self.scale_name = evidence["scale"]
        self.scale: Scale = SCALES[self.scale_name]
        self.done = {r["key"]: r for r in self.records if "failed" not in r}
        self.chosen = choices(self.scale, self.done)
        self.goal = target(self.scale, self.done)
        self._family()

    # -- cells
    def tuned_setting(self, setting: Setting) -> Tuple[str, str]:
        return setting.tuned_in or (setting.optimizer, setting.delay)

    def choice(self, setting: Setting, workers: int, row: str) -> Optional[Choice]:
        return self.chosen.get((self.tuned_setting(setting)[0], 1 if row == "sgd" else workers, row))

    def cell(self, setting: Setting, workers: int, row: str) -> Dict[int, Dict]:
        """Seed -> record of ``row`` at ``workers`` in ``setting`` (evaluation runs)."""
        choice = self.choice(setting, workers, row)
        if choice is None:
            return {}
        found = {}
        for seed in range(self.scale.seeds):
            record = self.done.get(key_of(evaluation_spec(self.scale, setting, 1 if row == "sgd" else workers, row,
                                                          seed, choice)))
            if record is not None:
                found[seed] = record
        return found

    def setting_of(self, optimizer: str, delay: str) -> Optional[Setting]:
        return next((s for s in self.scale.settings if (s.optimizer, s.delay) == (optimizer, delay)), None)

    def main_setting(self) -> Setting:
        return self.scale.settings[0]

    # -- the family of claims
    def _family(self) -> None:
        """Every testable claim of the page, with its p-value, then Holm over all of them."""
        self.accuracy: List[Dict] = []
        self.divergence: List[Dict] = []
        self.timed: List[Dict] = []
        for claim in claims.CLAIMS:
            setting = self.setting_of(claim.optimizer, claim.delay)
            if setting is None:
                continue
            for workers, size in claim.sizes.items():
                if workers not in setting.workers:
                    continue
                a, b = self.cell(setting, workers, claim.a), self.cell(setting, workers, claim.b)
                seeds = sorted(set(a) & set(b))
                if not seeds:
                    continue
                both = both_trained(a, b)
                entry = {"claim": claim, "M": workers, "size": size, "seeds": len(seeds), "both": len(both),
                         "difference": None, "p": None}
                if len(both) >= claims.MIN_TRAINED:
                    d = error_difference(a, b, both)
                    entry.update(difference=d, p=d.p)
                self.accuracy.append(entry)
                test = divergence_test([not trained(a[s]) for s in seeds], [not trained(b[s]) for s in seeds])
                self.divergence.append({"claim": claim, "M": workers, "seeds": len(seeds), "test": test,
                                        "p": None if test is None else test[2],
                                        "failed": (sum(not trained(a[s]) for s in seeds),
                                                   sum(not trained(b[s]) for s in seeds))})
        self.timed = self._time_claims()
        family = [e for e in self.accuracy + self.divergence + self.timed if e["p"] is not None]
        for entry, adjusted in zip(family, holm([e["p"] for e in family])):
            entry["holm"] = adjusted
        self.family_size = len(family)

    def _time_claims(self) -> List[Dict]:
        """Prediction 13's ratios to plain Horovod, over the seeds where both runs trained (the page's rule for
        every comparison) and at least one reached the target (post hoc: a pair censored on both sides says
        nothing of the ratio).  A censored time makes the ratio a bound (``bound``: "upper" where only Horovod's
        run was censored, "lower" where only the method's was); with fewer than MIN_TRAINED such seeds, or
        bounds both ways, the claim is untestable and leaves the Holm family."""
        entries = []
        for straggler, predicted in claims.TIME_CLAIMS.items():
            for workers in self.scale.timed_workers:
                base = self.timed_runs("horovodrun", workers, straggler)
                for method, claim in predicted.items():
                    runs = self.timed_runs(method, workers, straggler)
                    if not runs or not base:
                        continue  # not run at this scale
                    both = both_trained(base, runs)
                    times = {s: (self.time_to(runs[s]), self.time_to(base[s])) for s in both}
                    seeds = [s for s in both if times[s][0][1] or times[s][1][1]]
                    bounds = {"upper" if not times[s][1][1] else "lower" if not times[s][0][1] else "exact"
                              for s in seeds}
                    bound = "mixed" if {"upper", "lower"} <= bounds else (bounds - {"exact"} or {"exact"}).pop()
                    entry = {"method": method, "M": workers, "straggler": straggler, "claim": claim,
                             "difference": None, "p": None, "seeds": len(seeds), "bound": bound,
                             "reached": (sum(times[s][0][1] for s in both), sum(times[s][1][1] for s in both),
                                         len(both))}
                    if len(seeds) >= claims.MIN_TRAINED and bound != "mixed":
                        d = paired_difference([math.log(times[s][0][0]) for s in seeds],
                                              [math.log(times[s][1][0]) for s in seeds])
                        entry.update(difference=d, p=d.p)
                    entries.append(entry)
        return entries

    def timed_runs(self, method: str, workers: int, straggler: float) -> Dict[int, Dict]:
        source = "horovodrun" if method == "horovodrun" else "mpi"
        return {r["seed"]: r for r in self.done.values() if r["source"] == source and r["method"] == method
                and r["workers"] == workers and r["straggler"] == straggler}

    def samples_per_second(self, found: Dict[int, Dict]) -> Optional[float]:
        """Images trained per second per worker, the mean over workers and the runs that trained."""
        rates = [samples / seconds for r in found.values() if trained(r)
                 for samples, seconds in r.get("per_worker", []) if seconds > 0]
        return sum(rates) / len(rates) if rates else None

    def padded_rate(self) -> float:
        """Images per second per worker that the padding alone allows."""
        return TASKS[self.scale.task].batch_size / self.scale.step_time

    def reached(self, found: Dict[int, Dict]) -> Tuple[int, float]:
        """How many of the runs reached the target, and their median seconds to it (the budget where not)."""
        times = [self.time_to(r) for r in found.values()]
        return sum(ok for _, ok in times), median(t for t, _ in times)

    def time_to(self, record: Dict) -> Tuple[float, bool]:
        """Seconds to the record's target, and whether it was reached (else the budget: censored)."""
        for seconds, error in record.get("curve", []):
            if error <= record["target"]:
                return max(seconds, 1e-3), True
        return record["seconds"], False

    # -- the page
    def page(self) -> str:
        sections = [self.title(), self.provenance(), self.predictions(), self.setup(), self.tuning(),
                    *[self.table_section(s) for s in self.scale.settings], self.claims_section(),
                    self.divergence_section(), self.robustness_section(), self.time_section(), self.failed_section(),
                    ["## The first design", "", *archive_lines()]]
        return "\n".join(line for section in sections for line in [*section, ""]).rstrip() + "\n"

    def title(self) -> List[str]:
        lines = ["# Results: does delay compensation help, and does asynchronous training beat Horovod?", "",
                 "Written by `benchmarks/evidence/report.py` from `results/evidence.json`; do not edit by hand."]
        if self.scale_name != "standard":
            lines += ["", f"**{self.scale_name} scale: for trying the code, not results.** It runs fewer seeds, "
                      "values of M and rates than the plan; its numbers show the shape of the page only."]
        return lines

    def provenance(self) -> List[str]:
        rows = [[s.get("started", "-"), s.get("study", "-"), (s.get("commit") or "unknown")[:12],
                 "yes" if s.get("clean") else "no", s["runs"], f"{s['seconds'] / 60:.1f}",
                 f"{s['load_before'][0]:.1f} / {s['load_after'][0]:.1f}" if s.get("load_after") else "-"]
                for s in self.sessions]
        commits = {s.get("commit") for s in self.sessions}
        one = (f"All records are of one commit, {next(iter(commits))}." if len(commits) == 1 and None not in commits
               else "**The records mix commits** (`run.py --allow-mixed-commits`): "
               + ", ".join(sorted(c or "unknown" for c in commits)) + ".")
        machine = self.sessions[-1]["machine"] if self.sessions else "-"
        return ["## Provenance", "", f"{one} Machine: {machine}.", "",
                table(["started (UTC)", "study", "commit", "clean tree", "runs", "minutes", "load before / after"],
                      rows)]

    def predictions(self) -> List[str]:
        post_hoc = [f"- **post hoc** ({when}): {what} -- {why}" for when, what, why in claims.POST_HOC]
        lines = ["## What was predicted, before the runs", "",
                 f"The plan, the rules and these predictions are in [{PLAN}]({PLAN}), committed (commit "
                 f"{claims.PLAN_COMMIT}) before any run of this design. Decided after a result was read:", "",
                 *(post_hoc or ["- nothing so far."]), "",
                 "The predictions, as differences a - b of final test error in points (positive: b ends lower):", ""]
        for claim in claims.CLAIMS:
            sizes = "; ".join(f"M={m}: {claims.describe(s)}" for m, s in claim.sizes.items())
            lines.append(f"{claim.number}. {claim.text} (a = {LABELS[claim.a]}, b = {LABELS[claim.b]}; {sizes})")
        lines += [claims.DIVERGENCE_TEXT, claims.ROBUSTNESS_TEXT, claims.TIME_TEXT, "", "The rules:", "",
                  *(f"- {rule}" for rule in claims.RULES)]
        return lines

    def setup(self) -> List[str]:
        task = TASKS[self.scale.task]
        epochs = self.scale.epochs_of()
        budget = []
        used = {"sgd"} | {m for s in self.scale.settings if s.tuned_in is None for m in s.methods}
        for key, method in METHODS.items():
            if key not in used:
                continue
            rates, constants = len(self.scale.rates), len(self.scale.constants_of(key))
            per_m = rates * constants * len(self.scale.tuning_seeds)
            extra = f", {method.constant} over {', '.join(f'{c:g}' for c in self.scale.constants_of(key))}" \
                if method.constant else ""
            budget.append([method.label, f"`{method.mode}`", f"rate{extra}" + (" (x M)" if method.rate_scale == "M"
                                                                                 else "")
                           + (", warm-up" if method.sync else ""), per_m if key != "sgd" else f"{per_m} (once)"])
        return ["## Set-up", "",
                f"Task: `{self.scale.task}` ({'{:,} training / {:,} validation / {:,} test images'.format(*task.sizes)}"
                f"); model `{task.model.__name__}` (`benchmarks/evidence/tasks.py`); batch {task.batch_size} per worker; "
                f"{epochs} epochs, the rate divided by 10 at 50% and 75% of them. Delays: "
                + "; ".join(f"**{k}**: {v}" for k, v in DELAYS.items()) + ". Optimizers on the server: "
                + "; ".join(f"**{k}**: {v}" for k, v in OPTIMIZERS.items()) + ".", "",
                f"Common rate grid (plain SGD): {', '.join(f'{r:g}' for r in self.scale.rates)}; with momentum the "
                f"same divided by 10. Tuning on the validation split, seed(s) "
                f"{', '.join(map(str, self.scale.tuning_seeds))}; evaluation on the test set, seeds 0 to "
                f"{self.scale.seeds - 1}, paired. Tuning budget per method and M (runs):", "",
                table(["method", "server mode", "tuned", "runs per M"], budget), "",
                "DC-ASGD @ASGD rate: at each M, ASGD's chosen rate, and the lambda_0 with the lowest validation "
                "error among the joint grid's runs at that rate (no runs of its own)."]

    def tuning(self) -> List[str]:
        rows = []
        for optimizer, workers, method in tuning_cells(self.scale):
            for row in [method, *[r for r, dc in AT_ASGD_RATE.items() if dc == method]]:
                choice = self.chosen.get((optimizer, workers, row))
                if choice is None:
                    if row == method:
                        rows.append([optimizer, workers, LABELS[row], "not tuned yet", "", "", ""])
                    continue
                const = "" if choice.constant is None else f"{choice.constant:g}"
                status = ("tuned" if choice.status == "tuned" else
                          "**fallback: every value diverged or ended at chance**")
                rows.append([optimizer, workers, LABELS[row], f"{choice.lr:g}" + (" (edge of the grid)" if choice.edge
                                                                                   else ""),
                             const, status, "-" if math.isnan(choice.width()) else f"{choice.width():g}"])
        return ["## Tuning (validation split)", "",
                "Each method's chosen rate and constant at each M; the width of the rate range within 1 point of "
                "its best (max / min of the contiguous grid rates around the best, 1 = only the best).", "",
                table(["optimizer", "M", "method", "rate", "constant", "how", "width within 1 point"], rows), "",
                *[f"![validation error against rate, {o}](results/tuning_{o}.png)"
                  for o in sorted({s.optimizer for s in self.scale.settings if s.tuned_in is None})]]

    def table_section(self, setting: Setting) -> List[str]:
        rows_ = [r for r in rows_of(setting)]
        sgd = self.cell(self.setting_of(setting.optimizer, "event") or setting, 1, "sgd")
        lines = [f"## Final test error (%): {OPTIMIZERS[setting.optimizer]}, {setting.delay} delays", "",
                 f"Mean ± half-width of the 95% t interval over the runs that trained; (k of n did not train). "
                 f"Sequential SGD: {ci_cell([100 * r['final_error'] for r in sgd.values() if trained(r)])}"
                 + (" (the event-driven table's)" if setting.delay != "event" else "") + "."
                 + (" Tuned values: the event-driven ones." if setting.tuned_in else ""), ""]
        body = []
        for workers in setting.workers:
            cells = []
            for row in rows_:
                found = self.cell(setting, workers, row)
                errors = [100 * r["final_error"] for r in found.values() if trained(r)]
                failed = len(found) - len(errors)
                cells.append(ci_cell(errors) + (f" ({failed} of {len(found)} did not train)" if failed else ""))
            body.append([workers, *cells])
        lines.append(table(["M", *(LABELS[r] for r in rows_)], body))
        if setting is self.main_setting():
            lines += ["", "![test error against epochs](results/error_vs_epoch.png)"]
        return lines

    def claims_section(self) -> List[str]:
        rows = []
        for e in self.accuracy:
            claim, d = e["claim"], e["difference"]
            if d is None:
                rows.append([claim.number, e["M"], f"{e['both']} of {e['seeds']}", "-", "-", "-", "-", "-", "-",
                             claims.describe(e["size"]), "**untestable**", ""])
                continue
            verdict = claims.accuracy_verdict(e["size"], d.t_interval, d.bca_interval, e["holm"])
            held = claims.size_held(e["size"], d.mean)
            rows.append([claim.number, e["M"], f"{e['both']} of {e['seeds']}", f"{d.mean:+.2f}", interval(d.t_interval),
                         interval(d.bca_interval), f"{p_value(d.wilcoxon_p)} ({d.wilcoxon_method})", p_value(d.t_p),
                         p_value(e["holm"]), claims.describe(e["size"]), f"**{verdict}**",
                         "" if held is None else "yes" if held else "no"])
        return ["## Verdicts on the accuracy predictions", "",
                f"a - b in points over the seeds where both trained; Holm over all {self.family_size} testable "
                "claims of this page.", "",
                table(["#", "M", "seeds both trained", "mean", "95% t", "95% BCa", "Wilcoxon p", "t p", "Holm p",
                       "predicted", "verdict", "size held"], rows)]

    def divergence_section(self) -> List[str]:
        rows = []
        for e in self.divergence:
            test = e["test"]
            rows.append([e["claim"].number, e["M"], LABELS[e["claim"].a], LABELS[e["claim"].b],
                         f"{e['failed'][0]} / {e['failed'][1]} of {e['seeds']}",
                         "no discordant seed: nothing to test" if test is None else
                         f"{test[0]} / {test[1]}, p {p_value(test[2])}, Holm {p_value(e['holm'])}"])
        cells = []
        for setting in self.scale.settings:
            for workers in setting.workers:
                for row in rows_of(setting):
                    found = self.cell(setting, workers, row)
                    failed = sum(1 for r in found.values() if not trained(r))
                    if failed >= claims.MANY_FAILED:
                        cells.append(f"{LABELS[row]} at M={workers} ({setting.optimizer}, {setting.delay}): "
                                     f"{failed} of {len(found)}")
        verdict = ("refuted: " + "; ".join(cells)) if cells else "held: no cell has 2 or more runs that did not train"
        return ["## Divergence, apart from accuracy", "",
                f"Runs that did not train (NaN or Inf, or at least {100 * CHANCE:.0f}% error), a / b, and the exact "
                "McNemar test on the seeds where only one did.", "",
                table(["#", "M", "a", "b", "did not train (a / b)", "discordant (a only / b only), test"], rows), "",
                f"Prediction 9: {verdict}."]

    def robustness_section(self) -> List[str]:
        rows, held = [], []
        for optimizer, workers, method in tuning_cells(self.scale):
            if method not in ("none", "adaptive") or optimizer != "sgd":
                continue
            choice = self.chosen.get((optimizer, workers, method))
            if choice is not None:
                rows.append([workers, LABELS[method], f"{choice.width():g}"])
        for workers in (16, 32):
            asgd, dc = (self.chosen.get(("sgd", workers, m)) for m in ("none", "adaptive"))
            if asgd and dc:
                ok = dc.width() >= asgd.width() and (workers != 32 or dc.width() >= claims.ROBUST_FACTOR * asgd.width())
                held.append(f"M={workers}: {'held' if ok else 'did not hold'}")
        return ["## Robustness: the rate range within 1 point of the best", "",
                table(["M", "method", "width (max / min rate)"], rows), "",
                "Prediction 10 (descriptive): " + ("; ".join(held) if held else "not measured at M = 16 or 32") + "."]

    def time_section(self) -> List[str]:
        if not self.scale.timed_workers:
            return []
        runs = [r for r in self.done.values() if r["source"] != "simulator"]
        if not runs:
            goal = "not yet fixed" if self.goal is None else f"{100 * self.goal:.2f}% test error"
            return ["## Time to accuracy against real Horovod", "",
                    f"**Pending**: `python benchmarks/evidence/run.py --study time` (target: {goal})."]
        rows = []
        for straggler in (1.0, 3.0):
            for workers in self.scale.timed_workers:
                for method in sorted({r["method"] for r in runs}):
                    found = self.timed_runs(method, workers, straggler)
                    if not found:
                        continue
                    count, seconds = self.reached(found)
                    rate = self.samples_per_second(found)
                    rows.append([f"{straggler:g}x", workers, LABELS.get(method, "plain Horovod (horovodrun)"),
                                 f"{seconds:.1f}", f"{count} of {len(found)}",
                                 ci_cell([100 * r["final_error"] for r in found.values()]),
                                 "-" if rate is None else f"{rate:.0f}"])
        ratios = []
        for e in self.timed:
            d: Optional[Difference] = e["difference"]
            label, predicted = LABELS[e["method"]], f"{e['claim'][0]} {e['claim'][1]:g}"
            if d is None:
                reached, base_reached, pairs = e["reached"]
                why = (f"untestable: {pairs} seeds where both trained, the method reached the target in "
                       f"{reached}, Horovod in {base_reached}")
                ratios.append([f"{e['straggler']:g}x", e["M"], label, "-", "-", "-", predicted, f"**{why}**", ""])
                continue
            ratio_interval = (math.exp(d.t_interval[0]), math.exp(d.t_interval[1]))
            bounded = {"exact": "", "upper": " (at most)", "lower": " (at least)"}[e["bound"]]
            ratios.append([f"{e['straggler']:g}x", e["M"], label, f"{math.exp(d.mean):.2f}{bounded}",
                           f"[{ratio_interval[0]:.2f}, {ratio_interval[1]:.2f}]", p_value(e["holm"]), predicted,
                           f"**{claims.time_verdict(e['claim'], ratio_interval, e['holm'], e['bound'])}**",
                           "" if e["claim"][0] == "within" else "yes" if math.exp(d.mean) <= e["claim"][1] else "no"])
        at_budget = []
        for straggler in (1.0, 3.0):
            for workers in self.scale.timed_workers:
                base = self.timed_runs("horovodrun", workers, straggler)
                for method in sorted({r["method"] for r in runs} - {"horovodrun"}):
                    found = self.timed_runs(method, workers, straggler)
                    both = both_trained(base, found)
                    if len(both) < 2:
                        at_budget.append([f"{straggler:g}x", workers, LABELS[method], f"{len(both)} of {len(found)}",
                                          "-", "-"])
                        continue
                    d = error_difference(found, base, both)
                    at_budget.append([f"{straggler:g}x", workers, LABELS[method], f"{len(both)} of {len(found)}",
                                      f"{d.mean:+.2f}", f"[{d.t_interval[0]:+.2f}, {d.t_interval[1]:+.2f}]"])
        goal = runs[0]["target"]
        return ["## Time to accuracy against real Horovod", "",
                f"Real jobs, every step padded to {1000 * self.scale.step_time:.0f} ms, at most "
                f"{self.scale.seconds:g} s; target {100 * goal:.2f}% test error (sequential SGD's mean + "
                "2 points, fixed before the timed runs). Median seconds to the target (a run that never reaches it "
                "counts at its budget).", "",
                table(["straggler", "M", "method", "median s to target", "reached", "final error %",
                       "samples/s per worker"], rows), "",
                "Samples/s per worker: the images each worker trained on over its training seconds, the mean over "
                f"workers and the runs that trained (the padding alone allows {self.padded_rate():.0f}); it shows "
                "what each launcher's protocol costs on this machine. Where plain Horovod trains well below the "
                "padding's rate without a straggler, that is its allreduce's cost with M processes on these cores; "
                "on a machine with a core per worker it would be expected to shrink, which this run cannot measure.",
                "",
                "Time to target relative to plain Horovod, paired by seed (geometric mean, 95% t interval):", "",
                table(["straggler", "M", "method", "ratio", "95% interval", "Holm p", "predicted", "verdict", "size held"],
                      ratios), "",
                "A ratio over seeds where Horovod's run never reached the target counts Horovod's time at the budget, "
                "so the ratio is at most what it shows (it can support \"at most\" but not \"within\"); a seed where "
                "neither run reached it is left out (**post hoc**, see above).", "",
                "**Post hoc, descriptive (not in the Holm family)**: test error at the end of the same wall-clock "
                "budget, method minus plain Horovod in points, paired by seed over the runs where both trained "
                "(negative: the method ends lower):", "",
                table(["straggler", "M", "method", "seeds both trained", "difference", "95% t interval"], at_budget),
                "", "![test error against seconds](results/error_vs_seconds.png)"]

    def time_headline(self) -> str:
        """With the straggler, at each M: the method that reached the target in the most runs (then the
        shortest median time), its end-of-budget error against plain Horovod's, and how often Horovod reached
        it (post hoc: the ratios alone hid that Horovod never did)."""
        parts = []
        methods = {r["method"] for r in self.done.values() if r["source"] == "mpi"}
        for workers in self.scale.timed_workers:
            base = self.timed_runs("horovodrun", workers, 3.0)
            cells = {m: found for m in methods if (found := self.timed_runs(m, workers, 3.0))}
            if not base or not cells:
                continue
            reach = {m: self.reached(found) for m, found in cells.items()}
            best = min(cells, key=lambda m: (-reach[m][0], reach[m][1]))
            found, (count, seconds) = cells[best], reach[best]
            both = both_trained(base, found)
            gap = ""
            if len(both) >= 2:
                d = error_difference(found, base, both)
                gap = (f", ending {abs(d.mean):.1f} points {'below' if d.mean < 0 else 'above'} Horovod (95% "
                       f"interval {d.t_interval[0]:+.1f} to {d.t_interval[1]:+.1f})")
            rates = self.samples_per_second(found), self.samples_per_second(base)
            pace = "" if None in rates else f" and trained {rates[1]:.0f} images/s per worker to its {rates[0]:.0f}"
            parts.append(f"M={workers} {LABELS[best]} reached it in {count} of {len(found)} runs (median "
                         f"{seconds:.0f} s){gap}, which reached it in {self.reached(base)[0]} of {len(base)}{pace}")
        if not parts:
            return "Time to accuracy against plain Horovod: pending"
        goal = next(r["target"] for r in self.done.values() if r["source"] != "simulator")
        cores = {s.get("cores") for s in self.sessions if s.get("study") == "time"}
        where = f" ({cores.pop()} cores)" if len(cores) == 1 and None not in cores else ""
        return (f"Against plain Horovod on the same {self.scale.seconds:g} s of training with one worker 3x slower"
                f"{where}, time to {100 * goal:.2f}% test error: " + "; ".join(parts))

    def failed_section(self) -> List[str]:
        failed = [r for r in self.records if "failed" in r]
        return ["## Runs that failed (errors of the harness, not divergence)", "",
                *([f"- {key_of(r)}: {' / '.join(r['failed'][-3:])}" for r in failed] or ["None."])]

    def headline(self) -> List[str]:
        """Two sentences for the README: what to pick at each M (lowest mean test error among the runs that
        trained, of the methods that trained in all but at most one seed, and whether the next is outside the
        noise; a method with a lower mean that failed to train more often is named with its count), the
        compensation's own verdicts, and the time study."""
        setting = self.main_setting()
        picks = []
        for workers in setting.workers:
            means, failed = {}, {}
            for row in rows_of(setting):
                cell = self.cell(setting, workers, row)
                errors = [100 * r["final_error"] for r in cell.values() if trained(r)]
                failed[row] = (len(cell) - len(errors), len(cell))
                if errors:
                    means[row] = sum(errors) / len(errors)
            reliable = [row for row in means if failed[row][0] < claims.MANY_FAILED
                        and failed[row][1] - failed[row][0] >= claims.MIN_TRAINED]
            if len(reliable) >= 2:
                best, runner = sorted(reliable, key=means.get)[:2]
                a, b = self.cell(setting, workers, runner), self.cell(setting, workers, best)
                both = both_trained(a, b)
                apart = len(both) >= 2 and error_difference(a, b, both).t_interval[0] > 0
                lower = [row for row in means if means[row] < means[best] and row not in reliable
                         and not row.endswith("@asgd")]
                picks.append(f"M={workers} {LABELS[best]} ({means[best]:.1f}%"
                             + (f", ahead of {LABELS[runner]} outside the noise" if apart else
                                f", within the noise of {LABELS[runner]}")
                             + "".join(f"; {LABELS[row]} {means[row]:.1f}% where it trained, but {failed[row][0]} of "
                                       f"{failed[row][1]} did not train" for row in lower) + ")")
        own = []
        for e in self.accuracy:
            if e["claim"].number == 1:
                d = e["difference"]
                own.append(f"M={e['M']} " + ("untestable" if d is None else claims.accuracy_verdict(
                    e["size"], d.t_interval, d.bca_interval, e["holm"])))
        scale = "" if self.scale_name == "standard" else f" ({self.scale_name} scale: not results)"
        first = (f"With every method tuned on its own{scale}, the lowest test error of the methods that trained in "
                 f"all but at most one seed: "
                 f"{'; '.join(picks) or 'too few runs that trained to say'}; delay compensation at ASGD's own rate "
                 f"against ASGD: {', '.join(own) or 'not run yet'}.")
        second = self.time_headline()
        return [first, f"{second}; details and intervals: [docs/RESULTS.md](docs/RESULTS.md)."]


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

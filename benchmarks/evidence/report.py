"""The evidence's page: ``OUT/RESULTS.md`` and the plots in ``OUT/results``,
from ``OUT/results/evidence.json`` alone -- no training, a few seconds.

    python benchmarks/evidence/report.py            # docs/RESULTS.md from docs/results/evidence.json
    python benchmarks/evidence/report.py --out DIR

``run.py`` calls it after its runs; the page is a function of the records, so
running it again writes the same page.  Without records (the study not run
yet) the page says so; with part of them it shows what is recorded and says
what is still to come.  With ``--readme`` (the default for ``--out docs``) it
also rewrites the headline between the markers in the README.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import claims  # noqa: E402
from plan import (  # noqa: E402
    DEFAULT_ROWS, DELAY, LABELS, METHODS, OUT_OF_THE_BOX, SCALES, Point, Scale, Tuning, evaluation_point,
    evaluation_spec, initial_runs, itt_error, key_of, plan, rows, trained, tunings,
)
from plots import plots  # noqa: E402
from records import load  # noqa: E402
from stats import Difference, holm, holm_levels, mean_interval, paired_difference  # noqa: E402
from tasks import TASKS  # noqa: E402
from time_report import write_section  # noqa: E402

HEADLINE = ("<!-- results headline: written by benchmarks/evidence/report.py -->",
            "<!-- end of results headline -->")
#: The README's measured figure, in its first screen's "why".
FIGURE = ("<!-- results figure: written by benchmarks/evidence/report.py -->", "<!-- end of results figure -->")
PLAN = "results/PLAN.md"
TIME_PLAN = "results/TIME_PLAN.md"
ARCHIVES = {"design-2": "results/design-2/RESULTS.md", "design-1": "results/design-1/RESULTS.md"}
TITLE = "# Results: does bounded delay compensation train reliably, and does it help?"
COMMAND = "python benchmarks/evidence/run.py --jobs 2"


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
    timed = write_section(out)
    if timed:
        page = page.rstrip("\n") + "\n\n" + "\n".join(timed).rstrip("\n") + "\n"
    (Path(out) / "RESULTS.md").write_text(page)
    if readme is not None:
        update_readme(readme, report.headline() if report else pending_headline())
        update_readme(readme, report.figure() if report else pending_figure(), FIGURE)
    return names


def default_readme(out: Path) -> Optional[Path]:
    """This repository's README when ``out`` is its docs folder, else None."""
    root = Path(__file__).resolve().parent.parent.parent
    return root / "README.md" if Path(out).resolve() == root / "docs" else None


def update_readme(readme: Path, lines: List[str], markers: Tuple[str, str] = HEADLINE) -> None:
    """Replace what lies between the ``markers`` (the headline's) of ``readme``."""
    text = readme.read_text()
    start, end = (re.escape(marker) for marker in markers)
    block = "\n".join([markers[0], *lines, markers[1]])
    if not re.search(start + ".*?" + end, text, re.S):
        raise ValueError(f"{readme} has no markers {markers}")
    readme.write_text(re.sub(start + ".*?" + end, lambda _: block, text, flags=re.S))


# --- formatting -------------------------------------------------------------
def table(header: Sequence[str], body: List[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in body])


def ci_cell(values: Sequence[float]) -> str:
    """Mean ± the half-width of its 95% t interval."""
    if not values:
        return "-"
    m, half = mean_interval(values)
    return f"{m:.2f} (n=1)" if len(values) == 1 else f"{m:.2f} ± {half:.2f}"


def interval(bounds: Tuple[float, float]) -> str:
    return f"[{bounds[0]:+.2f}, {bounds[1]:+.2f}]"


def p_value(p: Optional[float]) -> str:
    return "-" if p is None else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def values(tuning: Tuning, point: Optional[Point]) -> str:
    """A point's tuned settings in words (empty for a method without any)."""
    if point is None:
        return ""
    return ", ".join(f"{name} {value:g}" for name, value in zip(METHODS[tuning.method].tuned, point[1]))


def archive_lines() -> List[str]:
    return [f"The second design's page and records are archived in [{ARCHIVES['design-2']}]"
            f"({ARCHIVES['design-2']}), with why this design replaces its accuracy study at its top (DC-ASGD-a did "
            "not train in 2 to 7 of 10 seeds at its tuned values; tuning used one seed and took the minimum; its "
            "lambda_0 was always the top of its grid, unflagged; its means counted only the seeds that trained). Its "
            "time-to-accuracy study against real Horovod stays there until the next one, planned in "
            f"[{TIME_PLAN}]({TIME_PLAN}) (Horovod at its machine's pace, a schedule in epochs, a target both sides "
            "reach, four straggler patterns), has run. The "
            f"first design's are in [{ARCHIVES['design-1']}]({ARCHIVES['design-1']})."]


def pending_page() -> str:
    lines = [TITLE, "", "Written by `benchmarks/evidence/report.py`; do not edit by hand.", "",
             "**The accuracy study of the third design is pending.** Its design, rules and predictions were "
             f"committed before any of its runs ([{PLAN}]({PLAN})"
             + (f", commit {claims.PLAN_COMMIT}" if claims.PLAN_COMMIT else "") + "); it runs on a frozen commit "
             "with", "", "```bash", f"{COMMAND}    # about 85 minutes on 2 cores, resumable", "```", "",
             "and this page is then regenerated from its records alone. Until then there is no result of this "
             "design to read here.", "", *archive_lines()]
    return "\n".join(lines) + "\n"


def pending_figure() -> List[str]:
    return ["(The accuracy study's figure comes here once it has run.)"]


def pending_headline() -> List[str]:
    return ["The third design's accuracy study (bounded DC-ASGD-a against ASGD, Gap-Aware, the paper's unbounded "
            "rule and Horovod's recipe, every method tuned on three seeds, runs that do not train counted at "
            f"chance) is pre-registered in [docs/{PLAN}](docs/{PLAN}) and not run yet: until it is, no "
            "recommendation between methods follows from it.",
            "The second design's results, and why its accuracy study was replaced, are archived in "
            f"[docs/{ARCHIVES['design-2']}](docs/{ARCHIVES['design-2']})."]


# --- the study's numbers ------------------------------------------------------
class Report:
    """The records read through the plan: tunings, cells, the Holm family, the verdicts."""

    def __init__(self, evidence: Dict):
        self.records, self.sessions = evidence["records"], evidence["sessions"]
        self.scale_name = evidence["scale"]
        self.scale: Scale = SCALES[self.scale_name]
        self.done = {r["key"]: r for r in self.records if "failed" not in r}
        self.tuned = tunings(self.scale, self.done)
        self.planned = plan(self.scale, self.records)
        self.remaining = [run for run in self.planned if run.key not in self.done]
        self._family()
        self._verdicts()

    # -- cells
    def point(self, workers: int, row: str) -> Optional[Point]:
        return evaluation_point(self.tuned, workers, row)

    def cell(self, workers: int, row: str) -> Dict[int, Dict]:
        """Seed -> record of ``row``'s evaluation runs at ``workers`` (M=1 for SGD)."""
        workers = 1 if row == "sgd" else workers
        point = self.point(workers, row)
        if point is None:
            return {}
        found = {}
        for seed in range(self.scale.seeds):
            record = self.done.get(key_of(evaluation_spec(self.scale, workers, row, seed, point)))
            if record is not None:
                found[seed] = record
        return found

    def keys(self, workers: int, row: str) -> frozenset:
        return frozenset(r["key"] for r in self.cell(workers, row).values())

    def complete(self, workers: int, row: str) -> bool:
        return len(self.cell(workers, row)) == self.scale.seeds

    def not_trained(self, workers: int, row: str) -> Optional[Tuple[int, int]]:
        """(runs that did not train, runs recorded), ``None`` with none recorded."""
        found = self.cell(workers, row)
        return (sum(not trained(r) for r in found.values()), len(found)) if found else None

    def rows_at(self) -> Tuple[str, ...]:
        return rows(self.scale)

    # -- the family of comparisons
    def _family(self) -> None:
        """Every comparison of the plan whose two cells are complete, each
        counted once, with its p-value, Holm's adjusted p and the interval at
        Holm's level."""
        self.comparisons: List[Dict] = []
        seen: Dict[frozenset, str] = {}
        for workers in self.scale.workers:
            for a, b in claims.COMPARISONS:
                if a not in self.rows_at() or b not in self.rows_at():
                    continue
                entry = {"M": workers, "a": a, "b": b, "difference": None, "p": None, "left_out": None}
                self.comparisons.append(entry)
                if not (self.complete(workers, a) and self.complete(workers, b)):
                    entry["left_out"] = "pending"
                    continue
                keys_a, keys_b = self.keys(workers, a), self.keys(workers, b)
                pair = frozenset([keys_a, keys_b])
                if keys_a == keys_b:
                    entry["left_out"] = "the same runs on both sides"
                elif pair in seen:
                    entry["left_out"] = f"the same runs as {seen[pair]}"
                else:
                    seen[pair] = f"{LABELS[a]} - {LABELS[b]} at M={workers}"
                    entry["difference"] = self.difference(workers, a, b)
                    entry["p"] = entry["difference"].p
        family = [e for e in self.comparisons if e["p"] is not None]
        for entry, adjusted, level in zip(family, holm([e["p"] for e in family]),
                                          holm_levels([e["p"] for e in family], claims.ALPHA)):
            entry.update(holm=adjusted, level=level, adjusted=self.adjusted_interval(entry, level))
        self.family_size = len(family)

    def difference(self, workers: int, a: str, b: str, confidence: float = 0.95) -> Difference:
        """a - b in points of intention-to-treat test error, paired by seed."""
        x, y = self.cell(workers, a), self.cell(workers, b)
        seeds = sorted(set(x) & set(y))
        return paired_difference([100 * itt_error(x[s]) for s in seeds], [100 * itt_error(y[s]) for s in seeds],
                                 confidence=confidence)

    def adjusted_interval(self, entry: Dict, level: float) -> Tuple[float, float]:
        return self.difference(entry["M"], entry["a"], entry["b"], level).t_interval

    def comparison(self, workers: int, a: str, b: str) -> Optional[Dict]:
        """The family's entry of a - b at ``workers``, following a left-out
        duplicate to the comparison of the same runs."""
        entry = next((e for e in self.comparisons if (e["M"], e["a"], e["b"]) == (workers, a, b)), None)
        if entry is None or entry["p"] is not None:
            return entry
        keys = frozenset([self.keys(workers, a), self.keys(workers, b)])
        return next((e for e in self.comparisons if e["p"] is not None and e["M"] == workers
                     and frozenset([self.keys(workers, e["a"]), self.keys(workers, e["b"])]) == keys), entry)

    # -- the predictions
    def _verdicts(self) -> None:
        ms = self.scale.workers
        seeds = self.scale.seeds
        self.counts = {row: {m: self.not_trained(m, row) for m in ms} for row in ("adaptive", "adaptive@default",
                                                                                    "adaptive_paper")}

        def at(a: str, b: str, rule) -> Dict[int, Optional[str]]:
            found = {}
            for m in ms:
                entry = self.comparison(m, a, b)
                found[m] = rule(entry["adjusted"]) if entry is not None and entry["p"] is not None else None
            return found

        self.p3_at = at("adaptive", "none", claims.below_at)
        self.p4_at = at("adaptive", "gap_aware", claims.noninferior_at)
        self.verdicts = {1: claims.trains_everywhere(self.counts["adaptive"], seeds),
                         2: claims.trains_everywhere(self.counts["adaptive@default"], seeds),
                         3: claims.over_every_m(self.p3_at), 4: claims.over_every_m(self.p4_at),
                         5: claims.fails_somewhere(self.counts["adaptive_paper"], seeds)}
        tuned = [t.choice[1] for (m, method), t in self.tuned.items()
                 if method == "adaptive" and t.choice is not None and m in ms]
        failed = {name: [f"{c[0]} of {c[1]} runs at M={m}" for m, c in self.counts[row].items() if c and c[0]]
                  for name, row in (("tuned", "adaptive"), ("default", "adaptive@default"))}
        self.default = claims.default_rule(self.verdicts[1], self.verdicts[2], self.p3_at, tuned, failed)

    # -- the page
    def page(self) -> str:
        sections = [self.title(), self.provenance(), self.predictions(), self.setup(), self.tuning(),
                    self.tables(), self.comparisons_section(), self.failed_section(),
                    ["## Earlier designs", "", *archive_lines()]]
        return "\n".join(line for section in sections for line in [*section, ""]).rstrip() + "\n"

    def title(self) -> List[str]:
        lines = [TITLE, "", "Written by `benchmarks/evidence/report.py` from `results/evidence.json`; do not edit "
                 "by hand."]
        if self.scale_name != "standard":
            lines += ["", f"**{self.scale_name} scale: for trying the code, not results.** It runs fewer seeds, "
                      "values of M, rates and constants than the plan; its numbers show the shape of the page only."]
        if self.remaining:
            lines += ["", f"**In progress**: {len(self.done)} runs recorded, {len(self.remaining)} planned from "
                      "them still to run (more are planned as tuning ends or extends its grids). What is not "
                      "recorded yet is marked pending; no prediction is decided on a cell that is not complete."]
        return lines

    def provenance(self) -> List[str]:
        body = [[s.get("started", "-"), (s.get("commit") or "unknown")[:12], "yes" if s.get("clean") else "no",
                 s["runs"], f"{s['seconds'] / 60:.1f}",
                 f"{s['load_before'][0]:.1f} / {s['load_after'][0]:.1f}" if s.get("load_after") else "-"]
                for s in self.sessions]
        commits = {s.get("commit") for s in self.sessions}
        if not commits:
            one = "No session is recorded."
        elif len(commits) == 1 and None not in commits:
            one = f"All records are of one commit, {next(iter(commits))}."
        else:
            one = ("**The records mix commits** (`run.py --allow-mixed-commits`): "
                   + ", ".join(sorted(c or "unknown" for c in commits)) + ".")
        machine = self.sessions[-1]["machine"] if self.sessions else "-"
        return ["## Provenance", "", f"{one} Machine: {machine}.", "",
                table(["started (UTC)", "commit", "clean tree", "runs", "minutes", "load before / after"], body)]

    def predictions(self) -> List[str]:
        post_hoc = [f"- **post hoc** ({when}): {what} -- {why}" for when, what, why in claims.POST_HOC]
        commit = f" (commit {claims.PLAN_COMMIT})" if claims.PLAN_COMMIT else ""
        lines = ["## Predictions and verdicts", "",
                 f"The plan, the rules and these predictions are in [{PLAN}]({PLAN}), committed{commit} before any "
                 "run of this design. Decided after a result was read (post hoc):", "",
                 *(post_hoc or ["- nothing so far."]), ""]
        details = {1: self.count_detail("adaptive"), 2: self.count_detail("adaptive@default"),
                   3: self.interval_detail("adaptive", "none", self.p3_at),
                   4: self.interval_detail("adaptive", "gap_aware", self.p4_at),
                   5: self.count_detail("adaptive_paper")}
        for p in claims.PREDICTIONS:
            lines.append(f"{p.number}. {p.text} Refuted by {p.refuted_by}. **{self.verdicts[p.number]}** "
                         f"({details[p.number]})")
        lines += ["", "**Which method.** " + claims.default_sentence(self.default, len(self.scale.workers)), "",
                  "The rules:", "", *(f"- {rule}" for rule in claims.RULES)]
        return lines

    def count_detail(self, row: str) -> str:
        return "; ".join(f"M={m}: " + ("pending" if c is None else f"{c[0]} of {c[1]} did not train")
                         for m, c in self.counts[row].items())

    def interval_detail(self, a: str, b: str, at: Dict[int, Optional[str]]) -> str:
        parts = []
        for m, verdict in at.items():
            entry = self.comparison(m, a, b)
            parts.append(f"M={m}: pending" if verdict is None else
                         f"M={m}: {entry['difference'].mean:+.2f}, Holm-adjusted {interval(entry['adjusted'])}, "
                         f"{verdict}")
        return "; ".join(parts)

    def setup(self) -> List[str]:
        task = TASKS[self.scale.task]
        body = []
        for key in ("sgd", *self.scale.methods):
            method = METHODS[key]
            grids = "; ".join(f"{name} {{{', '.join(f'{v:g}' for v in self.scale.grid(name))}}}"
                              for name in method.tuned)
            fixed = ", ".join(f"{name} = {value:g}" for name, value in method.fixed)
            centres = ", ".join(f"M={m}: {c:g}" for m, c in self.scale.centres[key].items()
                                if (m == 1) == (key == "sgd") and (m == 1 or m in self.scale.workers))
            body.append([method.label, f"`{method.mode}`" + (f" ({fixed})" if fixed else ""), centres,
                         grids or "-", ("x M, " if method.rate_scale == "M" else "") + ("warm-up" if method.sync
                                                                                       else "")])
        out_of_box = "; ".join(f"{LABELS[row]}: " + ", ".join(f"{n} {v:g}" for n, v in OUT_OF_THE_BOX[m])
                               for row, m in DEFAULT_ROWS.items())
        count = initial_runs(self.scale)
        epochs = self.scale.epochs_of()
        return ["## Set-up", "",
                f"Task: `{self.scale.task}` ({'{:,} training / {:,} validation / {:,} test images'.format(*task.sizes)}"
                f"); model `{task.model.__name__}` (`benchmarks/evidence/tasks.py`); batch {task.batch_size} per "
                f"worker; {epochs} epoch{'s' if epochs != 1 else ''}, the rate divided by 10 at 50% and 75% of them; plain SGD "
                f"on the server; delays {DELAY}; M = {', '.join(map(str, self.scale.workers))}.", "",
                f"Tuning on the validation split, seeds {', '.join(map(str, self.scale.tuning_seeds))}; each "
                "method's initial grid: the rates centre x "
                + ", ".join(f"{2.0 ** k:g}" for k in self.scale.rate_steps) + " at each M, times its constants' "
                f"grids; at most {self.scale.extensions} grid extensions per dimension. Evaluation on the test "
                f"set, seeds 0 to {self.scale.seeds - 1}, paired. Out of the box: {out_of_box}. Initial waves: "
                f"{count['tuning']} tuning and {count['evaluation']} evaluation runs. Cut from the second design "
                f"for the budget ([{PLAN}]({PLAN}), section 9): momentum on the server, round-robin delays, DC-ASGD-c, "
                "the staleness-aware rate, DC-ASGD at ASGD's rate with lambda_0 tuned there, and time to accuracy.",
                "",
                table(["method", "server mode", "rate grid centre", "constants' initial grids", "rate"], body)]

    def tuning(self) -> List[str]:
        body = []
        for (workers, method), t in self.tuned.items():
            runs = len(t.cells) * len(self.scale.tuning_seeds)
            extended = ", ".join(f"{name} {n}" for name, n in t.extensions.items() if n) or "none"
            if t.choice is None:
                body.append([workers, LABELS[method], "pending", "", "", "", "", extended,
                             f"{len(t.outcomes)} of {len(t.cells)} cells"])
                continue
            cell = t.outcomes[t.choice]
            error = f"{cell.error:.2f}" if cell.trained else "did not train"
            status = "tuned" if t.status == "tuned" else "**fallback: no eligible cell**"
            edges = f"**edge: {', '.join(t.edges)}**" if t.edges else "no"
            body.append([workers, LABELS[method], f"{t.choice[0]:g}", values(t, t.choice) or "-", error, status,
                         edges, extended, f"{len(t.cells)} ({runs} runs)"])
        return ["## Tuning (validation split)", "",
                "Each method's choice at each M: the eligible cell (every tuning seed trained, and at the next rate "
                "up too) with the lowest mean validation error over the tuning seeds. **edge**: the dimensions where "
                "the best cell still sat at the edge of its grid when the extensions ran out (or a step would leave "
                "the setting's range). Every cell's validation error is in the records and in the plot.", "",
                table(["M", "method", "rate", "constants", "validation error %", "how", "at an edge",
                       "extensions", "cells"], body), "",
                "![validation error against rate](results/tuning.png)"]

    def tables(self) -> List[str]:
        lines = ["## Final test error (%)", "",
                 "Per cell: the intention-to-treat mean (a run that did not train counts at 90%) ± the half-width "
                 "of its 95% t interval; the mean over the runs that trained; how many did not train. The "
                 "out-of-the-box rows run the package's defaults before this study at ASGD's tuned rate.", ""]
        lines += [self.cell_table(1, ("sgd",)), ""]
        for workers in self.scale.workers:
            lines += [f"### M = {workers}", "", self.cell_table(workers, self.rows_at()), ""]
        return lines + ["![test error against epochs](results/error_vs_epoch.png)"]

    def cell_table(self, workers: int, rows_: Sequence[str]) -> str:
        body = []
        for row in rows_:
            point = self.point(workers, row)
            tuning = self.tuned.get((workers, DEFAULT_ROWS.get(row, row)))
            found = self.cell(workers, row)
            settings = "pending" if point is None else ", ".join(
                [f"rate {point[0]:g}", *filter(None, [values(tuning, point)])])
            itt = ci_cell([100 * itt_error(r) for r in found.values()])
            ok = ci_cell([100 * r["final_error"] for r in found.values() if trained(r)])
            failed = sum(not trained(r) for r in found.values())
            body.append([LABELS[row], settings, itt, ok, f"{failed} of {len(found)}" if found else "pending"])
        return table(["M=1" if workers == 1 else f"M={workers}", "values", "intention to treat",
                      "runs that trained", "did not train"], body)

    def comparisons_section(self) -> List[str]:
        body = []
        for e in self.comparisons:
            name = [e["M"], f"{LABELS[e['a']]} - {LABELS[e['b']]}"]
            if e["p"] is None:
                body.append([*name, "-", "-", "-", "-", "-", "-", e["left_out"]])
                continue
            d = e["difference"]
            body.append([*name, d.n, f"{d.mean:+.2f}", interval(d.t_interval), p_value(d.p), p_value(e["holm"]),
                         f"{interval(e['adjusted'])} ({100 * e['level']:.2f}%)", "in the family"])
        return ["## Comparisons (one Holm family)", "",
                f"a - b in points of intention-to-treat test error, paired by seed; Holm over the {self.family_size} "
                "comparisons in the family.", "",
                table(["M", "a - b", "seeds", "mean", "95% t", "t p", "Holm p", "Holm-adjusted interval", ""], body)]

    def failed_section(self) -> List[str]:
        failed = [r for r in self.records if "failed" in r]
        return ["## Runs that failed (errors of the harness, not divergence)", "",
                *([f"- {key_of(r)}: {' / '.join(r['failed'][-3:])}" for r in failed] or ["None."])]

    def figure(self) -> List[str]:
        """The README's one measured figure: how far below ASGD and Horovod's
        recipe the tuned bounded DC-ASGD-a ended, over the values of M where
        both comparisons are recorded."""
        found = {b: [self.comparison(m, "adaptive", b) for m in self.scale.workers] for b in ("none", "horovod")}
        found = {b: [e["difference"].mean for e in entries if e is not None and e.get("difference") is not None]
                 for b, entries in found.items()}
        if not all(found.values()):
            return pending_figure()

        def span(values: List[float]) -> str:
            low, high = sorted((-min(values), -max(values)))
            return f"{low:.1f} to {high:.1f}" if round(low, 1) != round(high, 1) else f"{low:.1f}"

        workers = f"{min(self.scale.workers)} to {max(self.scale.workers)}"
        task = {"fashion": "Fashion-MNIST", "digits": "scikit-learn's digits"}.get(self.scale.task, self.scale.task)
        return [f"In this project's accuracy study ({task}, {workers} simulated workers, "
                f"{self.scale.seeds} paired seeds, every method tuned the same way), the bounded "
                f"DC-ASGD-a ended {span(found['none'])} points of test error below asynchronous SGD and "
                f"{span(found['horovod'])} below Horovod's recipe after the same number of gradients (mean "
                "differences; time to accuracy is not measured by this study)."]

    def headline(self) -> List[str]:
        """The README's lines: the state of the study, each prediction's verdict, the default's sentence."""
        scale = "" if self.scale_name == "standard" else f" ({self.scale_name} scale: not results)"
        state = "in progress" if self.remaining else "complete"
        verdicts = "; ".join(f"P{n} {self.verdicts[n]}" for n in sorted(self.verdicts))
        return [f"The third design's accuracy study{scale} is {state}: bounded DC-ASGD-a against ASGD, Gap-Aware, the "
                "paper's unbounded rule and Horovod's recipe, every method tuned on three seeds, runs that do not "
                f"train counted at chance. Predictions ([docs/{PLAN}](docs/{PLAN})): {verdicts}.",
                claims.default_sentence(self.default, len(self.scale.workers))
                + " Details and intervals: [docs/RESULTS.md](docs/RESULTS.md)."]


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

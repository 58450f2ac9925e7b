"""The evidence commands at their smallest size, into temp dirs: ``run.py``
(tuning runs on each method's grid, then the evaluation runs at the chosen
values and the out-of-the-box cells, then the page), resumed with nothing
left, refused on another commit unless told, and ``report.py`` alone; the
plan's tuning rule (eligibility, the margin cell, grid extension, the
fallback) and the report's summaries, Holm family and verdicts on hand-made
records."""

import json
import math
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

from helpers import ROOT, mpirun, run

EVIDENCE = ROOT / "benchmarks" / "evidence"
TINY_RUNS = 14 + 18  # tiny scale: 7 cells x 2 rates of tuning; 2 seeds x (SGD + 6 methods + 2 out of the box)


def evidence_modules():
    sys.path.insert(0, str(EVIDENCE))
    import plan
    import report
    import run as run_module

    return plan, report, run_module


def run_evidence(out: Path, work: Path, *options, expect=0):
    result = run([sys.executable, EVIDENCE / "run.py", "--scale", "tiny", "--out", out, "--work", work,
                  "--jobs", "2", *options], timeout=600)
    assert result.returncode == expect, result.stdout[-4000:]
    return result


def records_of(out: Path):
    return {r["key"]: r for r in json.loads((out / "results" / "evidence.json").read_text())["records"]}


# --- the tiny scale, end to end ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny evidence run, shared by the tests (each changes only a copy):
    its --out and --work folders and what the command printed."""
    base = tmp_path_factory.mktemp("evidence")
    first = run_evidence(base / "docs", base / "work")
    return base / "docs", base / "work", first.stdout


@pytest.fixture
def tiny_copy(tiny, tmp_path):
    out, work, _ = tiny
    return shutil.copytree(out, tmp_path / "docs"), work


@pytest.mark.slow
def test_evidence_tunes_every_method_then_evaluates_and_writes_the_page(tiny):
    plan, _, run_module = evidence_modules()
    out, _, printed = tiny
    assert "0 runs recorded already (skipped)" in printed
    # the only warnings: a tree with changes, and the defaults the study's rule changed since the plan
    # (test_the_package_defaults_are_what_the_studys_rule_chose): the out-of-the-box cells run the plan's
    warnings = [line for line in printed.splitlines() if line.startswith("warning: ") and "uncommitted" not in line]
    assert warnings == [f"warning: {sentence}; the out-of-the-box cells run the plan's"
                        for sentence in run_module.package_defaults()], printed
    page = (out / "RESULTS.md").read_text()
    assert "**tiny scale: for trying the code, not results.**" in page and "**In progress**" not in page
    for heading in ("## Provenance", "## Predictions and verdicts", "## Set-up", "## Tuning (validation split)",
                    "## Final test error (%)", "### M = 4", "## Comparisons (one Holm family)",
                    "## Runs that failed (errors of the harness, not divergence)", "## Earlier designs"):
        assert heading in page
    figures = sorted(p.name for p in (out / "results").glob("*.png"))
    assert figures == ["error_vs_epoch.png", "tuning.png"]
    for name in figures:
        assert (out / "results" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"results/{name}" in page

    records = list(records_of(out).values())
    assert not [r for r in records if "failed" in r], [r["failed"] for r in records if "failed" in r]
    tuning = [r for r in records if r["split"] == "validation"]
    assert len(tuning) == 14 and {r["seed"] for r in tuning} == {100}, "tuning never uses an evaluation seed"
    assert {(r["method"], r["constant"], r["bound"]) for r in tuning if r["method"].startswith("adaptive")} == {
        ("adaptive", 2.0, 1.0), ("adaptive_paper", 2.0, None)}
    evaluated = [r for r in records if r["split"] == "test"]
    assert {r["seed"] for r in evaluated} == {0, 1}
    planned = {run.key for run in plan.plan(plan.SCALES["tiny"], records)}
    assert planned == {r["key"] for r in records}, "every planned run recorded, and nothing else"
    assert TINY_RUNS - 4 <= len(records) <= TINY_RUNS, "an out-of-the-box cell may be a tuned one: it runs once"
    horovod = next(r for r in evaluated if r["method"] == "horovod")
    assert horovod["scale"] == 4.0 and horovod["warmup"] == 1.0, "Horovod's recipe: rate x M with warm-up"
    asgd = next(r for r in evaluated if r["method"] == "none")
    defaults = [r for r in evaluated if r["method"] == "adaptive" and (r["constant"], r["bound"]) == (2.0, 1.0)
                and r["lr"] == asgd["lr"]]
    assert len(defaults) == 2, "bounded DC-ASGD-a at the package defaults and ASGD's rate, every seed"

    sessions = json.loads((out / "results" / "evidence.json").read_text())["sessions"]
    assert len(sessions) == 1 and sessions[0]["runs"] == len(records)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", sessions[0]["started"])
    assert len(sessions[0]["commit"]) == 40 and isinstance(sessions[0]["clean"], bool)
    assert f"All records are of one commit, {sessions[0]['commit']}." in page


@pytest.mark.slow
def test_finished_evidence_runs_nothing_again_and_report_alone_writes_the_same_page(tiny_copy):
    out, work = tiny_copy
    evidence, page = (out / "results" / "evidence.json").read_bytes(), (out / "RESULTS.md").read_text()
    recorded = len(records_of(out))
    (out / "RESULTS.md").unlink()
    printed = run_evidence(out, work).stdout
    assert f"{recorded} runs recorded already (skipped); 0 to run" in printed
    assert "[1]" not in printed and "ran " not in printed, printed
    assert (out / "results" / "evidence.json").read_bytes() == evidence
    assert (out / "RESULTS.md").read_text() == page
    (out / "RESULTS.md").unlink()
    result = run([sys.executable, EVIDENCE / "report.py", "--out", out], timeout=120)
    assert result.returncode == 0, result.stdout[-4000:]
    assert (out / "RESULTS.md").read_text() == page


@pytest.mark.slow
def test_a_session_on_another_commit_is_refused_unless_told_and_the_page_says_so(tiny_copy):
    out, work = tiny_copy
    path = out / "results" / "evidence.json"
    evidence = json.loads(path.read_text())
    evidence["sessions"][0]["commit"] = "0" * 40
    missing = next(r["key"] for r in evidence["records"] if r["method"] == "gap_aware" and r["split"] == "test")
    evidence["records"] = [r for r in evidence["records"] if r["key"] != missing]
    path.write_text(json.dumps(evidence))
    refused = run_evidence(out, work, expect=2).stdout
    assert f"holds records of commit {'0' * 40}" in refused and "--allow-mixed-commits" in refused
    assert json.loads(path.read_text()) == evidence, "nothing recorded"
    printed = run_evidence(out, work, "--allow-mixed-commits").stdout
    assert f"[1] {missing}: done" in printed and "[2]" not in printed, printed
    assert "**The records mix commits** (`run.py --allow-mixed-commits`): 0000000000" in (out / "RESULTS.md").read_text()


def test_the_committed_page_is_what_report_makes_of_the_committed_evidence(tmp_path):
    """docs/RESULTS.md and the README's headline are what report.py writes from
    docs/results/evidence.json and the time study's docs/results/time/evidence.json
    (the pending page while the study has not run)."""
    committed = ROOT / "docs" / "results" / "evidence.json"
    (tmp_path / "results" / "time").mkdir(parents=True)
    if committed.exists():
        shutil.copy(committed, tmp_path / "results")
    timed = ROOT / "docs" / "results" / "time" / "evidence.json"
    if timed.exists():
        shutil.copy(timed, tmp_path / "results" / "time")
    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    result = run([sys.executable, EVIDENCE / "report.py", "--out", tmp_path, "--readme", readme], timeout=120)
    assert result.returncode == 0, result.stdout[-4000:]
    assert (tmp_path / "RESULTS.md").read_text() == (ROOT / "docs" / "RESULTS.md").read_text()
    assert readme.read_text() == (ROOT / "README.md").read_text()
    if not committed.exists():
        assert "**The accuracy study of the third design is pending.**" in (tmp_path / "RESULTS.md").read_text()


def test_the_plan_page_states_the_plans_initial_runs_and_centres():
    plan, _, _ = evidence_modules()
    text = (ROOT / "docs" / "results" / "PLAN.md").read_text()
    count = plan.initial_runs(plan.SCALES["standard"])
    assert count == {"tuning": 549, "evaluation": 330, "total": 879}
    assert f"**{count['total']} runs**" in text and f"{count['tuning']} tuning" in text
    lines = text.splitlines()
    header = lines.index("| method | M=1 | M=4 | M=8 | M=16 | M=32 |")
    for method, centres in plan.CENTRES.items():
        row = next(line for line in lines[header:] if line.startswith(f"| `{method}` |"))
        assert [float(c) for c in row.split("|")[2:-1] if c.strip() not in ("", "-")] == list(centres.values()), row


def test_the_rate_centres_are_design_2s_tuned_rates_in_its_records():
    """Computed here from the archived records alone: on the one tuning seed,
    the grid point with the lowest validation error among those that
    trained, ties to the smaller rate and constant (design 2's rule)."""
    plan, _, _ = evidence_modules()
    records = json.loads((ROOT / "docs" / "results" / "design-2" / "results" / "evidence.json").read_text())["records"]
    best = {}
    for r in records:
        if r["source"] != "simulator" or r["split"] != "validation" or (r["optimizer"], r["delay"]) != ("sgd", "event"):
            continue
        if r.get("diverged") or r["final_error"] >= 0.85:
            continue
        rank = (r["final_error"], r["lr"], r["constant"] or 0.0)
        best[r["method"], r["workers"]] = min(best.get((r["method"], r["workers"]), rank), rank)
    for method, centres in plan.CENTRES.items():
        tuned_as = "adaptive" if method == "adaptive_paper" else method
        for workers, centre in centres.items():
            assert best[tuned_as, workers][1] == centre, (method, workers)


# --- the tuning rule on hand-made records --------------------------------------------------
def record(plan, spec, error):
    """A made-up record of ``spec``: ``error`` as final error, or diverged where ``None``."""
    found = {**spec, "key": plan.key_of(spec), "test_errors": []}
    if error is None:
        return {**found, "diverged": "holds NaN or Inf", "final_error": 0.9}
    return {**found, "final_error": error}


def tune_with(plan, scale, workers, method, error_of):
    """Tune ``method`` at ``workers`` wave after wave, every run's final error
    ``error_of(point, seed)`` (None: diverged); the tuning and the waves' cells."""
    records, waves = {}, []
    for _ in range(50):
        tuning = plan.tune(scale, records, workers, method)
        if tuning.choice is not None:
            return tuning, waves
        new = [p for p in tuning.cells if p not in tuning.outcomes]
        waves.append(new)
        for point in new:
            for seed in scale.tuning_seeds:
                spec = plan.simulator_spec(scale, method, workers, seed, point, "validation")
                records[plan.key_of(spec)] = record(plan, spec, error_of(point, seed))
    raise AssertionError("tuning never ended")


def test_a_cell_whose_next_rate_up_diverges_is_not_eligible_and_the_margin_cell_is_run():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["standard"]  # ASGD at M=4: rates 0.4, 0.2, 0.1
    errors = {0.4: 0.15, 0.2: 0.20, 0.1: 0.25}
    tuning, waves = tune_with(plan, scale, 4, "none", lambda p, seed: errors.get(p[0]))
    assert waves[0] == [(0.4, ()), (0.2, ()), (0.1, ())]
    assert waves[1] == [(0.8, ()), (1.6, ())], "the best cell's margin cell, one rate step beyond the grid, and its own"
    assert tuning.outcomes[0.4, ()].trained and not tuning.eligible((0.4, ()))
    assert (tuning.choice, tuning.status, tuning.edges) == ((0.2, ()), "tuned", ())
    assert tuning.extensions == {"rate": 1}


def test_a_cell_trains_only_if_every_tuning_seed_trains():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["standard"]  # ASGD at M=4: rates 0.4, 0.2, 0.1
    errors = {0.4: 0.30, 0.2: 0.20, 0.1: 0.25, 0.05: 0.30, 0.025: 0.35}

    def error_of(point, seed):
        return None if point[0] == 0.2 and seed == 101 else errors.get(point[0])

    tuning, waves = tune_with(plan, scale, 4, "none", error_of)
    assert not tuning.outcomes[0.2, ()].trained, "one of three seeds diverged"
    assert not tuning.eligible((0.1, ())), "its margin cell (0.2) did not train"
    assert waves[1:] == [[(0.8, ()), (1.6, ())], [(0.05, ())], [(0.025, ())]], \
        "up from 0.4 (its margin cell not run), then down from the best cell that trained, 0.1, and from 0.05"
    assert (tuning.choice, tuning.status, tuning.edges) == ((0.05, ()), "tuned", ())
    assert tuning.extensions == {"rate": 3}


def test_the_mean_over_the_tuning_seeds_chooses_and_ties_go_to_the_smaller_rate_and_constant():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["standard"]  # Gap-Aware at M=16: rates 0.4, 0.2, 0.1; gamma 0.999, 0.9999, 0.99999
    by_seed = {100: 0.20, 101: 0.30, 102: 0.22}

    def error_of(point, seed):
        lr, (gamma,) = point
        if lr >= 0.8:
            return None
        if (lr, gamma) == (0.2, 0.9999):
            return 0.18 if seed == 100 else 0.40  # best on one seed, not on the mean
        return by_seed[seed] + (0.0 if (lr, gamma) in ((0.1, 0.9999), (0.2, 0.999)) else 0.05)

    tuning, _ = tune_with(plan, scale, 16, "gap_aware", error_of)
    assert tuning.choice == (0.1, (0.9999,)), "a tie between (0.1, 0.9999) and (0.2, 0.999): the smaller rate"
    assert tuning.outcomes[0.1, (0.9999,)].error == pytest.approx(100 * (0.20 + 0.30 + 0.22) / 3)


def test_a_choice_at_the_edge_of_a_constants_grid_extends_it_at_most_three_times_then_is_flagged():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["standard"]  # DC-ASGD-a at M=8: rates 0.4, 0.2, 0.1; lambda_0 2, 8, 32; bound 0.5, 1

    def error_of(point, seed):
        lr, (lambda_0, bound) = point
        if lr >= 0.8:
            return None
        return 0.3 - 0.01 * math.log(lambda_0, 4) + (0.02 if bound != 1.0 else 0.0) + (0.01 if lr != 0.2 else 0)

    tuning, waves = tune_with(plan, scale, 8, "adaptive", error_of)
    assert tuning.extensions == {"rate": 0, "lambda_0": 3, "bound": 1}
    assert tuning.choice == (0.2, (2048.0, 1.0)) and tuning.edges == ("lambda_0",), \
        "lambda_0 x4 three times (128, 512, 2048), still best at the edge"
    assert (0.2, (32.0, 2.0)) in waves[1] and (0.4, (32.0, 2.0)) in waves[1], \
        "bound extended once beyond the edge, with the new cell's margin cell"
    assert (0.2, (128.0, 1.0)) in waves[1] and (0.4, (128.0, 1.0)) in waves[1]
    assert (0.2, (128.0, 0.5)) not in tuning.cells, "only the dimension at its edge, at the chosen point"
    assert "lambda_0" in plan.tune(scale, {}, 8, "adaptive").names


def test_gamma_steps_by_tens_in_one_minus_gamma_and_stops_at_its_range():
    plan, _, _ = evidence_modules()
    assert [plan.step("gamma", 0.999, -1), plan.step("gamma", 0.99, -1), plan.step("gamma", 0.9, -1)] == [0.99, 0.9, None]
    assert plan.step("gamma", 0.99999, +1) == 0.999999 and plan.step("lambda_0", 32.0, +1) == 128.0
    assert plan.step("bound", 0.5, -1) == 0.25 and plan.step("rate", 0.0125, -1) == 0.00625
    scale = plan.SCALES["standard"]

    def error_of(point, seed):
        lr, (gamma,) = point
        return None if lr >= 0.8 else 0.2 + 0.001 * math.log10(1 - gamma) + (0 if lr == 0.2 else 0.01)

    tuning, _ = tune_with(plan, scale, 32, "gap_aware", error_of)  # rates 0.2, 0.1, 0.05
    assert tuning.choice == (0.2, (0.99999999,)) and tuning.edges == ("gamma",)
    assert tuning.extensions["gamma"] == 3
    key = plan.key_of(plan.simulator_spec(scale, "gap_aware", 32, 0, tuning.choice))
    assert "constant=0.99999999/" in key, "keys keep every digit a grid value has"


def test_with_no_cell_that_trained_the_choice_is_the_fallback_and_nothing_is_extended():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["standard"]
    tuning, waves = tune_with(plan, scale, 32, "adaptive_paper", lambda p, seed: None)
    assert len(waves) == 1 and len(tuning.cells) == 9
    assert (tuning.choice, tuning.status) == ((0.05, (2.0,)), "fallback"), "the smallest rate and constant"


def test_with_no_eligible_cell_the_best_that_trained_leads_the_extension_down():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["standard"]  # SSGD at M=4: rates 0.8, 0.4, 0.2
    errors = {0.2: 0.3, 0.1: 0.25, 0.05: 0.28}
    tuning, waves = tune_with(plan, scale, 4, "ssgd", lambda p, seed: errors.get(p[0]))
    assert not any(tuning.eligible(p) for p in waves[0])
    assert waves[1:] == [[(0.1, ())], [(0.05, ())]], "down from 0.2, whose margin cell diverged, then from 0.1"
    assert (tuning.choice, tuning.status, tuning.extensions) == ((0.1, ()), "tuned", {"rate": 2})


def test_a_rate_still_best_after_three_extensions_is_flagged_and_the_unverified_top_is_not_chosen():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["standard"]
    tuning, waves = tune_with(plan, scale, 1, "sgd", lambda p, seed: 0.5 - p[0] / 100)
    assert tuning.extensions == {"rate": 3} and tuning.edges == ("rate",)
    assert max(p[0] for p in tuning.cells) == 0.8 * 2 ** 6, "three extensions up, each with its margin cell"
    assert tuning.choice == (0.8 * 2 ** 5, ()), "the best cell whose margin cell trained"


# --- the plan's waves and the report on made-up records ---------------------------------------
def test_evaluation_runs_are_planned_only_once_tuning_is_over_and_the_defaults_run_at_asgds_rate():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["standard"]
    first = plan.plan(scale)
    assert len(first) == 549 and all(r.spec["split"] == "validation" for r in first)
    centre = {w: plan.CENTRES["none"][w] for w in scale.workers}
    records = [record(plan, r.spec, None if r.spec["method"] != "none" else
                      0.2 if r.spec["lr"] == centre[r.spec["workers"]] else 0.25) for r in first]
    second = [r.spec for r in plan.plan(scale, records) if r.spec["split"] == "test"]
    assert {(s["method"], s["lr"], s["constant"], s["bound"]) for s in second if s["workers"] == 8} == {
        ("none", 0.1, None, None), ("adaptive", 0.1, 2.0, 0.5), ("adaptive", 0.1, 2.0, 1.0),
        ("adaptive_paper", 0.1, 2.0, None), ("gap_aware", 0.2, 0.999, None), ("gap_aware", 0.1, 0.999, None),
        ("ssgd", 0.2, None, None), ("horovod", 0.025, None, None)}, \
        "ASGD at its choice, the out-of-the-box cells at its rate, every other method at its fallback"
    assert {s["seed"] for s in second} == set(range(10))
    assert len(second) == 10 * (1 + 4 * 8) - 10, "at M=4 Gap-Aware's fallback is its default at ASGD's rate: run once"
    records += [record(plan, s, 0.2) for s in second[:5]]
    assert len(plan.plan(scale, records)) == len(first) + len(second), "planned again: the same runs"


def made_up_standard_evidence(plan, diverged=()):
    """Records for every run of the standard plan, wave after wave, with
    made-up errors (the test's own numbers, no training): each method's
    validation error is lowest at its rate centre, lambda_0 8 (2 at M=4),
    bound 1 and gamma 0.9999, and a rate 4 x its centre diverges; on the
    test split bounded DC-ASGD-a ends 2 points below ASGD and 0.2 below
    Gap-Aware, Horovod's recipe diverges on seeds 1 and 2 at M=32, the
    paper's DC-ASGD-a on seed 3 at M=32, and every (row method, M, seed)
    in ``diverged``."""
    scale = plan.SCALES["standard"]
    base = {"sgd": 16.0, "none": 20.0, "adaptive": 18.0, "adaptive_paper": 18.0, "gap_aware": 18.2, "ssgd": 25.0,
            "horovod": 23.0}
    records = []

    def made_up(spec):
        method, workers, seed = spec["method"], spec["workers"], spec["seed"]
        noise = random.Random(f"{seed}/{workers}").gauss(0, 0.5) + random.Random(spec["key"]).gauss(0, 0.1)
        centre = plan.CENTRES[method][workers]
        error = base[method] + workers / 8 + 3 * abs(math.log2(spec["lr"] / centre)) + noise
        if spec["constant"] is not None and method != "gap_aware":
            error += 0.5 * abs(math.log(spec["constant"] / (2.0 if workers == 4 else 8.0), 4))
        if spec["bound"] is not None:
            error += 0.5 * abs(math.log2(spec["bound"]))
        if method == "gap_aware":
            error += 0.5 * abs(math.log10((1 - spec["constant"]) / 1e-4))
        fails = spec["lr"] >= 4 * centre or (spec["split"] == "test" and (
            (method, workers, seed) in {("horovod", 32, 1), ("horovod", 32, 2), ("adaptive_paper", 32, 3)}
            or (spec["method"], spec["lr"], spec["constant"], workers, seed) in diverged))
        return {**record(plan, spec, None if fails else error / 100),
                "test_errors": [] if fails else [e / 100 for e in (error + 9, error + 5, error + 1, error)]}

    while True:
        done = {r["key"] for r in records}
        runs = [r for r in plan.plan(scale, records) if r.key not in done]
        if not runs:
            return {"scale": "standard", "sessions": [], "records": records}
        records += [made_up({**r.spec, "key": r.key}) for r in runs]


@pytest.fixture(scope="module")
def made_up():
    plan, _, _ = evidence_modules()
    return made_up_standard_evidence(plan)


def test_the_standard_page_from_a_complete_study_has_one_holm_family_without_duplicates(made_up, tmp_path):
    """Guards the page of the 90-minute study before it runs: made-up
    records of every planned run give every section, one Holm family with
    each comparison once, the verdicts and the default's rule."""
    plan, report, _ = evidence_modules()
    assert 879 < len(made_up["records"]) < 1000, "the initial waves and a few extensions"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "evidence.json").write_text(json.dumps(made_up))
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n" + "\n".join(report.FIGURE) + "\n\n" + "\n".join(report.HEADLINE) + "\n")
    names = report.write_report(tmp_path, readme)
    page = (tmp_path / "RESULTS.md").read_text()
    assert sorted(names) == ["error_vs_epoch.png", "tuning.png"] and "**In progress**" not in page
    figure = readme.read_text().split(report.FIGURE[0])[1].split(report.FIGURE[1])[0]
    assert "the bounded DC-ASGD-a ended " in figure and " below asynchronous SGD and " in figure, figure

    built = report.Report(made_up)
    tuned = {(m, method): t for (m, method), t in built.tuned.items()}
    assert tuned[4, "adaptive"].choice == (0.2, (2.0, 1.0)) and tuned[8, "adaptive"].choice == (0.2, (8.0, 1.0))
    assert tuned[8, "adaptive"].extensions == {"rate": 0, "lambda_0": 0, "bound": 1}, "bound 1 is its grid's top"
    family = [e for e in built.comparisons if e["p"] is not None]
    assert built.family_size == len(family) == 19 and f"Holm over the 19 comparisons" in page
    (left_out,) = [e for e in built.comparisons if e["p"] is None]
    assert (left_out["M"], left_out["a"], left_out["b"]) == (4, "adaptive@default", "none"), \
        "at M=4 the defaults are the tuned values at ASGD's own rate: the same runs as DC-ASGD-a against ASGD"
    assert left_out["left_out"].startswith("the same runs as")
    pairs = [frozenset([built.keys(e["M"], e["a"]), built.keys(e["M"], e["b"])]) for e in family]
    assert len(set(pairs)) == len(pairs) and all(len(p) == 2 for p in pairs), "no duplicate, no identical runs"
    assert all(e["holm"] >= e["p"] for e in family)
    for e in family:
        assert (e["adjusted"][0] > 0 or e["adjusted"][1] < 0) == (e["holm"] < 0.05)

    assert built.verdicts == {1: "holds", 2: "holds", 3: "holds", 4: "holds", 5: "holds"}
    sentence = ("By the rule fixed before the runs, bounded DC-ASGD-a (`compensation=\"adaptive\"`) stays the package "
                "default, with lambda_0 = 8 and bound = 1 (the pair tuned at 3 of 4 values of M)")
    assert sentence in page
    headline = readme.read_text()
    assert sentence in headline and "P1 holds; P2 holds; P3 holds; P4 holds; P5 holds" in headline
    for n, verdict in built.verdicts.items():
        assert re.search(rf"^{n}\. .*\*\*{verdict}\*\*", page, re.M), "the headline says only what the page says"


def test_the_intention_to_treat_mean_counts_a_run_that_did_not_train_at_chance(made_up):
    plan, report, _ = evidence_modules()
    built = report.Report(made_up)
    cell = built.cell(32, "horovod")
    trained = [100 * r["final_error"] for s, r in sorted(cell.items()) if s not in (1, 2)]
    assert len(cell) == 10 and len(trained) == 8
    itt = (sum(trained) + 2 * 90.0) / 10
    row = next(line for line in built.cell_table(32, ["horovod"]).splitlines() if line.startswith("| Horovod"))
    assert f"| {itt:.2f} ± " in row and f"| {sum(trained) / 8:.2f} ± " in row and "| 2 of 10 |" in row
    d = built.difference(32, "adaptive", "horovod")
    assert d.mean == pytest.approx(sum(100 * plan.itt_error(built.cell(32, "adaptive")[s]) for s in range(10)) / 10
                                   - itt)


def test_a_partial_study_shows_what_is_recorded_and_decides_nothing_on_an_incomplete_cell(made_up, tmp_path):
    plan, report, _ = evidence_modules()
    tuning_only = {**made_up, "records": [r for r in made_up["records"] if r["split"] == "validation"]}
    built = report.Report(tuning_only)
    page = built.page()
    assert "**In progress**" in page and built.family_size == 0
    assert set(built.verdicts.values()) == {"pending"} and built.default.kept is None
    assert "| 4 | ASGD | 0.2 |" in page, "the tuning that is over is shown"
    some = {**made_up, "records": made_up["records"][:100]}
    assert "| pending |" in report.Report(some).page()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "evidence.json").write_text(json.dumps(tuning_only))
    report.write_report(tmp_path)
    assert "**In progress**" in (tmp_path / "RESULTS.md").read_text()


def test_a_run_that_does_not_train_at_the_defaults_refutes_p2_and_the_default_rule_says_why():
    plan, report, _ = evidence_modules()
    evidence = made_up_standard_evidence(plan, diverged={("adaptive", 0.1, 2.0, 8, 4)})
    built = report.Report(evidence)
    assert built.verdicts[1] == "holds" and built.verdicts[2] == "refuted"
    assert built.default.kept is False
    assert ("this study does not support bounded DC-ASGD-a as the package default: it did not train in 1 of 10 "
            "runs at M=8 at the defaults before this study (P2).") in built.page()


def test_the_default_rule_and_the_verdicts_over_every_m():
    _, _, _ = evidence_modules()
    import claims

    held = claims.default_rule("holds", "holds", {4: "not decided", 8: "holds"}, [(8.0, 1.0), (2.0, 0.5)],
                               {"tuned": [], "default": []})
    assert (held.kept, held.lambda_0, held.bound, held.tuned_at) == (True, 2.0, 0.5, 1), "a tie: the smaller pair"
    refuted = claims.default_rule("holds", "holds", {4: "refuted", 8: "holds"}, [(8.0, 1.0)] * 2,
                                  {"tuned": [], "default": []})
    assert refuted.kept is False and "above ASGD's at M=4 (P3)" in refuted.reasons[0]
    assert claims.default_rule("holds", "pending", {4: "holds"}, [(8.0, 1.0)], {}).kept is None
    assert claims.over_every_m({4: "holds", 8: None}) == "pending"
    assert claims.over_every_m({4: "holds", 8: "not decided"}) == "not decided"
    assert claims.over_every_m({4: "refuted", 8: None}) == "refuted"
    assert claims.below_at((-2.0, -0.1)) == "holds" and claims.below_at((0.1, 2.0)) == "refuted"
    assert claims.below_at((-1.0, 1.0)) == "not decided"
    assert claims.noninferior_at((-3.0, 0.9)) == "holds" and claims.noninferior_at((-3.0, 1.1)) == "refuted"
    assert claims.trains_everywhere({4: (0, 10), 8: (0, 3)}, 10) == "pending"
    assert claims.trains_everywhere({4: (1, 3), 8: None}, 10) == "refuted"
    assert claims.fails_somewhere({4: (0, 10), 8: (0, 10)}, 10) == "refuted"


# --- runs ---------------------------------------------------------------------------------------
def test_each_method_gets_only_the_settings_its_mode_uses():
    plan, _, run_module = evidence_modules()
    scale = plan.SCALES["standard"]

    def compensation(method, point):
        return run_module.compensation_of(plan.simulator_spec(scale, method, 8, 0, point))

    bounded = compensation("adaptive", (0.1, (8.0, 0.5)))
    assert (bounded.mode, bounded.lambda_0, bounded.bound) == ("adaptive", 8.0, 0.5)
    paper = compensation("adaptive_paper", (0.1, (32.0,)))
    assert (paper.mode, paper.lambda_0, paper.bound) == ("adaptive", 32.0, math.inf)
    gap = compensation("gap_aware", (0.1, (0.9999,)))
    assert (gap.mode, gap.gamma) == ("gap_aware", 0.9999)
    assert compensation("none", (0.1, ())).mode == "none"
    assert compensation("horovod", (0.1, ())).schedule == "sync"


def test_the_package_defaults_are_what_the_studys_rule_chose():
    """The plan's out-of-the-box cells ran the defaults before the study; the
    rule fixed in the plan then sets DC-ASGD-a's default from the records.
    The package's defaults are that choice, and differ from the plan's
    out-of-the-box values only where the rule changed them."""
    _, report, run_module = evidence_modules()
    import records

    from hvd_dcasgd import Compensation

    committed = ROOT / "docs" / "results" / "evidence.json"
    if not committed.exists():
        assert run_module.package_defaults() == [], "before the study: the plan's values are the defaults"
        return
    chosen = report.Report(records.load(committed)).default
    adaptive = Compensation("adaptive")
    if chosen.kept:
        assert (adaptive.lambda_0, adaptive.bound) == (chosen.lambda_0, chosen.bound), chosen
    changed = {("adaptive", "lambda_0"): chosen.lambda_0, ("adaptive", "bound"): chosen.bound} if chosen.kept else {}
    for sentence in run_module.package_defaults():
        assert any(sentence.startswith(f"{mode}'s default {name} is {value}") for (mode, name), value in
                   changed.items()), sentence


def test_a_run_whose_weights_become_nan_is_recorded_as_diverged_at_chance(tmp_path):
    plan, _, run_module = evidence_modules()
    spec = plan.simulator_spec(plan.SCALES["tiny"], "none", 2, 0, (1e6, ()))
    record_ = run_module.execute(spec, tmp_path)
    assert "failed" not in record_, record_
    assert record_["final_error"] == 0.9 and "holds NaN or Inf" in record_["diverged"]
    assert record_["key"] == plan.key_of(spec) and not plan.trained(record_) and plan.itt_error(record_) == 0.9


def test_fashion_mnist_without_its_package_is_a_clear_error(monkeypatch, tmp_path):
    sys.path.insert(0, str(EVIDENCE))
    import tasks

    monkeypatch.setattr(tasks, "FASHION_MNIST", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"apt-get install dataset-fashion-mnist"):
        tasks.load_fashion_data()


@pytest.mark.mpi
@pytest.mark.slow
def test_digits_example_straggler_sleeps_and_loses_no_push(tmp_path):
    """With --straggler the last worker sleeps after each step; every push
    still reaches the server exactly once.  That a slow worker's pushes come
    later and staler is a matter of timing, checked deterministically with the
    simulator's event-driven delays (tests/test_simulator.py)."""
    trace = tmp_path / "trace.jsonl"
    result = mpirun(3, ROOT / "examples" / "train_digits.py", "--epochs", 1, "--compensation", "none",
                    "--straggler", 4, "--trace", trace, timeout=300)
    assert result.returncode == 0, result.stdout
    assert "final test accuracy" in result.stdout
    slept = re.search(r"worker 1 \(the straggler\) slept (\d+\.\d+) s", result.stdout)
    assert slept and float(slept.group(1)) > 0, result.stdout
    assert "worker 0 (the straggler)" not in result.stdout
    records = [r for r in map(json.loads, trace.read_text().splitlines()) if "event" not in r]  # the pushes
    workers = [r["worker"] for r in records]
    assert workers.count(0) == workers.count(1) == -(-719 // 32), "one epoch of each worker's shard, every push once"
    assert [r["update"] for r in records] == list(range(len(records)))

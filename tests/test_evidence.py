"""The evidence commands at their smallest size, into temp dirs: ``run.py``
(tuning runs over the rate grid and the constants, then the evaluation runs at
the chosen values, then the time study's real jobs under horovodrun and
mpirun; then the page), resumed with nothing left, refused on another commit
unless told, and ``report.py`` alone; the plan's choice rule and the report's
comparisons on hand-made records."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from helpers import ROOT, mpirun, run

EVIDENCE = ROOT / "benchmarks" / "evidence"
TINY_RUNS = 24  # tiny scale: 12 tuning runs, 12 evaluation runs (DC-ASGD-a at ASGD's rate is one of them)
TINY_TIMED = 4  # plain Horovod and ASGD, with and without the straggler, one seed


def evidence_modules():
    sys.path.insert(0, str(EVIDENCE))
    import plan
    import report
    import run as run_module

    return plan, report, run_module


def run_evidence(out: Path, work: Path, *options, expect=0):
    result = run([sys.executable, EVIDENCE / "run.py", "--scale", "tiny", "--out", out, "--work", work, *options],
                 timeout=900)
    assert result.returncode == expect, result.stdout[-4000:]
    return result


def records_of(out: Path):
    return {r["key"]: r for r in json.loads((out / "results" / "evidence.json").read_text())["records"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny evidence run (accuracy study, then time study), shared by the
    tests (each changes only a copy): its --out and --work folders and what
    the first command printed."""
    base = tmp_path_factory.mktemp("evidence")
    first = run_evidence(base / "docs", base / "work")
    run_evidence(base / "docs", base / "work", "--study", "time")
    return base / "docs", base / "work", first.stdout


@pytest.fixture
def tiny_copy(tiny, tmp_path):
    out, work, _ = tiny
    return shutil.copytree(out, tmp_path / "docs"), work


@pytest.mark.mpi
@pytest.mark.slow
def test_evidence_tunes_every_method_then_evaluates_then_times_real_jobs_and_writes_the_page(tiny):
    out, _, printed = tiny
    assert "0 runs recorded already (skipped)" in printed
    page = (out / "RESULTS.md").read_text()
    assert "**tiny scale: for trying the code, not results.**" in page
    for heading in ("## Provenance", "## What was predicted, before the runs", "## Tuning (validation split)",
                    "## Final test error (%): plain SGD on the server (the paper's update), event delays",
                    "## Final test error (%): plain SGD on the server (the paper's update), round-robin delays",
                    "## Verdicts on the accuracy predictions", "## Divergence, apart from accuracy",
                    "## Robustness", "## Time to accuracy against real Horovod", "## The first design"):
        assert heading in page
    figures = sorted(p.name for p in (out / "results").glob("*.png"))
    assert figures == ["error_vs_epoch.png", "error_vs_seconds.png", "tuning_sgd.png"]
    for name in figures:
        assert (out / "results" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"results/{name}" in page

    records = list(records_of(out).values())
    assert not [r for r in records if "failed" in r], [r["failed"] for r in records if "failed" in r]
    simulated = [r for r in records if r["source"] == "simulator"]
    assert len(simulated) == TINY_RUNS
    tuning = [r for r in simulated if r["split"] == "validation"]
    assert {r["seed"] for r in tuning} == {100}, "tuning never uses an evaluation seed"
    assert {(r["lr"], r["constant"]) for r in tuning if r["method"] == "adaptive"} == {
        (lr, c) for lr in (0.1, 0.05) for c in (0.5, 2.0)}, "the rate jointly with lambda_0"
    evaluated = {(r["method"], r["lr"], r["constant"]) for r in simulated if r["split"] == "test" and r["delay"] == "event"}
    assert len({m for m, _, _ in evaluated}) == len(evaluated) == 5, "one choice per method (sgd, none, adaptive, ssgd, horovod)"
    horovod = next(r for r in simulated if r["method"] == "horovod")
    assert horovod["scale"] == 4.0 and horovod["warmup"] == 1.0, "Horovod's recipe: rate x M with warm-up"
    assert "**untestable**" in page, "tiny runs of one epoch sit near chance: their comparisons are untestable"

    timed = [r for r in records if r["source"] != "simulator"]
    assert sorted((r["source"], r["method"], r["straggler"]) for r in timed) == [
        ("horovodrun", "horovodrun", 1.0), ("horovodrun", "horovodrun", 3.0), ("mpi", "none", 1.0), ("mpi", "none", 3.0)]
    for r in timed:
        assert r["launcher"] == ("horovod" if r["source"] == "horovodrun" else "hvd_dcasgd")
        assert r["command"].split()[0].endswith("horovodrun" if r["source"] == "horovodrun" else "mpirun")
        assert all(seconds >= 2.0 for _, seconds in r["per_worker"]), "trained for the budget"
        times = [t for t, _ in r["curve"]]
        assert times == sorted(times) and len(times) >= 3 and 0 <= r["curve"][-1][1] <= 1
    sgd = [r["final_error"] for r in simulated if r["method"] == "sgd" and r["split"] == "test"]
    assert {r["target"] for r in timed} == {round(sum(sgd) / len(sgd) + 0.02, 4)}, "SGD's mean + 2 points"

    sessions = json.loads((out / "results" / "evidence.json").read_text())["sessions"]
    assert [s["study"] for s in sessions] == ["accuracy", "time"]
    for s in sessions:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", s["started"]) and len(s["commit"]) == 40
        assert isinstance(s["clean"], bool)
    assert f"All records are of one commit, {sessions[0]['commit']}." in page


@pytest.mark.mpi
@pytest.mark.slow
def test_finished_evidence_runs_nothing_again_and_report_alone_writes_the_same_page(tiny_copy):
    out, work = tiny_copy
    evidence, page = (out / "results" / "evidence.json").read_bytes(), (out / "RESULTS.md").read_text()
    (out / "RESULTS.md").unlink()
    printed = run_evidence(out, work).stdout
    assert f"{TINY_RUNS + TINY_TIMED} runs recorded already (skipped); 0 to run" in printed
    assert "[1]" not in printed and "ran " not in printed, printed
    assert (out / "results" / "evidence.json").read_bytes() == evidence
    assert (out / "RESULTS.md").read_text() == page
    (out / "RESULTS.md").unlink()
    result = run([sys.executable, EVIDENCE / "report.py", "--out", out], timeout=120)
    assert result.returncode == 0, result.stdout[-4000:]
    assert (out / "RESULTS.md").read_text() == page


@pytest.mark.mpi
@pytest.mark.slow
def test_a_session_on_another_commit_is_refused_unless_told_and_the_page_says_so(tiny_copy):
    out, work = tiny_copy
    path = out / "results" / "evidence.json"
    evidence = json.loads(path.read_text())
    evidence["sessions"][0]["commit"] = "0" * 40
    missing = next(r["key"] for r in evidence["records"] if r["source"] == "simulator" and r["delay"] == "round-robin")
    evidence["records"] = [r for r in evidence["records"] if r["key"] != missing]
    path.write_text(json.dumps(evidence))
    refused = run_evidence(out, work, expect=2).stdout
    assert f"holds records of commit {'0' * 40}" in refused and "--allow-mixed-commits" in refused
    assert json.loads(path.read_text()) == evidence, "nothing recorded"
    printed = run_evidence(out, work, "--allow-mixed-commits").stdout
    assert f"[1] {missing}: done" in printed and "[2]" not in printed, printed
    assert "**The records mix commits** (`run.py --allow-mixed-commits`): 0000000000" in (out / "RESULTS.md").read_text()


def test_the_committed_page_is_what_report_makes_of_the_committed_evidence(tmp_path):
    """docs/RESULTS.md is what report.py writes from docs/results/evidence.json
    (the pending page while the standard study has not run)."""
    committed = ROOT / "docs" / "results" / "evidence.json"
    (tmp_path / "results").mkdir()
    if committed.exists():
        shutil.copy(committed, tmp_path / "results")
    result = run([sys.executable, EVIDENCE / "report.py", "--out", tmp_path], timeout=120)
    assert result.returncode == 0, result.stdout[-4000:]
    assert (tmp_path / "RESULTS.md").read_text() == (ROOT / "docs" / "RESULTS.md").read_text()
    if not committed.exists():
        assert "**The standard study of the second design is pending.**" in (tmp_path / "RESULTS.md").read_text()


# --- the plan's rules on hand-made records ---------------------------------------------
def tuning_records(plan, scale, workers, method, errors):
    """Records of ``method``'s tuning runs, with ``errors[(lr, constant)]`` as
    final error (None: diverged)."""
    records = {}
    for lr, constant, _, spec in plan.tuning_specs(scale, "sgd", workers, method):
        error = errors[lr, constant]
        record = {**spec, "final_error": 0.9 if error is None else error}
        if error is None:
            record["diverged"] = "holds NaN or Inf"
        records[plan.key_of(spec)] = record
    return records


def test_the_choice_is_the_best_that_trained_a_fallback_where_none_did_and_the_width_within_one_point():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["quick"]  # rates 0.2, 0.1, 0.05
    asgd = tuning_records(plan, scale, 4, "none", {(0.2, None): None, (0.1, None): 0.200, (0.05, None): 0.205})
    choice = plan.choose(scale, asgd, "sgd", 4, "none")
    assert (choice.lr, choice.status, choice.edge) == (0.1, "tuned", False)
    assert choice.width() == 2.0, "0.05 is within 1 point of the best, 0.2 diverged"
    failed = tuning_records(plan, scale, 4, "none", {(lr, None): None for lr in scale.rates})
    fallback = plan.choose(scale, failed, "sgd", 4, "none")
    assert (fallback.lr, fallback.status) == (0.05, "fallback"), "the smallest rate, shown as a fallback"
    at_chance = tuning_records(plan, scale, 4, "none", {(lr, None): 0.88 for lr in scale.rates})
    assert plan.choose(scale, at_chance, "sgd", 4, "none").status == "fallback", "at chance is not trained"
    assert plan.choose(scale, {}, "sgd", 4, "none") is None, "nothing chosen before the tuning is recorded"

    errors = {(lr, c): 0.3 for lr in scale.rates for c in (0.5, 2.0, 8.0)}
    errors[0.2, 8.0], errors[0.1, 2.0] = 0.15, 0.19
    dc = tuning_records(plan, scale, 4, "adaptive", errors)
    joint = plan.choose(scale, dc, "sgd", 4, "adaptive")
    assert (joint.lr, joint.constant, joint.edge) == (0.2, 8.0, True)
    chosen = plan.choices(scale, {**asgd, **dc})
    at_asgd = chosen["sgd", 4, "adaptive@asgd"]
    assert (at_asgd.lr, at_asgd.constant) == (0.1, 2.0), "DC-ASGD-a at ASGD's rate, only lambda_0 chosen"


def test_rates_warm_up_from_the_one_worker_rate_and_horovod_scales_by_m():
    plan, _, run_module = evidence_modules()
    scale = plan.SCALES["standard"]
    horovod = plan.simulator_spec(scale, "horovod", 8, 0, 0.05)
    ssgd = plan.simulator_spec(scale, "ssgd", 8, 0, 0.4)
    asgd = plan.simulator_spec(scale, "none", 8, 0, 0.05)
    assert (horovod["scale"], horovod["warmup"], ssgd["scale"], asgd["warmup"]) == (8.0, 1.0, 1.0, None)
    assert run_module.rate(horovod)(0.0) == pytest.approx(0.05) and run_module.rate(horovod)(1.0) == pytest.approx(0.4)
    assert run_module.rate(ssgd)(0.0) == pytest.approx(0.05) and run_module.rate(ssgd)(1.5) == pytest.approx(0.4)
    assert run_module.rate(asgd)(2.0) == pytest.approx(0.005) and run_module.rate(asgd)(3.0) == pytest.approx(0.0005)


def test_the_standard_plan_has_the_runs_the_plan_page_counts():
    plan, _, _ = evidence_modules()
    scale = plan.SCALES["standard"]
    tuning = plan.plan(scale, [])
    assert len(tuning) == 318 + 66
    assert all(r.spec["split"] == "validation" and r.spec["seed"] == 100 for r in tuning)
    assert len(scale.rates) >= 6 and all(a / b == 2 for a, b in zip(scale.rates, scale.rates[1:]))
    assert scale.seeds >= 10 and scale.timed_seeds >= 5


def test_time_comparisons_are_paired_log_ratios_to_plain_horovod(tmp_path):
    """Five seeds of plain Horovod and ASGD with a straggler: ASGD reaches the
    target in half the time on each; a run that never reaches it counts at
    its budget."""
    plan, report, _ = evidence_modules()
    page = report.Report({"scale": "tiny", "sessions": [], "records": timed_records(plan, (1.0,) * 5)})
    (entry,) = page.timed
    assert entry["method"] == "none" and entry["seeds"] == 5 and entry["bound"] == "exact"
    assert entry["difference"].mean == pytest.approx(-0.693147, abs=1e-6), "log(0.5)"
    never = {**page.timed_runs("horovodrun", 4, 3.0)[0], "curve": [[0.0, 0.9], [2.0, 0.5]]}
    assert page.time_to(never) == (2.0, False)


def timed_records(plan, horovod_reaches, asgd_reaches=None):
    """Timed records of plain Horovod and ASGD with a straggler, seed by seed:
    each reaches the target at its factor times (1 + seed) seconds, or never
    (None), within a budget of 2 s."""
    scale = plan.SCALES["tiny"]
    choice = plan.Choice(0.1, None, "tuned", False, {})
    asgd_reaches = asgd_reaches or [0.5 if h is not None else None for h in horovod_reaches]
    records = []
    for seed, reaches in enumerate(zip(horovod_reaches, asgd_reaches)):
        for method, reach in zip(("horovodrun", "none"), reaches):
            spec = plan.timed_spec(scale, method, 4, seed, choice, 3.0, 0.3)
            curve = ([[0.0, 0.9], [2.0, 0.5]] if reach is None else
                     [[0.0, 0.9], [reach * (1 + seed) / 5, 0.25], [2.0, 0.2]])
            records.append({**spec, "key": plan.key_of(spec), "curve": curve, "final_error": curve[-1][1],
                            "seconds": 2.0})
    return records


def test_a_time_ratio_to_a_horovod_that_never_reached_the_target_is_a_bound_and_both_censored_says_nothing():
    """Horovod never reaches the target: ASGD's ratios are upper bounds
    (they may support "at most", never "within"); a seed where neither
    reaches it is left out, and with fewer than 5 left the claim is
    untestable and leaves the Holm family."""
    plan, report, _ = evidence_modules()
    import claims

    bounded = report.Report({"scale": "tiny", "sessions": [],
                             "records": timed_records(plan, [None] * 5, [0.5] * 5)}).timed[0]
    assert bounded["bound"] == "upper" and bounded["seeds"] == 5 and bounded["p"] is not None
    assert bounded["difference"].mean < 0
    assert claims.time_verdict(("at most", 0.6), (0.3, 0.5), 0.01, "upper") == "supported"
    assert claims.time_verdict(("within", 1.3), (0.9, 1.1), 0.01, "upper") == "inconclusive"
    assert claims.time_verdict(("within", 1.3), (0.9, 1.1), 0.01, "exact") == "supported"
    assert claims.time_verdict(("at most", 0.6), (1.2, 1.5), 0.01, "upper") == "inconclusive"
    assert claims.time_verdict(("at most", 0.6), (1.2, 1.5), 0.01, "lower") == "refuted"

    partly = report.Report({"scale": "tiny", "sessions": [],
                            "records": timed_records(plan, [None] * 5, [0.5, 0.5, 0.5, 0.5, None])})
    (entry,) = partly.timed
    assert entry["seeds"] == 4 and entry["p"] is None and entry["reached"] == (4, 0, 5)
    assert partly.family_size == 0

    mixed = report.Report({"scale": "tiny", "sessions": [],
                           "records": timed_records(plan, [None, None, 1.0, 1.0, 1.0], [0.5, 0.5, None, None, 0.5])})
    assert mixed.timed[0]["bound"] == "mixed" and mixed.timed[0]["p"] is None


def test_each_methods_constant_is_its_compensations_setting():
    _, _, run_module = evidence_modules()
    assert run_module.compensation_of({"method": "gap_aware", "constant": 0.9999}).gamma == 0.9999
    assert run_module.compensation_of({"method": "adaptive", "constant": 8.0}).lambda_0 == 8.0
    assert run_module.compensation_of({"method": "none", "constant": None}).constants() == {}


def test_a_run_whose_weights_become_nan_is_recorded_as_diverged_at_chance(tmp_path):
    plan, _, run_module = evidence_modules()
    spec = plan.simulator_spec(plan.SCALES["tiny"], "none", 2, 0, 1e6)
    record = run_module.execute(spec, tmp_path)
    assert "failed" not in record, record
    assert record["final_error"] == 0.9 and "holds NaN or Inf" in record["diverged"]
    assert record["key"] == plan.key_of(spec) and not plan.trained(record)


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
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    workers = [r["worker"] for r in records]
    assert workers.count(0) == workers.count(1) == -(-719 // 32), "one epoch of each worker's shard, every push once"
    assert [r["update"] for r in records] == list(range(len(records)))


def made_up_standard_evidence(plan):
    """Records for every run of the standard plan, accuracy and time study,
    with made-up errors (the test's own numbers, no training): ASGD loses
    M / 4 points to DC-ASGD-a, and Horovod's recipe diverges on 3 of 10
    seeds at M=32."""
    import random

    scale = plan.SCALES["standard"]
    rng = random.Random(0)
    records = []

    def made_up(spec):
        record = {**spec, "key": plan.key_of(spec)}
        if spec["source"] != "simulator":
            synchronous = spec["method"] in ("horovodrun", "ssgd")
            reach = (20.0 if synchronous else 15.0) * (2.5 if synchronous and spec["straggler"] > 1 else 1)
            reach *= rng.uniform(0.9, 1.1)
            end = spec["target"] - 0.01
            curve = [[t, 0.9 - (0.9 - end) * min(1.0, t / reach)] for t in (0.0, reach / 2, reach, 60.0)]
            return {**record, "curve": curve, "final_error": curve[-1][1]}
        lr_penalty = 10 * abs(__import__("math").log2(spec["lr"] / 0.05)) / 3
        error = 0.12 + (lr_penalty + spec["workers"] / (2 if spec["method"] == "none" else 4) + rng.gauss(0, 0.3)) / 100
        if spec["method"] == "horovod" and spec["workers"] == 32 and spec["seed"] in (1, 2, 3):
            return {**record, "diverged": "holds NaN or Inf", "final_error": 0.9, "test_errors": []}
        return {**record, "final_error": error, "test_errors": [error + 0.1, error + 0.05, error + 0.01, error]}

    while True:
        done = {r["key"] for r in records}
        runs = [r for r in plan.plan(scale, records) + plan.plan(scale, records, "time") if r.key not in done]
        if not runs:
            return {"scale": "standard", "sessions": [], "records": records}
        records += [made_up(r.spec) for r in runs]


def test_the_standard_page_is_written_from_a_complete_study_with_one_holm_family(tmp_path):
    """Guards the page of the 2-hour study before it runs: made-up records
    of every planned run give every section, one Holm family over the
    accuracy, divergence and time claims, and the plots."""
    plan, report, _ = evidence_modules()
    evidence = made_up_standard_evidence(plan)
    assert sum(r["source"] == "simulator" for r in evidence["records"]) > 700
    assert sum(r["source"] != "simulator" for r in evidence["records"]) == 100, "2 M x 5 methods x 2 x 5 seeds"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "evidence.json").write_text(json.dumps(evidence))
    names = report.write_report(tmp_path)
    page = (tmp_path / "RESULTS.md").read_text()
    built = report.Report(evidence)
    family = [e for e in built.accuracy + built.divergence + built.timed if e["p"] is not None]
    assert built.family_size == len(family) > 40 and f"Holm over all {len(family)} testable claims" in page
    assert all(e["holm"] >= e["p"] for e in family)
    assert sorted(names) == ["error_vs_epoch.png", "error_vs_seconds.png", "tuning_momentum.png", "tuning_sgd.png"]
    assert "3 of 10 did not train" in page and "**supported**" in page
    assert re.search(r"\| 3x \| 8 \| ASGD \| 0\.(2\d|3[0-3]) \|.*\| at most 0\.6 \| \*\*supported\*\* \| yes \|", page), \
        "ASGD reaches the target in 15 of Horovod's 50 s with the straggler"

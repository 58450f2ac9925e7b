"""The evidence commands at their smallest size, into temp dirs: ``run.py``
(tuning runs, then the simulator runs that need the tuned values, timed and
untimed real mpirun runs, a replay; then the page), resumed with nothing or
one run left, and ``report.py`` alone, on a tiny run's evidence and on the
committed one."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from helpers import ROOT, mpirun, run

EVIDENCE = ROOT / "benchmarks" / "evidence"
TINY_RUNS = 32  # tiny scale: 12 tuning runs, 14 simulator runs, 4 timed and 1 untimed real runs, 1 replay


def run_evidence(out: Path, work: Path):
    result = run([sys.executable, EVIDENCE / "run.py", "--scale", "tiny", "--out", out, "--work", work], timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    return result


def records_of(out: Path):
    return {r["key"]: r for r in json.loads((out / "results" / "evidence.json").read_text())["records"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny evidence run, shared by the tests (each changes only a copy):
    its --out and --work folders and what it printed."""
    base = tmp_path_factory.mktemp("evidence")
    result = run_evidence(base / "docs", base / "work")
    return base / "docs", base / "work", result.stdout


@pytest.fixture
def tiny_copy(tiny, tmp_path):
    """A copy of the tiny run's --out folder, with its --work folder."""
    out, work, _ = tiny
    return shutil.copytree(out, tmp_path / "docs"), work


@pytest.mark.mpi
@pytest.mark.slow
def test_evidence_command_tunes_first_then_writes_tables_plots_and_a_replayable_real_run(tiny):
    out, _, printed = tiny
    assert "0 runs recorded already (skipped)" in printed
    page = (out / "RESULTS.md").read_text()
    for heading in ("## What was predicted, before the runs", "## Final test error (%), event-driven delays",
                    "## Paired differences", "## Recovery ratio", "## One worker 3x slower, fixed virtual time",
                    "## The real system against the simulator", "## Time that means something",
                    "## Tuning on the validation split", "## Verdicts"):
        assert heading in page
    figures = sorted(p.name for p in (out / "results").glob("*.png"))
    assert figures == ["error_vs_epoch_digits.png", "error_vs_time_digits.png", "lambda_sweep.png",
                       "recovery_ratio.png", "staleness.png"]
    for name in figures:
        assert (out / "results" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"results/{name}" in page

    records = list(records_of(out).values())
    assert len(records) == TINY_RUNS and not [r for r in records if "failed" in r]
    tuning = [r for r in records if r["source"] == "simulator" and r["split"] == "validation"]
    assert {r["seed"] for r in tuning} == {100, 101}, "tuning never uses an evaluation seed"
    chosen = {(r["method"], r["lambda_0"], r["scale"]) for r in records
              if r["source"] == "simulator" and r["split"] == "test" and r["method"] in ("adaptive", "ssgd")}
    assert len({m for m, _, _ in chosen}) == len(chosen) == 2, "one tuned value per method in the evaluation"
    assert ("| DC-ASGD-a | lambda_0 | %g |" % next(l for m, l, _ in chosen if m == "adaptive")) in page

    real = [r for r in records if r["source"] == "mpi" and not r["step_time"]]
    assert len(real) == 1, real
    real = real[0]
    assert sum(samples for samples, _ in real["per_worker"]) == 2 * 1151, "two epochs of the training set"
    trace = [json.loads(line) for line in open(real["trace"])]
    assert sum(real["staleness"].values()) == len(trace) == 2 * sum(-(-n // 16) for n in (576, 575))
    replay = [r for r in records if r["source"] == "simulator" and r["delay"] == "trace"]
    assert len(replay) == 1
    # the simulator on the real run's order, batches, rates and initial weights gives the same weights, bit for bit
    assert replay[0]["checksum"] == real["checksum"] and replay[0]["final_error"] == real["final_error"]
    assert "| DC-ASGD-a | %.2f (n=1) |" % (100 * real["final_error"]) in page and "| 1 of 1 |" in page

    timed = [r for r in records if r["source"] == "mpi" and r["step_time"]]
    assert sorted((r["method"], r["straggler"]) for r in timed) == [("none", 1.0), ("none", 3.0), ("ssgd", 1.0),
                                                                     ("ssgd", 3.0)]
    for r in timed:
        assert r["seconds"] == 1.5 and all(seconds >= 1.5 for _, seconds in r["per_worker"]), "trained for the budget"
    slow = [r for r in timed if r["straggler"] == 3.0 and r["method"] == "ssgd"][0]
    (first, _), (second, _) = slow["per_worker"]
    assert abs(first - second) < 16, "synchronous workers make the same steps (the shards differ by one image)"


@pytest.mark.mpi
@pytest.mark.slow
def test_finished_evidence_runs_nothing_again_and_only_writes_the_page(tiny_copy):
    out, work = tiny_copy
    evidence, page = (out / "results" / "evidence.json").read_bytes(), (out / "RESULTS.md").read_text()
    (out / "RESULTS.md").unlink()
    printed = run_evidence(out, work).stdout
    assert f"{TINY_RUNS} runs recorded already (skipped); 0 to run" in printed
    assert "[1]" not in printed and "ran " not in printed, printed
    assert (out / "results" / "evidence.json").read_bytes() == evidence
    assert (out / "RESULTS.md").read_text() == page


@pytest.mark.mpi
@pytest.mark.slow
def test_report_alone_rewrites_the_page_from_the_evidence(tiny_copy):
    out, _ = tiny_copy
    page = (out / "RESULTS.md").read_text()
    (out / "RESULTS.md").unlink()
    result = run([sys.executable, EVIDENCE / "report.py", "--out", out], timeout=120)
    assert result.returncode == 0, result.stdout[-4000:]
    assert (out / "RESULTS.md").read_text() == page


@pytest.mark.mpi
@pytest.mark.slow
def test_evidence_resumes_with_exactly_the_runs_not_recorded(tiny_copy):
    out, work = tiny_copy
    path = out / "results" / "evidence.json"
    evidence = json.loads(path.read_text())
    missing = "sim/digits/none/M2/e2/s1/round-robin/test/scale=1"
    assert missing in records_of(out)
    evidence["records"] = [r for r in evidence["records"] if r["key"] != missing]
    path.write_text(json.dumps(evidence))
    printed = run_evidence(out, work).stdout
    assert f"{TINY_RUNS - 1} runs recorded already (skipped); 1 to run" in printed
    assert f"[1] {missing}: done" in printed and "[2]" not in printed, printed
    records = records_of(out)
    assert set(records) == {r["key"] for r in evidence["records"]} | {missing}
    assert all(records[r["key"]] == r for r in evidence["records"]), "the recorded runs are kept as they were"
    sessions = json.loads(path.read_text())["sessions"]
    assert [s["runs"] for s in sessions] == [TINY_RUNS, 1]
    assert "in 2 sessions" in (out / "RESULTS.md").read_text()


@pytest.mark.mpi
@pytest.mark.slow
def test_a_record_the_plan_no_longer_has_is_dropped_once_the_plan_is_complete(tiny_copy):
    """A run of an earlier grid (here SSGD at a multiplier no grid value gives)
    would sit beside its replacement in the tables; once every planned run is
    recorded it is dropped, by name, and the page is the one without it."""
    out, work = tiny_copy
    path = out / "results" / "evidence.json"
    page = (out / "RESULTS.md").read_text()
    evidence = json.loads(path.read_text())
    ssgd = next(r for r in evidence["records"] if r["method"] == "ssgd" and r["source"] == "simulator"
                and r["split"] == "test")
    earlier = {**ssgd, "scale": 3.0}
    earlier["key"] = ssgd["key"].replace(f"/scale={ssgd['scale']:g}", "/scale=3")
    assert earlier["key"] != ssgd["key"]
    evidence["records"].append(earlier)
    path.write_text(json.dumps(evidence))
    printed = run_evidence(out, work).stdout
    assert f"{TINY_RUNS + 1} runs recorded already (skipped); 0 to run" in printed
    assert f"dropped 1 records the plan no longer has (an earlier grid or setting): {earlier['key']}" in printed
    assert earlier["key"] not in records_of(out) and len(records_of(out)) == TINY_RUNS
    assert (out / "RESULTS.md").read_text() == page


def test_ssgd_multiplier_is_tuned_absolute_and_capped_at_m_while_horovod_scales_by_m():
    """SSGD's k is found once and is not forced past it at a large M (the
    largest stable rate does not grow with M); Horovod's recipe is rate x M."""
    plan, _ = evidence_modules()
    assert plan.rate_settings("ssgd", 32, 20, 2.0) == {"lambda_0": None, "scale": 2.0, "warmup": 1}
    assert plan.rate_settings("ssgd", 2, 20, 4.0)["scale"] == 2.0
    assert plan.rate_settings("ssgd", 8, 20, 1.0) == {"lambda_0": None, "scale": 1.0, "warmup": None}
    assert plan.rate_settings("horovod", 32, 20)["scale"] == 32.0
    assert plan.rate_settings("ssgd_paper", 32, 20)["scale"] == 1.0


def test_report_reproduces_the_committed_pages_from_the_committed_evidence(tmp_path):
    """docs/RESULTS.md (and the sensitivity check's page, when it ran) is what
    report.py makes of the committed evidence."""
    pages = [Path(".")] + ([Path("half-rate")] if (ROOT / "docs" / "half-rate").exists() else [])
    for page in pages:
        (tmp_path / page / "results").mkdir(parents=True, exist_ok=True)
        for name in ("evidence.json", "pilot.json"):
            if (ROOT / "docs" / page / "results" / name).exists():
                shutil.copy(ROOT / "docs" / page / "results" / name, tmp_path / page / "results")
    for page in reversed(pages):  # the check's page first, as run.py writes them
        result = run([sys.executable, EVIDENCE / "report.py", "--out", tmp_path / page], timeout=120)
        assert result.returncode == 0, result.stdout[-4000:]
        assert (tmp_path / page / "RESULTS.md").read_text() == (ROOT / "docs" / page / "RESULTS.md").read_text()


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


def evidence_modules():
    sys.path.insert(0, str(EVIDENCE))
    import plan
    import run as run_module

    return plan, run_module


def test_a_scale_that_sets_the_rate_names_it_in_every_run_and_sends_it():
    plan, run_module = evidence_modules()
    runs = plan.plan(plan.SCALES["half-rate"], [])
    assert runs and all("/lr=0.2/" in r.key and r.spec["lr"] == 0.2 for r in runs)
    assert not any("/lr=" in r.key for r in plan.plan(plan.SCALES["full"], [])), "the task's rate: keys as before"
    spec = runs[0].spec
    assert run_module.rate(spec)(0.0) == 0.2 and run_module.rate({**spec, "lr": None})(0.0) == 0.4


def test_a_run_whose_weights_become_nan_is_recorded_as_diverged_at_chance(tmp_path):
    plan, run_module = evidence_modules()
    spec = plan.simulator_spec("digits", "none", 2, 0, 1, lr=1e6)
    record = run_module.execute(spec, tmp_path)
    assert "failed" not in record, record
    assert record["final_error"] == 0.9 and "holds NaN or Inf" in record["diverged"]
    assert record["key"] == plan.key_of(spec)


def test_the_pilot_takes_the_best_rate_at_the_affordable_budget_then_the_fewest_epochs_near_it():
    sys.path.insert(0, str(EVIDENCE))
    import pilot

    errors = {(0.1, 5): [20.0, 20.2], (0.1, 10): [15.0, 15.2], (0.1, 20): [14.0, 14.2], (0.1, 40): [11.0, 11.0],
              (0.2, 5): [18.0, 18.2], (0.2, 10): [13.4, 13.4], (0.2, 20): [13.0, 13.2], (0.2, 40): [12.0, 12.0],
              (0.4, 5): [17.0, 17.2], (0.4, 10): [14.0, 14.2], (0.4, 20): [13.5, 13.7], (0.4, 40): [14.0, 14.0]}
    # at 20 epochs 0.2 is best (mean 13.1); at 0.2, 10 epochs (13.4) is within 0.5 of it and 5 (18.1) is not;
    # 40 epochs, beyond the budget, plays no part
    assert pilot.choose(errors, 20) == (0.2, 10)
    assert pilot.choose(errors, 40) == (0.1, 40), "at 40 epochs 0.1 is best (11.0) and nothing shorter is near it"


@pytest.mark.slow
def test_pilot_command_at_a_tiny_size(tmp_path):
    out = tmp_path / "pilot.json"
    result = run([sys.executable, EVIDENCE / "pilot.py", "--tasks", "digits", "--rates", "0.1", "0.2", "--epochs", "1",
                  "2", "--affordable", "2", "--out", out, "--work", tmp_path / "work", "--jobs", "1"], timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    pilot = json.loads(out.read_text())["digits"]
    assert sorted((lr, e) for lr, e, _ in pilot["validation_error"]) == [(0.1, 1), (0.1, 2), (0.2, 1), (0.2, 2)]
    assert all(len(errors) == 2 and all(0 <= x <= 100 for x in errors) for _, _, errors in pilot["validation_error"])
    chosen = pilot["chosen"]
    assert f"digits: lr {chosen['lr']}, {chosen['epochs']} epochs" in result.stdout
    mean = {(lr, e): sum(v) / 2 for lr, e, v in pilot["validation_error"]}
    assert mean[chosen["lr"], 2] == min(mean[lr, 2] for lr in (0.1, 0.2)), "the best rate at the affordable budget"


def test_fashion_mnist_without_its_package_is_a_clear_error(monkeypatch, tmp_path):
    sys.path.insert(0, str(EVIDENCE))
    import tasks

    monkeypatch.setattr(tasks, "FASHION_MNIST", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"apt-get install dataset-fashion-mnist"):
        tasks.load_fashion_data()

"""The time study's parts: its straggler patterns (``benchmarks/evidence/stragglers.py``) give the factors they
say, in the proportions they say, the same for the same (seed, worker) and different across workers and seeds;
its design (``timing.py``) chooses the target by its rule, reads a time to target off a curve, and builds each
run's fields and options; its figures and the plan's predictions come out of hand-made records as their rules
say; and ``time_run.py`` at its tiny scale runs real jobs that slow the steps their pattern names."""

import itertools
import math
import json
import statistics
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "evidence"))
import stragglers  # noqa: E402
import timing  # noqa: E402

STEPS = 20_000


def take(name, worker, workers=4, seed=0, steps=STEPS):
    return list(itertools.islice(stragglers.factors(name, worker, workers, seed), steps))


def test_none_and_constant_slow_whom_they_say():
    assert set(take("none", 3, steps=100)) == {1.0}
    assert [set(take("constant", m, steps=100)) for m in range(4)] == [{1.0}, {1.0}, {1.0}, {3.0}]


def test_transient_slows_every_worker_a_tenth_of_its_steps_five_times_in_stretches_of_ten():
    for worker in range(4):
        factors = take("transient", worker)
        assert set(factors) == {1.0, 5.0}
        slowed = [f == 5.0 for f in factors]
        assert sum(slowed) / STEPS == pytest.approx(0.1, abs=0.02), worker
        stretches = [len(list(run)) for value, run in itertools.groupby(slowed) if value]
        assert statistics.fmean(stretches) == pytest.approx(10, rel=0.25), worker
    assert take("transient", 0) != take("transient", 1), "each worker is slowed on its own"


def test_heavy_step_times_are_pareto_with_their_cap():
    factors = take("heavy", 1)
    assert min(factors) >= 1.0 and max(factors) <= 50.0
    assert statistics.median(factors) == pytest.approx(2 ** 0.5, rel=0.03)  # Pareto(2): median 2^(1/2)
    assert sum(f > 10 for f in factors) / STEPS == pytest.approx(0.01, abs=0.003)  # P(X > 10) = 10^-2
    assert max(factors) > 20, "the tail is there"


def test_the_same_seed_and_worker_give_the_same_steps_whatever_the_method():
    for name in ("transient", "heavy"):
        assert take(name, 2, seed=5, steps=500) == take(name, 2, seed=5, steps=500)
        assert take(name, 2, seed=5, steps=500) != take(name, 2, seed=6, steps=500)


def test_an_unknown_pattern_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="straggler pattern 'slow': choose one of constant, heavy, none, transient"):
        stragglers.factors("slow", 0, 4, 0)


def test_the_target_is_the_worst_untimed_final_error_and_half_a_point_rounded_up_to_half_a_point():
    assert timing.target_from([0.2279, 0.2301, 0.2250]) == 0.24
    assert timing.target_from([0.235]) == 0.24, "a figure on the half point gets its half point of room"
    with pytest.raises(ValueError, match="no untimed run"):
        timing.target_from([])


def test_the_time_to_target_is_the_first_copy_at_or_below_it_and_none_when_censored():
    curve = [[0.0, 0.9], [1.0, 0.3], [2.0, 0.2], [3.0, 0.25], [4.0, 0.19]]
    assert timing.time_to_target(curve, 0.2) == 2.0
    assert timing.time_to_target(curve, 0.1) is None


def test_each_timed_run_runs_its_methods_chosen_point_with_its_launcher():
    scale = timing.SCALES["standard"]
    horovod = timing.timed_spec(scale, "horovod", 4, "constant", 3, (0.1, ()), 0.235)
    sync = timing.timed_spec(scale, "sync", 4, "constant", 3, (0.1, ()), 0.235)
    adaptive = timing.timed_spec(scale, "adaptive", 4, "constant", 3, (0.2, (8.0, 1.0)), 0.235)
    assert (horovod["source"], horovod["scale"], horovod["warmup"]) == ("horovodrun", 4.0, 1.0), horovod
    assert {k: v for k, v in sync.items() if k not in ("source", "method")} == \
        {k: v for k, v in horovod.items() if k not in ("source", "method")}, "sync runs at Horovod's point"
    assert (adaptive["constant"], adaptive["bound"], adaptive["scale"], adaptive["warmup"]) == (8.0, 1.0, 1.0, None)
    assert len({timing.key_of(s) for s in (horovod, sync, adaptive)}) == 3
    options = timing.options(adaptive, "cache", "out.json")
    assert options[:2] == ["--compensation", "adaptive"] and "--warmup" in options
    assert options[options.index("--stragglers") + 1] == "constant" and options[options.index("--bound") + 1] == "1.0"
    assert "--compensation" not in timing.options(horovod, "cache", "out.json")
    with pytest.raises(ValueError, match="straggler pattern 'slow'"):
        timing.timed_spec(scale, "none", 4, "slow", 0, (0.1, ()), 0.235)


def _record(method, seed, reached_at, per_worker=((1000, 10.0), (800, 10.0))):
    """A timed record on fashion (batch 32) with 0.1 s steps (bound 320 images/s), budget 90 s, target 0.2."""
    curve = [[1.0, 0.5]] + ([[reached_at, 0.19]] if reached_at is not None else [[80.0, 0.3]])
    return {"task": "fashion", "method": method, "seed": seed, "pattern": "none", "workers": 2, "step_time": 0.1,
            "seconds": 90.0, "target": 0.2, "curve": curve, "per_worker": [list(w) for w in per_worker]}


def test_a_cell_gives_pace_reach_and_the_median_time_with_censored_runs_above_every_time():
    import time_report

    cell = time_report.cell([_record("none", 0, 30.0), _record("none", 1, None), _record("none", 2, 40.0)])
    assert cell.images_per_s == pytest.approx(90.0) and cell.pace == pytest.approx(90.0 / 320)
    assert (cell.runs, cell.reached, cell.median_seconds) == (3, 2, 40.0)
    censored = time_report.cell([_record("none", 0, 30.0), _record("none", 1, None), _record("none", 2, None)])
    assert censored.median_seconds is None, "the median run did not reach the target"


def test_ratios_against_horovod_pair_seeds_and_say_which_bound_a_censored_time_gives():
    import time_report

    horovod = [_record("horovod", s, t) for s, t in enumerate([40.0, 60.0, None, None])]
    fast = [_record("adaptive", s, t) for s, t in enumerate([20.0, 30.0, 45.0, None])]
    ratio = time_report.ratio(fast[:2], horovod[:2])
    assert (ratio.ratio, ratio.kind, ratio.seeds) == (pytest.approx(0.5), time_report.EXACT, 2)
    assert ratio.interval == pytest.approx((0.5, 0.5))
    bounded = time_report.ratio(fast, horovod)  # seed 2: Horovod censored (at most 45/90); seed 3: both, left out
    assert (bounded.kind, bounded.seeds) == (time_report.AT_MOST, 3)
    assert bounded.ratio == pytest.approx(math.exp((3 * math.log(0.5)) / 3))
    slow = time_report.ratio(horovod[:3], fast[:3])
    assert slow.kind == time_report.AT_LEAST and slow.ratio == pytest.approx(2.0)
    one = time_report.ratio(fast[:1], horovod[:1])
    assert one.interval == (0.0, math.inf), "one seed decides nothing"
    assert time_report.ratio(fast[3:], horovod[3:]) is None


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.usefixtures("horovod_required")
def test_the_study_runs_its_untimed_and_timed_runs_and_resumes_with_nothing_left(tmp_path):
    """``time_run.py --scale tiny``: one untimed run of the Horovod recipe (the simulator) chooses the target;
    then six real jobs (Horovod under horovodrun, sync and DC-ASGD-a under mpirun; no straggler and a constant
    one, under which the last worker trains about a third as fast) record their curves and every worker's samples;
    the results page's section comes from them; a second sitting finds nothing left to run."""
    from helpers import run

    out, work = tmp_path / "out", ROOT / "build" / "evidence"
    command = [sys.executable, ROOT / "benchmarks" / "evidence" / "time_run.py", "--scale", "tiny", "--out", out,
               "--work", work]
    first = run(command, timeout=900)
    assert first.returncode == 0, first.stdout[-4000:]
    evidence = json.loads((out / "results" / "time" / "evidence.json").read_text())
    untimed = evidence["untimed"]
    assert len(untimed) == 1 and untimed[0]["source"] == "simulator" and untimed[0]["method"] == "horovod"
    assert evidence["targets"] == {"2": math.ceil((untimed[0]["final_error"] + 0.005) * 200 - 1e-9) / 200}
    records = evidence["records"]
    assert not [r["failed"] for r in records if "failed" in r]
    assert sorted((r["pattern"], r["method"]) for r in records) == sorted(
        (p, m) for p in ("none", "constant") for m in ("horovod", "sync", "adaptive"))
    for r in records:
        assert len(r["per_worker"]) == 2 and all(samples > 0 for samples, _ in r["per_worker"]), r["key"]
        assert r["target"] == evidence["targets"]["2"] and r["curve"], r["key"]
        assert ("horovodrun" in r["command"]) == (r["method"] == "horovod"), r["command"]
    assert [s["runs"] for s in evidence["sessions"]] == [6]
    # under `constant` the last worker's steps take three times as long: asynchronous, it trains about a third as
    # fast as the other; synchronous, both train at its pace, about a third of their pace with no straggler
    # (bounded loosely: a loaded machine slows every step)
    pace = {(r["pattern"], r["method"]): [samples / seconds for samples, seconds in r["per_worker"]] for r in records}
    fast, slow = pace[("constant", "adaptive")]
    assert 0.15 < slow / fast < 0.6, pace
    for method in ("horovod", "sync"):
        assert 0.15 < max(pace[("constant", method)]) / min(pace[("none", method)]) < 0.6, (method, pace)
    import time_report

    section = "\n".join(time_report.write_section(out))
    assert "6 of 6 timed runs recorded" in section and "**none**: no straggler." in section, section
    assert section.count("| Horovod (horovodrun, yield when idle) | 1 |") == 2, section
    second = run(command, timeout=300)
    assert second.returncode == 0 and "6 timed runs recorded already (skipped); 0 to run now" in second.stdout, \
        second.stdout[-3000:]


def test_the_predictions_are_decided_by_their_rules_on_complete_cells_only():
    import time_report

    def runs(pattern, method, times, per_worker=((3000, 10.0), (3000, 10.0))):
        return [{**_record(method, s, t, per_worker), "pattern": pattern} for s, t in enumerate(times)]

    grouped = time_report.cells([
        *runs("none", "horovod", [40.0, 42.0, 38.0]), *runs("none", "sync", [41.0, 43.0, 39.0]),
        *runs("none", "adaptive", [20.0, 22.0, 19.0]),
        *runs("constant", "horovod", [80.0, 85.0, None]), *runs("constant", "adaptive", [20.0, 21.0, 22.0]),
        *runs("constant", "none", [25.0, 26.0, 27.0]), *runs("constant", "gap_aware", [70.0, 80.0, 75.0]),
    ])
    verdicts = {name: verdict for name, _, verdict in time_report.predictions(grouped, 2, seeds=3)}
    assert verdicts["T1"] == "holds", "3000 samples in 10 s: 300 images/s, 0.94 of 320"
    assert verdicts["T2"] == "holds" and verdicts["T3"] == "holds"
    assert verdicts["T4"] == "refuted", "Horovod reached in 2 of 3 (fewer than 4), and Gap-Aware's ratio is about 0.9"
    assert verdicts["T5"] == verdicts["T6"] == "not decided", "no transient or heavy runs: not decided"
    slow = time_report.cells(runs("none", "horovod", [40.0] * 3, ((2000, 10.0), (2000, 10.0)))
                             + runs("none", "sync", [40.0] * 3))
    assert time_report.predictions(slow, 2, seeds=3)[0][2] == "refuted", "Horovod at 200 images/s: 0.63 of 320"
    incomplete = {name: verdict for name, _, verdict in time_report.predictions(grouped, 2, seeds=5)}
    assert set(incomplete.values()) == {"not decided"}, incomplete


def test_the_page_reports_no_ratio_against_a_horovod_below_its_machines_pace():
    """By the plan: Horovod below 0.9 of the bound with no straggler, no ratio against it; a `sync` below it keeps
    its row, marked."""
    import time_report

    def page(horovod_samples, sync_samples):
        records = [_record("horovod", 0, 40.0, [(horovod_samples, 10.0)] * 2),
                   _record("sync", 0, 42.0, [(sync_samples, 10.0)] * 2), _record("adaptive", 0, 20.0)]
        evidence = {"sessions": [{"commit": "abc1234", "clean": True}], "targets": {"2": 0.2},
                    "untimed": [{"workers": 2, "final_error": 0.195}], "records": records}
        return "\n".join(time_report.section_lines(evidence, "results/TIME_PLAN.md", 3, 1))

    paced = page(3000, 2500)
    assert "no ratio against it" not in paced and "| SSGD (this project's sync, Horovod's rate) (below its " \
        "machine's pace) | 1 |" in paced and "| bounded DC-ASGD-a | 1 | 90 (0.28) | 1 of 1 | 20 s | 0.50 |" in paced
    starved = page(2000, 3000)
    assert "Horovod trained 0.62 of the padding's bound with no straggler, below 0.9: by the plan, no ratio" in starved
    assert "| bounded DC-ASGD-a | 1 | 90 (0.28) | 1 of 1 | 20 s | - | - | - |" in starved, starved

"""The benchmark scripts keep working, and each writes its section of the
performance page: tiny sizes, into a temporary copy of docs/PERFORMANCE.md,
no timing asserted."""

import argparse
import importlib.util
import math
import re
import shutil
import statistics
import sys

import pytest

from helpers import ROOT, mpirun, python

sys.path.insert(0, str(ROOT / "docs"))

import generate  # noqa: E402

BENCH = ROOT / "benchmarks"
RATIO = r"ratio (?:raw/\w+ +)?(\d+\.\d\d)"
MODES = ("none", "constant", "adaptive", "sync")


@pytest.fixture
def page(tmp_path):
    """A temporary copy of the performance page, and its sections before."""
    copy = tmp_path / "PERFORMANCE.md"
    shutil.copyfile(ROOT / "docs" / "PERFORMANCE.md", copy)
    return copy, copy.read_text()


def _section(page, script, argv):
    """The section ``script`` wrote, after checking that nothing else changed
    and that it says how, when and where it was measured."""
    path, before = page
    after = path.read_text()
    name = f"benchmarks/{script}"
    body = generate.sections(after)[name]
    assert generate.replace_section(before, name, body) == after, "only the benchmark's own section may change"
    head = body.splitlines()[0]
    assert head.startswith(f"`python benchmarks/{script} {' '.join(map(str, argv))}`"), head
    assert re.search(r"\d{4}-\d\d-\d\d\. Machine: \d+ cores .*torch .* with \d+ threads; ", head), head
    return body


def _table(body):
    """The rows of the section's one table, as lists of cells; every row as wide as the header."""
    lines = [line for line in body.splitlines() if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert len(rows) >= 3 and set(lines[1]) <= set("|-"), body
    assert all(len(row) == len(rows[0]) for row in rows), body
    return rows[2:]


def test_apply_benchmark_runs_and_writes_its_section(page):
    argv = ["--numel", 4096, "--repeats", 1, "--markdown", page[0]]
    result = python(BENCH / "bench_apply.py", *argv, timeout=120)
    assert result.returncode == 0, result.stdout
    assert len(re.findall(RATIO, result.stdout)) == 12, result.stdout
    rows = _table(_section(page, "bench_apply.py", argv))
    assert len(rows) == 12 and rows[0][-1] == "1.00", rows
    # each update's bytes, counted from its transfers; its rate is those bytes over its time
    assert rows[0][3:5] == [f"{4096 * 10 / 1e6:.3g}"] * 2, rows  # the copy: 2.5 model sizes read and written
    for row in rows:
        ms, read, written, rate = (float(cell) for cell in row[2:6])
        assert read > 0 and written > 0, row
        assert rate == pytest.approx((read + written) / ms, rel=0.03), row  # MB per ms: GB/s, to 3 figures
    assert {row[1] for row in rows[2:]} <= {"`fused_sgd`", "`fused`", "`foreach`", "`reference`"}, rows


@pytest.mark.mpi
def test_transport_benchmark_runs_under_mpirun():
    result = mpirun(2, BENCH / "bench_transport.py", "--numel", 4096, "--repeats", 1, timeout=120)
    assert result.returncode == 0, result.stdout
    assert len(re.findall(RATIO, result.stdout)) == 2, result.stdout


@pytest.mark.mpi
@pytest.mark.slow
def test_transport_benchmark_compares_the_paths_and_writes_its_section(page):
    argv = ["--numel", 4096, "--repeats", 1, "--markdown", page[0]]
    result = python(BENCH / "bench_transport.py", *argv, timeout=400)
    assert result.returncode == 0, result.stdout
    rows = _table(_section(page, "bench_transport.py", argv))
    assert [row[0].split(",")[0] for row in rows] == ["one node", "one node", "TCP"], rows
    assert all(re.fullmatch(r"[\d.]+ ms \(\d+\.\d\d\)", cell) for row in rows for cell in row[-2:]), rows


@pytest.mark.mpi
@pytest.mark.slow
def test_end_to_end_benchmark_runs_and_writes_its_section(page):
    argv = ["--workers", 1, "--numel", 4096, "--steps", 5, "--markdown", page[0]]  # nine mpiruns: the fewest ranks
    result = python(BENCH / "bench_end_to_end.py", *argv, timeout=600)
    assert result.returncode == 0, result.stdout
    assert re.search(r"^  raw RMA protocol .* [\d.]+ updates/s$", result.stdout, re.MULTILINE), result.stdout
    lines = re.findall(r"^  (\w+) +Horovod (on|off) +[\d.]+ updates/s .* ratio to raw [\d.]+", result.stdout,
                       re.MULTILINE)
    settings = ["on", "off"] if importlib.util.find_spec("horovod") else ["off"]
    assert lines == [(m, h) for m in MODES for h in settings], result.stdout
    rows = _table(_section(page, "bench_end_to_end.py", argv))
    assert [row[0].split()[0] for row in rows] == ["raw"] + [f"`{m}`" for m in MODES], rows
    width = 1 + 3 * len(settings) + (len(settings) == 2) + 1 + len(settings)
    assert all(len(row) == width for row in rows), rows
    # each mode's bytes per update (counted from its transfers), then updates/s times them against the copy
    assert all(re.fullmatch(r"[\d.]+ \+ [\d.]+", row[width - 1 - len(settings)]) for row in rows[1:]), rows
    assert all(re.fullmatch(r"\d+\.\d\d \(\d+\.\d\d\)", cell) for row in rows[1:] for cell in row[-len(settings):])
    assert rows[0][2] == "1.00" and rows[1][3] == "1.00", rows  # raw to raw, ASGD to ASGD
    raw = float(rows[0][1])
    assert all(abs(float(row[2]) - float(row[1]) / raw) < 0.01 for row in rows[1:]), rows


def test_markdown_needs_every_path_so_not_under_mpirun(tmp_path, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    result = python(BENCH / "bench_transport.py", "--markdown", tmp_path / "page.md", timeout=60)
    assert result.returncode != 0 and "without mpirun" in result.stdout, result.stdout
    assert not (tmp_path / "page.md").exists()


def test_servers_benchmark_compares_one_server_with_two_and_writes_its_section(page):
    argv = ["--workers", 1, "--numel", 4096, "--steps", 5, "--markdown", page[0]]
    result = python(BENCH / "bench_servers.py", *argv, timeout=600)
    assert result.returncode == 0, result.stdout
    rows = _table(_section(page, "bench_servers.py", argv))
    assert [(row[0].split()[0], row[1]) for row in rows] == [("`none`", "1"), ("`none`", "2"), ("`adaptive`", "1"),
                                                             ("`adaptive`", "2")], rows
    one, two = float(rows[0][4]), float(rows[1][4])
    # what a server moves per update: the learning rates and its slice of the gradient in, its slice of the
    # weights out (4096 float32 split in two, the header 64 bytes on each)
    assert (one, two) == (round((64 + 2 * 4096 * 4) / 1e6, 3), round((64 + 2 * 2048 * 4) / 1e6, 3)), rows
    assert all(row[3] == "1.00" and row[5] == "1.00" and row[7] == "1.00" for row in rows[::2]), rows


def test_the_scaling_model_on_a_hand_computed_case_and_its_section(tmp_path):
    sys.path.insert(0, str(BENCH))
    import scaling

    # 1M parameters, 1 ns each: 1 ms to apply on one server; 8 MB over 8 GB/s: 1 ms on the link
    assert scaling.server_rate(1e-9, 1_000_000, 1, 8e9) == (pytest.approx(1000.0), "apply")
    assert scaling.server_rate(1e-9, 1_000_000, 2, 4e9) == (pytest.approx(1000.0), "link")
    # 4 workers, 9 ms of compute + 1 ms of transfer each: 400 pushes/s asked
    assert scaling.demand(4, 0.009, 1_000_000, 8e9) == pytest.approx(400.0)
    assert scaling.predict(1e-9, 4, 1, 1_000_000, 0.009, 8e9) == (pytest.approx(400.0), "workers")
    assert scaling.predict(4e-9, 4, 1, 1_000_000, 0.009, 8e9) == (pytest.approx(250.0), "server apply")
    assert scaling.fewest_servers(4e-9, 4, 1_000_000, 0.009, 8e9) == 2
    copy = tmp_path / "SCALING.md"
    shutil.copyfile(ROOT / "docs" / "SCALING.md", copy)
    result = python(BENCH / "scaling.py", "--markdown", copy, timeout=120)
    assert result.returncode == 0, result.stdout
    body = generate.sections(copy.read_text())["benchmarks/scaling.py"]
    assert "apply time per parameter per update, `none` with SGD, CPU server" in body, body
    assert "| 32 | 8 | 296 |" in body, body  # 32 workers of 100 ms + 8 ms of transfer each
    # the committed section is the model's reading of the committed PERFORMANCE.md, not of an older one:
    # everything but its first line (the command, the date and the machine) is what the script writes now
    committed = generate.sections((ROOT / "docs" / "SCALING.md").read_text())["benchmarks/scaling.py"]
    assert committed.splitlines()[1:] == body.splitlines()[1:], (
        "docs/SCALING.md is stale against docs/PERFORMANCE.md: run python benchmarks/scaling.py --markdown "
        "docs/SCALING.md")


def test_the_comparison_of_two_commits_pairs_rounds_and_decides_on_a_tolerance():
    """compare_commits.py's ratio of a round is this tree's rate over the
    earlier commit's in that round: a machine twice as fast in one round
    changes nothing, so equal ratios give an interval of width zero; the
    verdict follows where the interval lies against the tolerance.  (A real
    comparison runs bench_end_to_end.py from both trees for minutes: its
    command is on the performance page.)"""
    sys.path.insert(0, str(BENCH))
    import compare_commits

    mean, interval = compare_commits.ratio_interval([98.0, 196.0, 147.0], [100.0, 200.0, 150.0])
    assert mean == pytest.approx(0.98) and interval == pytest.approx((0.98, 0.98))
    mean, (low, high) = compare_commits.ratio_interval([90.0, 210.0, 150.0], [100.0, 200.0, 150.0])
    logs = [math.log(0.9), math.log(1.05), 0.0]
    half = 4.302653 * statistics.stdev(logs) / math.sqrt(3)  # t(0.975, 2 degrees of freedom)
    assert (low, high) == pytest.approx((math.exp(statistics.fmean(logs) - half),
                                         math.exp(statistics.fmean(logs) + half)), rel=1e-6)
    assert compare_commits.verdict((0.96, 1.2), 0.95) == "no slowdown"
    assert compare_commits.verdict((0.80, 0.94), 0.95) == "slower"
    assert compare_commits.verdict((0.90, 1.10), 0.95) == "not decided by this run"
    assert compare_commits.ratio_interval([1.0], [2.0])[1] == (0.0, math.inf), "one round decides nothing"


def test_compare_commits_sets_only_the_packages_variables_for_this_tree():
    """``--new-env``: NAME=VALUE items of HVD_DCASGD_ variables (an earlier default for this tree's runs); anything
    else is the parser's error, naming the item."""
    sys.path.insert(0, str(BENCH))
    import compare_commits

    parser = argparse.ArgumentParser(prog="compare_commits.py")
    assert compare_commits.new_env(parser, ["HVD_DCASGD_BOUND=inf", "HVD_DCASGD_LAMBDA=2"]) == {
        "HVD_DCASGD_BOUND": "inf", "HVD_DCASGD_LAMBDA": "2"}
    for item in ("HVD_DCASGD_BOUND", "PATH=/bin", "HVD_DCASGD_SUMMARY=/tmp/x"):
        with pytest.raises(SystemExit):
            compare_commits.new_env(parser, [item])


def test_compare_commits_gives_the_variables_to_this_trees_runs_only(monkeypatch):
    """Each round runs both trees, in alternating order; only this tree's runs get ``--new-env``'s variables."""
    sys.path.insert(0, str(BENCH))
    import compare_commits

    runs = []

    def run_once(tree, mode, args, extra=None):  # records what compare() asks for instead of starting a job
        runs.append((tree, mode, extra))
        return {"updates_per_s": 100.0, "apply_seconds_per_update": 1e-3}

    monkeypatch.setattr(compare_commits, "run_once", run_once)
    args = argparse.Namespace(rounds=2, modes=["adaptive"], new_env={"HVD_DCASGD_BOUND": "inf"})
    compare_commits.compare("base-tree", "new-tree", args)
    assert runs == [("base-tree", "adaptive", None), ("new-tree", "adaptive", {"HVD_DCASGD_BOUND": "inf"}),
                    ("new-tree", "adaptive", {"HVD_DCASGD_BOUND": "inf"}), ("base-tree", "adaptive", None)]


def test_compare_commits_reports_each_measure_as_a_speed_ratio():
    """Both measures read as speed (above 1: this tree is faster): updates/s this tree's over the earlier one's,
    the server's seconds per update the earlier one's over this tree's; a line says where the update paths differ."""
    sys.path.insert(0, str(BENCH))
    import compare_commits

    def summary(rate, seconds, path="fused_sgd"):
        return {"updates_per_s": rate, "apply_seconds_per_update": seconds, "update_path": {"path": path}}

    runs = {"adaptive": {"base": [summary(100.0, 2e-3), summary(50.0, 4e-3)],
                         "new": [summary(80.0, 1e-3), summary(40.0, 2e-3, "foreach")]}}
    rate, apply, paths = compare_commits.report(runs, 0.95)
    assert rate.startswith("DC-ASGD-a (adaptive), updates/s: speed ratio new/base 0.800, 95% interval "
                           "[0.800, 0.800] over 2 rounds (ratios 0.800, 0.800)") and rate.endswith(": slower"), rate
    assert apply.startswith("DC-ASGD-a (adaptive), the server's time per update (compensate and step): speed ratio "
                            "base/new 2.000, 95% interval [2.000, 2.000]") and apply.endswith(": no slowdown"), apply
    assert paths == "DC-ASGD-a (adaptive): the update paths differ: base fused_sgd, new foreach, fused_sgd"


def test_end_to_end_ratios_are_paired_within_rounds():
    """The ratio of a round is taken between the runs of that round: a
    machine twice as fast in the second round changes no ratio, so equal
    ratios give an interval of width zero; ratios that vary give the
    geometric mean with its 95% t interval, and the verdict on the target
    follows where the interval lies."""
    sys.path.insert(0, str(BENCH))
    import bench_end_to_end

    runs = {("raw", "0"): [(100.0, 100.0), (200.0, 200.0), (150.0, 150.0)],
            ("none", "0"): [(95.0, 95.0), (190.0, 190.0), (142.5, 142.5)],
            ("constant", "0"): [(81.0, 81.0), (144.0, 144.0), (108.0, 108.0)],
            ("adaptive", "0"): [(47.5, 47.5), (190.0, 190.0), (114.0, 114.0)]}
    lines = bench_end_to_end._paired_ratios(runs, ("0",))
    assert lines[0] == ("ASGD / raw, Horovod off: 0.95, 95% interval [0.95, 0.95] "
                        "(median 0.95, range 0.95 to 0.95); target 0.90: met"), lines
    # DC-ASGD-c / ASGD: 0.85, 0.76, 0.76 -- no target, so no verdict
    assert lines[1].startswith("DC-ASGD-c / ASGD, Horovod off: 0.79, 95% interval [") and "target" not in lines[1]
    # DC-ASGD-a / ASGD: 0.5, 1.0, 0.8; geometric mean 0.737, t(0.975, 2) = 4.303
    logs = [math.log(0.5), math.log(1.0), math.log(0.8)]
    half = 4.302653 * statistics.stdev(logs) / math.sqrt(3)
    low, high = (math.exp(statistics.fmean(logs) + s * half) for s in (-1, 1))
    assert lines[2] == (f"DC-ASGD-a / ASGD, Horovod off: 0.74, 95% interval [{low:.2f}, {high:.2f}] "
                        "(median 0.80, range 0.50 to 1.00); target 0.90: not decided by this run"), lines
    below = bench_end_to_end.paired_ratio([(80.0, 0), (85.0, 0), (82.0, 0)], [(100.0, 0)] * 3, target=0.9)
    assert below.endswith("target 0.90: missed"), below


def test_metrics_overhead_pairs_each_round_alternating_the_order(monkeypatch, capsys):
    """``--metrics-overhead``: in each round one run with the metrics and one
    without, the order alternating; the ratio on / off within each round, its
    geometric mean with the 95% t interval."""
    sys.path.insert(0, str(BENCH))
    import bench_end_to_end

    asked = []
    rates = iter([90.0, 100.0, 200.0, 180.0, 80.0, 100.0])  # rounds: on, off; off, on; on, off

    def run_once(args, mode, horovod, servers=1, **extra):
        asked.append((mode, "HVD_DCASGD_METRICS" in extra, extra.get("HVD_DCASGD_METRICS_INTERVAL")))
        return {"updates_per_s": next(rates), "seconds": 1.0}

    monkeypatch.setattr(bench_end_to_end, "run_once", run_once)
    args = bench_end_to_end.argparse.Namespace(mode="adaptive", rounds=3, metrics_interval=1.0, workers=4,
                                               numel=1000, steps=10)
    bench_end_to_end.metrics_overhead(args)
    assert asked == [("adaptive", True, "1"), ("adaptive", False, None), ("adaptive", False, None),
                     ("adaptive", True, "1"), ("adaptive", True, "1"), ("adaptive", False, None)]
    logs = [math.log(0.9), math.log(0.9), math.log(0.8)]
    half = 4.302653 * statistics.stdev(logs) / math.sqrt(3)
    low, high = (math.exp(statistics.fmean(logs) + s * half) for s in (-1, 1))
    out = capsys.readouterr().out
    assert (f"ratio on / off: geometric mean {math.exp(statistics.fmean(logs)):.3f}, 95% t interval "
            f"[{low:.3f}, {high:.3f}] (median 0.900, range 0.800 to 0.900)") in out, out


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.usefixtures("horovod_required")
def test_drop_in_accuracy_benchmark_runs_and_writes_its_section(tmp_path):
    copy = tmp_path / "USAGE.md"
    shutil.copyfile(ROOT / "docs" / "USAGE.md", copy)
    page = (copy, copy.read_text())
    # one worker, the default mode and sync: six mpiruns, each with the fewest ranks (every mode of the drop-in
    # script against plain Horovod at 4 workers, sync equal at every epoch: tests/test_horovod.py's every-mode test)
    argv = ["--workers", 1, "--rounds", 2, "--epochs", 1, "--modes", "adaptive", "sync", "--markdown", copy]
    result = python(BENCH / "drop_in_accuracy.py", *argv, timeout=600)
    assert result.returncode == 0, result.stdout
    assert len(re.findall(r"^round \d: plain Horovod 0\.\d+, adaptive 0\.\d+, sync 0\.\d+$", result.stdout,
                          re.MULTILINE)) == 2, result.stdout
    section = _section(page, "drop_in_accuracy.py", argv)
    assert "in the modes `adaptive`, `sync`, one mpirun each" in section, section
    rows = _table(section)
    assert [row[0].split()[0] for row in rows] == ["`adaptive`", "`sync`"], rows
    assert rows[-1][2:] == ["+0.00 [+0.00, +0.00]", "+0.00", "met"], rows  # sync is plain Horovod's algorithm


def test_drop_in_accuracy_is_a_paired_difference_with_a_verdict_on_the_margin():
    """Differences of each round from plain Horovod's run in that round, in
    points; the interval is the 95% t interval by hand; met, missed and not
    decided follow where it lies against -3 points."""
    sys.path.insert(0, str(BENCH))
    import drop_in_accuracy

    plain = [0.95, 0.96, 0.95]
    rows = drop_in_accuracy.rows(plain, {"none": [0.96, 0.94, 0.95], "constant": [0.90, 0.92, 0.90],
                                         "sync": plain})
    differences = [1.0, -2.0, 0.0]
    half = 4.302653 * statistics.stdev(differences) / math.sqrt(3)
    mean = statistics.fmean(differences)
    assert rows[0] == ["`none` (ASGD)", "95.00%", f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}]",
                       "-2.00", "not decided by this run"], rows
    assert rows[1][3:] == ["-5.00", "missed"], rows  # -5, -4, -5 points: the interval lies below -3
    assert rows[2][2:] == ["+0.00 [+0.00, +0.00]", "+0.00", "met"], rows
    assert drop_in_accuracy.final_accuracy("Accuracy: 10.00%\n...Accuracy: 96.94%") == pytest.approx(0.9694)


@pytest.mark.mpi
@pytest.mark.slow
def test_overlap_benchmark_times_the_step_against_its_bounds_and_writes_its_section(page):
    argv = ["--width", 64, "--depth", 2, "--rounds", 1, "--fusion-threshold", 4096, "--markdown", page[0]]
    result = python(BENCH / "bench_overlap.py", *argv, timeout=600)
    assert result.returncode == 0, result.stdout
    rows = _table(_section(page, "bench_overlap.py", argv))
    assert [row[0].split(",")[0] for row in rows] == ["one node", "TCP", "TCP as above"], rows
    for row in rows:
        compute, exchange, _, _, low, high = (float(cell) for cell in row[2:8])
        assert low == pytest.approx(max(compute, exchange), abs=0.06) and high == pytest.approx(compute + exchange,
                                                                                               abs=0.11), row


def test_the_slowest_tests_table_ranks_by_time_and_says_the_total():
    sys.path.insert(0, str(BENCH))
    import suite_durations

    tests = {"a.py::fast": 1.0, "b.py::slow": 300.0, "c.py::mid": 99.0, "b.py::other": 200.0}
    body = suite_durations.lines({"seconds": 600.0, "status": 0, "tests": tests}, top=2)
    assert body[0] == ("The whole suite: 4 tests, 10.0 minutes from start to end (exit status 0). The 2 slowest "
                       "tests take 8.3 minutes of them:"), body
    assert body[4:6] == ["| `b.py::slow` | 300 | 50.0% |", "| `b.py::other` | 200 | 33.3% |"], body
    assert body[-2:] == ["| `b.py` | 2 | 500 | 83.3% |", "| `c.py` | 1 | 99 | 16.5% |"], body
    # two test processes side by side: the sentence says so, and what the tests' times add up to
    body = suite_durations.lines({"seconds": 240.0, "status": 1, "processes": 2, "tests": tests}, top=2)
    assert body[0] == ("The whole suite: 4 tests, 4.0 minutes from start to end (exit status 1), 2 test processes "
                       "side by side; the tests' own times add up to 10.0 minutes. The 2 slowest tests take 8.3 "
                       "minutes of them:"), body


def test_sync_pace_gives_each_configuration_its_fraction_of_the_padding_bound(page, monkeypatch):
    """Horovod's configurations each add one setting to the one before (so each row says what its setting
    bought); Horovod runs under horovodrun with as many slots as workers, ``sync`` under mpirun with a server
    more; the table gives each configuration's mean images/s per worker over the bound (batch / step time)."""
    sys.path.insert(0, str(BENCH))
    import bench_sync_pace

    for (_, before), (_, after) in zip(bench_sync_pace.HOROVOD, bench_sync_pace.HOROVOD[1:]):
        assert before.items() < after.items() and len(after) == len(before) + 1, (before, after)
    args = argparse.Namespace(task="fashion", step_time=0.1, seconds=3.0, cache="data", timeout=60, rounds=1,
                              workers=[2, 3], markdown=str(page[0]))
    horovod = bench_sync_pace.command("horovod", 3, args, "out.json")
    assert horovod[1:5] == ["-np", "3", "-H", "localhost:3"] and "--plain-horovod" in horovod, horovod
    sync = bench_sync_pace.command("sync", 3, args, "out.json")
    assert sync[sync.index("-np") + 1] == "4" and sync[sync.index("--compensation") + 1] == "sync", sync

    rates = {("horovod", 2): [100.0, 110.0], ("sync", 2): [300.0, 300.0],
             ("horovod", 3): [80.0, 80.0, 83.0], ("sync", 3): [288.0, 288.0, 288.0]}
    monkeypatch.setattr(bench_sync_pace, "run_once",  # each worker's (samples, seconds): 10 s of training
                        lambda kind, variables, workers, _: [(10 * rate, 10.0) for rate in rates[kind, workers]])
    monkeypatch.setattr(sys, "argv", ["bench_sync_pace.py", "--workers", "2", "3", "--markdown", str(page[0])])
    bench_sync_pace.launch(args)
    rows = _table(_section(page, "bench_sync_pace.py", ["--workers", 2, 3, "--markdown", page[0]]))
    assert len(rows) == 2 * len(bench_sync_pace.cases()), rows
    by_case = {(row[0], row[1]): row[3:] for row in rows}
    assert by_case["2", "Horovod, as launched"] == ["105.0", "0.33"], rows  # bound: 32 images / 0.1 s = 320
    assert by_case["3", "`sync`, as launched"] == ["288.0", "0.90"], rows
    assert by_case["3", "+ Open MPI's yield when idle"][0] == "81.0", rows


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.usefixtures("horovod_required")
def test_the_time_studys_script_stops_every_synchronous_worker_at_the_same_step():
    """Plain Horovod under horovodrun and this project's ``sync``, two workers each, the study's real script: the
    workers agree to stop only once a second (every 10 steps of 0.1 s), so each trains the same number of steps,
    a multiple of 10 (2 s is far less than an epoch's 187 full batches of 32)."""
    sys.path.insert(0, str(BENCH))
    import bench_sync_pace

    args = argparse.Namespace(task="fashion", step_time=0.1, seconds=2.0, timeout=300,
                              cache=str(ROOT / "build" / "evidence" / "data"))
    for kind in ("horovod", "sync"):
        workers = bench_sync_pace.run_once(kind, {}, 2, args)
        assert len(workers) == 2 and workers[0][0] == workers[1][0] > 0, (kind, workers)
        assert workers[0][0] % (32 * 10) == 0, (kind, workers)


def test_sync_pace_runs_get_only_their_own_settings(monkeypatch):
    """A case's run has the settings of that case alone: the ones any case varies, and the package's and
    Horovod's own variables, are taken from the environment; other Open MPI settings (a host's) stay."""
    sys.path.insert(0, str(BENCH))
    import bench_sync_pace

    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "1")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "20")
    monkeypatch.setenv("HVD_DCASGD_BOUND", "inf")
    monkeypatch.setenv("OMPI_MCA_btl_tcp_if_include", "lo")
    plain = bench_sync_pace.environment({})
    assert not {"OMPI_MCA_mpi_yield_when_idle", "HOROVOD_CYCLE_TIME", "HVD_DCASGD_BOUND"} & set(plain), plain
    assert plain["OMPI_MCA_btl_tcp_if_include"] == "lo"
    recipe = bench_sync_pace.environment(bench_sync_pace.HOROVOD[2][1])
    assert recipe["OMPI_MCA_mpi_yield_when_idle"] == "1" and recipe["HOROVOD_CYCLE_TIME"] == "5", recipe


@pytest.mark.mpi
def test_the_join_handshake_benchmark_admits_a_worker_of_another_launch_both_ways(page):
    """A worker started by a separate ``mpirun`` is admitted by the running
    job through ``ompi-server`` (Publish_name, Lookup_name, Connect/Accept,
    Merge, two windows), by the serving loop itself and by a helper thread."""
    argv = ["--rounds", 1, "--markdown", page[0]]
    result = python(BENCH / "join_handshake.py", *argv, timeout=300)
    assert result.returncode == 0, result.stdout
    rows = [line.split() for line in result.stdout.splitlines()[1:3]]
    assert [row[0] for row in rows] == ["loop", "thread"], result.stdout
    for row in rows:
        assert all(cell.endswith("ms") and float(cell[:-2]) > 0 for cell in row[2:5]), result.stdout
        assert all(float(cell) > 0 for cell in row[5:8]), result.stdout
    table = _table(_section(page, "join_handshake.py", argv))
    assert [row[0] for row in table] == ["`loop`", "`thread`"], table
    assert all(float(cell) > 0 for row in table for cell in row[2:]), table

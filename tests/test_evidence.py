"""The evidence command end to end at its smallest size: simulator runs, one
real mpirun run, the tables, the plots and RESULTS.md, into a temp dir."""

import json
import sys

from conftest import ROOT, mpirun, run


def test_evidence_command_writes_tables_plots_and_a_replayable_real_run(tmp_path):
    out = tmp_path / "docs"
    result = run([sys.executable, ROOT / "benchmarks" / "evidence" / "run.py", "--scale", "tiny",
                  "--out", out, "--work", tmp_path / "work"], timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    page = (out / "RESULTS.md").read_text()
    for heading in ("## Table 1 at CPU scale", "### Reading, computed from the numbers above", "## lambda_0 sweep",
                    "## Delay models against the real system", "## Wall-clock and throughput"):
        assert heading in page
    figures = sorted(p.name for p in (out / "results").glob("*.png"))
    assert figures == ["error_vs_epoch_digits.png", "error_vs_seconds_digits.png", "lambda_sweep.png", "staleness.png"]
    for name in figures:
        assert (out / "results" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"results/{name}" in page

    records = json.loads((out / "results" / "evidence.json").read_text())["records"]
    real = [r for r in records if r["source"] == "mpi"]
    assert len(real) == 1 and "failed" not in real[0], real
    real = real[0]
    assert sum(samples for samples, _ in real["per_worker"]) == 2 * 1438, "two epochs of digits' training set, split over the workers"
    trace = [json.loads(line) for line in open(real["trace"])]
    assert sum(real["staleness"].values()) == len(trace) == sum(-(-s // 16) for s in (719, 719)) * 2
    replay = [r for r in records if r["source"] == "simulator" and r["delay"] == "trace"]
    assert len(replay) == 1
    # the simulator on the real run's order, batches and initial weights lands where the real run did
    assert abs(replay[0]["final_error"] - real["final_error"]) <= 1 / 359
    assert f"{100 * real['final_error']:.2f}" in page


def test_digits_example_straggler_pushes_late(tmp_path):
    """With --straggler the last worker's pushes reach the server later: in
    asynchronous training it has pushed fewer of the first half's gradients."""
    trace = tmp_path / "trace.jsonl"
    result = mpirun(3, ROOT / "examples" / "train_digits.py", "--epochs", 1, "--compensation", "none",
                    "--straggler", 4, "--trace", trace, timeout=300)
    assert result.returncode == 0, result.stdout
    assert "final test accuracy" in result.stdout
    workers = [json.loads(line)["worker"] for line in trace.read_text().splitlines()]
    first_half = workers[: len(workers) // 2]
    assert workers.count(0) == workers.count(1)  # the same epochs each
    assert first_half.count(1) < first_half.count(0)

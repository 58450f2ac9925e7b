"""What a user watches while a job runs: the server's metrics (TensorBoard
event files, or a CSV), its progress lines, and the package's messages
through logging."""

import csv
import math
import re
import sys
import textwrap

import pytest

from helpers import PROGRAMS, mpirun, python

WORKERS, STEPS = 2, 40
SCALARS = {"updates", "updates_per_s", "gradients_per_s", "staleness/mean", "staleness/max", "refused", "workers",
           "apply_seconds_per_update", "checkpoint_seconds", "compensation_ratio",
           *(f"worker{m}/{what}" for m in range(WORKERS) for what in ("pushes_per_s", "seconds_since_push"))}
PROGRESS = re.compile(r"^\[rank \d\] hvd_dcasgd server(?: \d)?: (\d+) updates, ([\d.]+) updates/s, staleness mean ([\d.]+); "
                      r"slowest worker (\d) \(MPI rank (\d)\) at ([\d.]+) pushes/s; "
                      r"(no checkpoint yet|last checkpoint \d+s ago)$", re.M)


def _job(tmp_path, env, servers=1, timeout=240):
    """Two workers of 40 steps of 0.05 s each (a job of a few seconds) that
    checkpoint often; the metrics and progress as ``env`` says."""
    result = mpirun(WORKERS + servers, PROGRAMS / "synthetic.py", "--steps", STEPS, "--step-time", 0.05,
                    "--compensation", "adaptive", timeout=timeout,
                    env={"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
                         "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.5", "HVD_DCASGD_SERVERS": str(servers), **env})
    assert result.returncode == 0, result.stdout
    return result.stdout


@pytest.mark.mpi
@pytest.mark.slow
def test_tensorboard_event_files_and_progress_lines(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install tensorboard (the [test] extra) reads the event files")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = _job(tmp_path, {"HVD_DCASGD_METRICS": str(tmp_path / "runs"), "HVD_DCASGD_METRICS_INTERVAL": "0.5",
                          "HVD_DCASGD_PROGRESS": "0.5"})
    events = EventAccumulator(str(tmp_path / "runs" / "server"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == SCALARS and events.Tags()["histograms"] == ["staleness"]
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in SCALARS}
    total = WORKERS * STEPS
    assert len(scalars["updates"]) >= 2 and scalars["updates"][-1] == (total, total), "the end writes the last figures"
    assert [step for step, _ in scalars["updates"]] == sorted(step for step, _ in scalars["updates"])
    assert all(value == step for step, value in scalars["updates"]), "the step is the update count"
    histograms = events.Histograms("staleness")
    assert sum(h.histogram_value.num for h in histograms) == total, "every gradient in one interval's histogram"
    assert all(0 <= h.histogram_value.min <= h.histogram_value.max <= total for h in histograms)
    assert max(v for _, v in scalars["updates_per_s"]) > 0 and all(v >= 0 for _, v in scalars["gradients_per_s"])
    assert all(v == 0 for _, v in scalars["refused"])
    assert scalars["workers"][0][1] == WORKERS and all(0 <= v <= WORKERS for _, v in scalars["workers"])
    assert all(0 <= v < 1 for _, v in scalars["apply_seconds_per_update"])
    assert scalars["checkpoint_seconds"] and all(0 < v < 60 for _, v in scalars["checkpoint_seconds"])
    ratios = [v for _, v in scalars["compensation_ratio"]]
    assert ratios and all(math.isfinite(v) and v > 0 for v in ratios), "a stale push's, never 0"
    for m in range(WORKERS):
        assert max(v for _, v in scalars[f"worker{m}/pushes_per_s"]) > 0
        assert all(v >= 0 for _, v in scalars[f"worker{m}/seconds_since_push"])

    lines = PROGRESS.findall(out)
    assert len(lines) >= 2, out  # a job of more than a second, a line every half second
    updates = [int(line[0]) for line in lines]
    assert updates == sorted(updates) and updates[-1] <= total
    assert all(int(rank) == int(worker) + 1 for *_, worker, rank, _, _ in lines)
    assert "last checkpoint" in lines[-1][-1]


@pytest.mark.mpi
@pytest.mark.slow
def test_without_tensorboard_a_csv_of_the_same_columns_said_once_one_per_server(tmp_path):
    hidden = tmp_path / "hidden"
    (hidden / "tensorboard").mkdir(parents=True)  # the package as if not installed
    (hidden / "tensorboard" / "__init__.py").write_text("raise ImportError('tensorboard is not installed')\n")
    env = {"HVD_DCASGD_METRICS": str(tmp_path / "runs"), "HVD_DCASGD_METRICS_INTERVAL": "0.5",
           "HVD_DCASGD_PROGRESS": "0.5", "PYTHONPATH": str(hidden)}
    out = _job(tmp_path, {**env, "HVD_DCASGD_LOG_LEVEL": "warning"}, servers=2)
    assert out.count("the tensorboard package is not installed") == 1, out
    assert "hvd_dcasgd server" not in out and not PROGRESS.search(out), "progress and summary are INFO, below the level"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["server-0", "server-1"], "one run per server"
    for server in ("server-0", "server-1"):
        with open(tmp_path / "runs" / server / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert set(rows[0]) == {"wall_time", "step", "staleness", *SCALARS}
        assert int(rows[-1]["updates"]) == WORKERS * STEPS, "each server applies every push to its slice"
        counts = [int(pair.split(":")[1]) for row in rows for pair in row["staleness"].split()]
        assert sum(counts) == WORKERS * STEPS
        assert any(float(row["compensation_ratio"]) > 0 for row in rows if row["compensation_ratio"])


USER_HANDLER = textwrap.dedent("""
    if sys.argv[1] == "configured":
        seen = []
        class Keep(logging.Handler):
            def emit(self, record):
                seen.append((record.name, record.levelname, record.rank, record.getMessage()))
        logging.basicConfig(level=logging.INFO, handlers=[Keep()])
""")  # with "configured": a user's own handler keeps every record, with its rank

LOGGING = textwrap.dedent("""
    import logging, sys
    from hvd_dcasgd.common.log import get_logger
""") + USER_HANDLER + textwrap.dedent("""
    get_logger("progress").info("an info line")
    get_logger("server").warning("a warning line")
    if sys.argv[1] == "configured":
        print("user handler:", seen)
""")


def test_logging_default_handler_user_handler_and_level(tmp_path):
    script = tmp_path / "logs.py"
    script.write_text(LOGGING)
    default = python(script, "default", env={"OMPI_COMM_WORLD_RANK": "3"})
    assert default.returncode == 0, default.stdout
    assert default.stdout.splitlines() == ["[rank 3] an info line", "[rank 3] a warning line"]

    routed = python(script, "configured", env={"OMPI_COMM_WORLD_RANK": "3"})
    assert routed.returncode == 0, routed.stdout
    assert routed.stdout.splitlines() == [
        "user handler: [('hvd_dcasgd.progress', 'INFO', 3, 'an info line'), "
        "('hvd_dcasgd.server', 'WARNING', 3, 'a warning line')]"], "the user's handler alone, with the rank"

    quiet = python(script, "default", env={"HVD_DCASGD_LOG_LEVEL": "warning"})
    assert quiet.stdout.splitlines() == ["a warning line"], "no rank outside a launcher; info silenced"

    bad = python(script, "default", env={"HVD_DCASGD_LOG_LEVEL": "loud"})
    assert bad.returncode != 0 and "HVD_DCASGD_LOG_LEVEL='loud' is not valid" in bad.stdout


STALL = textwrap.dedent("""
    import logging, sys
    from hvd_dcasgd.protocol.stall import StallWatch
""") + USER_HANDLER + textwrap.dedent("""
    now = [0.0]
    watch = StallWatch(["worker 1 (MPI rank 2, host h)"], 1.0, clock=lambda: now[0])
    for _ in range(3):  # the server's loop looks every half second; the worker stays silent
        now[0] += 0.5
        watch.check([True])
    if sys.argv[1] == "configured":
        print("user handler:", seen)
""")


def test_a_stall_warning_is_a_log_record_of_the_rank_not_a_python_warning(tmp_path):
    script = tmp_path / "stall.py"
    script.write_text(STALL)
    said = ("hvd_dcasgd: worker 1 (MPI rank 2, host h) has not pushed for 1 s "
            "(a hung data loader, a wedged device, a dead process?)")
    default = python(script, "default", env={"OMPI_COMM_WORLD_RANK": "0"})
    assert default.returncode == 0 and default.stdout.splitlines() == [f"[rank 0] {said}"], default.stdout

    routed = python(script, "configured", env={"OMPI_COMM_WORLD_RANK": "0"})
    assert routed.stdout.splitlines() == [f"user handler: {[('hvd_dcasgd.stall', 'WARNING', 0, said)]}"], \
        routed.stdout

    quiet = python(script, "default", env={"OMPI_COMM_WORLD_RANK": "0", "HVD_DCASGD_LOG_LEVEL": "error"})
    assert quiet.returncode == 0 and quiet.stdout == "", quiet.stdout


def test_progress_line_from_the_telemetry():
    from hvd_dcasgd.observability.progress import Progress
    from hvd_dcasgd.observability.telemetry import Telemetry

    telemetry = Telemetry(3)
    progress = Progress(telemetry)
    for update, worker in enumerate([0, 1, 0, 1, 0, 2]):
        telemetry.record(update, worker, staleness=update % 2)
    line = progress.line(left=[False, False, False])
    assert line.startswith("hvd_dcasgd server: 6 updates, ") and "staleness mean 0.50" in line
    assert "slowest worker 2 (MPI rank 3)" in line and line.endswith("no checkpoint yet")
    telemetry.note_checkpoint(0.1)
    telemetry.record(6, 1, staleness=0)
    line = progress.line(left=[False, True, True])  # the interval since the first line only
    assert line.startswith("hvd_dcasgd server: 7 updates, ") and "staleness mean 0.00" in line
    assert "slowest worker 0 (MPI rank 1) at 0.0 pushes/s" in line and re.search(r"last checkpoint \ds ago$", line)


def test_the_metrics_variables_are_validated():
    from hvd_dcasgd.common.config import check_environment

    problems = check_environment({"HVD_DCASGD_METRICS_INTERVAL": "0", "HVD_DCASGD_PROGRESS": "-1"})
    assert len(problems) == 2 and "HVD_DCASGD_METRICS_INTERVAL='0' is not valid: use a number > 0" in problems[0]


@pytest.mark.parametrize("numel", [1000, 200_000])  # the whole vector; every 3rd element
def test_compensation_ratio_is_the_formulas_on_copies(numel):
    """The sampled ratio is DC-ASGD-c's term (bounded by |g|) over the gradient, written out here, on every k-th element; the
    server's weights, backups and DC-ASGD-a's MeanSquare are untouched."""
    import torch

    from hvd_dcasgd.algorithm.server import SAMPLE

    def server_of(mode):
        server = _server(mode, numel)
        server.weights.add_(torch.randn(numel, generator=torch.Generator().manual_seed(6)))  # w - w_bak(1) is this
        return server

    server = server_of("constant")
    k = max(1, numel // SAMPLE)
    g, gap = server.messages[1].gradient[::k], (server.weights - server.backups[1])[::k]
    expected = (0.5 * g * g * gap).clamp(min=-g.abs(), max=g.abs()).abs().mean() / g.abs().mean()  # bound 1
    # float32 means of up to 65,536 terms, summed in another order than here
    assert server.compensation_ratio(1, {}) == pytest.approx(expected.item(), rel=1e-4)

    server = server_of("adaptive")
    before = [server.weights.clone(), server.backups[1].clone(),
              *(t.clone() for t in server.update.state.of(1).values())]
    assert server.compensation_ratio(1, {}) > 0
    after = [server.weights, server.backups[1], *server.update.state.of(1).values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_compensation_ratio_is_sampled_from_a_stale_push_only(tmp_path):
    """A push computed on the server's current weights is never compensated, so it is not the interval's sample;
    the next stale one is, once."""
    from hvd_dcasgd.observability.metrics import Metrics

    server = _server("constant", 100)
    metrics = Metrics(server, tmp_path, tensorboard=False)
    metrics.sample(1)  # worker 1's push was computed on the current weights
    assert metrics.wants_sample and metrics.write()["compensation_ratio"] is None
    server.apply(0)  # now it is one update stale
    metrics.sample(1)
    assert not metrics.wants_sample
    assert metrics.write()["compensation_ratio"] > 0
    metrics.close()


def _server(mode, numel):
    """A server of two workers on COMM_SELF, over ``numel`` weights, whose workers' pushes wait with a
    random gradient at rate 0.1 each, all computed on its current weights."""
    import torch

    from hvd_dcasgd.algorithm.compensation import Compensation
    from hvd_dcasgd.algorithm.endpoints import open_server
    from hvd_dcasgd.protocol.layout import ModelLayout
    from hvd_dcasgd.runtime.mpi import load_mpi

    model = torch.nn.Linear(1, numel, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    server = open_server(load_mpi().COMM_SELF, optimizer, ModelLayout.of(optimizer, model.named_parameters()),
                         Compensation(mode, lambda_0=0.5), num_workers=2, staged=False)
    generator = torch.Generator().manual_seed(5)
    for m in range(2):
        server.messages[m].gradient.copy_(torch.randn(numel, generator=generator))
        server.messages[m].lrs.fill_(0.1)
    return server


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))

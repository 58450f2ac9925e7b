"""Smoke test: the digits example trains in every mode, and every rank exits 0.

The accuracy floor says the example works end to end; it does not judge the
algorithm (a wrong sign in the compensation still trains digits above it).
The algorithm is judged by numeric references: tests/test_server_step.py,
tests/test_server_state.py and the trace replays of tests/test_training.py."""

import re

import pytest

from helpers import ROOT, mpirun

import hvd_dcasgd

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


@pytest.mark.parametrize("mode", hvd_dcasgd.MODES)
def test_smoke_digits_example_reaches_95_percent(mode, tmp_path):
    result = mpirun(3, ROOT / "examples" / "train_digits.py", "--compensation", mode,
                    "--save", tmp_path / "model.pt", timeout=300)
    assert result.returncode == 0, result.stdout
    found = re.search(r"final test accuracy (\d\.\d+) \(compensation (\w+)[^)]*, 2 workers", result.stdout)
    assert found, result.stdout
    assert found.group(2) == mode
    assert float(found.group(1)) >= 0.95, result.stdout
    assert (tmp_path / "model.pt").exists()


def test_fashion_mnist_example_at_a_tiny_size_logs_writes_tensorboard_and_resumes(tmp_path):
    """The Horovod-form example: worker 0's log lines and TensorBoard scalars, the server's checkpoints and
    scalars (metrics_dir=), and a second run with the same folder that resumes after the first one's steps
    instead of starting again."""
    pytest.importorskip("tensorboard", reason="pip install tensorboard (the [test] extra) reads the event files")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def run(epochs):
        result = mpirun(3, ROOT / "examples" / "pytorch_fashion_mnist.py", "--epochs", epochs, "--train-size", 1280,
                        "--test-size", 400, "--log-interval", 5, "--log-dir", tmp_path / "runs",
                        "--checkpoint-dir", tmp_path / "checkpoints", timeout=300)
        assert result.returncode == 0, result.stdout
        return result.stdout

    first = run(1)
    assert "Train Epoch: 1 [0/640 (0%)]" in first and "Test set (epoch 1): Average loss: " in first, first
    assert re.search(r"^final test accuracy 0\.\d+ \(adaptive, 2 workers\)$", first, re.M), first
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-000000020.pt"]

    second = run(2)  # the same folder: the 2 x 10 steps of epoch 1 are taken
    assert "Resumed at epoch 2, batch 0 (10 steps taken)" in second, second
    assert "Train Epoch: 1" not in second and "Test set (epoch 2)" in second, second
    accuracy = float(re.search(r"^final test accuracy (0\.\d+)", second, re.M).group(1))
    assert accuracy > 0.1, "above chance (10 classes) after two small epochs"

    events = EventAccumulator(str(tmp_path / "runs" / "worker0"))
    events.Reload()
    assert {"train/loss", "test/loss", "test/accuracy"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("test/accuracy")] == [1, 2]
    assert events.Scalars("test/accuracy")[-1].value == pytest.approx(accuracy, abs=1e-4)
    server = EventAccumulator(str(tmp_path / "runs" / "server"))  # metrics_dir=: the server's scalars beside them
    server.Reload()
    assert {"updates_per_s", "staleness/mean", "worker0/pushes_per_s"} <= set(server.Tags()["scalars"])
    assert server.Scalars("updates")[-1].value == 40, "the update count goes on across the resume: 20 + 20"

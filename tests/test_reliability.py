"""Faults injected into real jobs under the real ``mpirun``: stalled and
silent ranks, preemption by signal, SIGKILL, a checkpoint killed half-written,
ranks that leave early.  Every job runs with a timeout, so a hang fails.

The strongest check of a resume: a job interrupted and resumed must end with
exactly (bit for bit) the weights of a one-process replay of its trace with
the server's own arithmetic (``ServerUpdate``, the same update path): nothing
was lost, applied twice or changed at the restart.  (test_training.py checks
the same arithmetic against the paper's formulas written out independently.)
"""

import os
import re
import signal
import sys
import time

import pytest
import torch

from helpers import (PROGRAMS, TCP, TRAINING, WORKERS, Job, check_final_weights, check_history, run_job,
                     run_on_slow_disk, trace)


sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

TRANSPORTS = {"shm": (), "tcp": TCP}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigterm_stops_saves_and_the_same_command_resumes_exactly(tmp_path, transport):
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace")}
    job = Job(tmp_path, *TRAINING, mca=TRANSPORTS[transport], env=env)
    job.wait_for("starts at step 0", WORKERS)
    time.sleep(0.5)
    job.signal_ranks(signal.SIGTERM)  # what scancel and SLURM's preemption do
    signalled = time.monotonic()
    status = job.wait()
    log = job.text()
    assert status == 75, log
    assert time.monotonic() - signalled < 20, log
    assert "stopped at update" in log and "asked by SIGTERM" in log and "exit status 75 (preempted)" in log, log
    stopped = len(trace(tmp_path / "trace"))
    assert 0 < stopped < WORKERS * 40
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [f"checkpoint-{stopped:09d}.pt"]

    status, log = run_job(tmp_path, *TRAINING, mca=TRANSPORTS[transport], env=env, log="log2")
    assert status == 0, log
    assert f"resuming from update {stopped}" in log, log
    assert "starts at step 0" not in log  # each worker skipped the steps the server had taken
    records = trace(tmp_path / "trace")
    check_history(records, 40)  # the update numbers continue across the restart
    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, TRAINING))))


def resume_exactly(tmp_path, env, args=TRAINING, steps=None):
    """Run the same command again: it resumes from the one checkpoint, and
    the whole trace (both jobs) replays bit for bit to the final weights."""
    stopped = len(trace(tmp_path / "trace"))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [f"checkpoint-{stopped:09d}.pt"]
    status, log = run_job(tmp_path, *args, env=env, log="log2")
    assert status == 0, log
    assert f"resuming from update {stopped}" in log, log
    records = trace(tmp_path / "trace")
    for m in range(WORKERS):  # every step once, in order, across the restart
        assert [r["step"] for r in records if r["worker"] == m] == list(range(steps(m) if steps else 40)), m
    updates = [r["update"] for r in records if "update" in r]
    assert updates == list(range(len(updates)))
    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, args))))


@pytest.mark.parametrize("signals, gap", [((signal.SIGTERM, signal.SIGUSR1), 0.01),  # scancel, then a forwarded one
                                          ((signal.SIGINT, signal.SIGINT), 0.0)], ids=["term-usr1-10ms", "int-int"])
def test_repeated_signals_to_every_rank_stop_the_job_once_and_it_resumes_exactly(tmp_path, signals, gap):
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace")}
    job = Job(tmp_path, *TRAINING, env=env)
    job.wait_for("starts at step 0", WORKERS)
    time.sleep(0.3)
    for number in signals:
        job.signal_ranks(number)
        time.sleep(gap)
    status = job.wait()
    log = job.text()
    assert status == 75, log
    assert f"asked by {signals[0].name}" in log and "exit status 75 (preempted)" in log, log
    resume_exactly(tmp_path, env)


def test_sigterm_to_a_worker_waiting_in_shutdown_stops_the_others_and_resumes_exactly(tmp_path):
    """Worker 0 has taken its steps and waits in ``shutdown()`` for the
    others: a signal to it alone stops the job, with a checkpoint."""
    args = ["--uneven", "--steps", 30, "--step-time", 0.05, "--compensation", "adaptive", "--momentum", 0.9]
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace")}
    job = Job(tmp_path, *args, env=env)
    job.wait_for("worker 0 finished its steps")
    time.sleep(0.2)
    job.signal_ranks(signal.SIGTERM, ranks=[1])
    status = job.wait()
    log = job.text()
    assert status == 75, log
    assert "worker 0 done: 30 steps" in log, log  # it was not killed by the signal
    assert "worker 1 done" not in log, log  # the other stopped after its step
    resume_exactly(tmp_path, env, args, steps=lambda m: 30 * (m + 1))


def test_a_signal_while_the_server_writes_its_stop_checkpoint_leaves_it_whole(tmp_path):
    """A second SIGTERM to every rank while the server writes its stop
    checkpoint (160 MB): the write completes, status 75, and it resumes."""
    folder = tmp_path / "checkpoints"
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(folder)}
    args = ["--steps", 400, "--step-time", 0.02, "--big", 40_000_000]
    job = Job(tmp_path, *args, env=env, timeout=180)
    job.wait_for("starts at step 0", WORKERS)
    job.signal_ranks(signal.SIGTERM)
    job.wait_for(lambda: list(folder.glob(".checkpoint-*.tmp")))
    job.signal_ranks(signal.SIGTERM)  # during the write
    status = job.wait()
    log = job.text()
    assert status == 75, log
    kept = list(folder.glob("checkpoint-*.pt"))
    assert len(kept) == 1 and not list(folder.glob(".checkpoint-*.tmp")), log
    assert torch.load(kept[0], weights_only=True)["format"] == 2
    status, log = run_job(tmp_path, *args, env=env, timeout=180, log="resumed")
    assert status == 0, log
    assert f"resuming from update {int(kept[0].name[11:20])}" in log, log


@pytest.mark.parametrize("moment", ["workers-leaving", "final-checkpoint"])
def test_signals_after_the_last_step_lose_nothing(tmp_path, moment):
    """Every worker has taken its last step: two SIGTERMs to every rank while
    the workers leave and the final exchange moves the 160 MB model, or while
    the server writes the final checkpoint.  Training had finished (status 0,
    the final checkpoint) or the server had not yet seen every worker leave
    (status 75, its stop checkpoint); either way every worker's every push is
    in the one checkpoint, and the same command run again ends with status 0."""
    folder = tmp_path / "checkpoints"
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(folder)}
    steps = 20
    args = ["--steps", steps, "--step-time", 0.01, "--big", 40_000_000]
    job = Job(tmp_path, *args, env=env, timeout=180)
    if moment == "workers-leaving":
        job.wait_for("finished its steps", WORKERS)
    else:
        job.wait_for(lambda: list(folder.glob(".checkpoint-*.tmp")))
    job.signal_ranks(signal.SIGTERM)
    job.signal_ranks(signal.SIGTERM)
    status = job.wait()
    log = job.text()
    assert status in ((0, 75) if moment == "workers-leaving" else (0,)), log
    kept = list(folder.glob("checkpoint-*.pt"))
    assert len(kept) == 1 and not list(folder.glob(".checkpoint-*.tmp")), log
    assert torch.load(kept[0], weights_only=True)["pushes"] == [steps] * WORKERS, log
    status, log = run_job(tmp_path, *args, env=env, timeout=180, log="again")
    assert status == 0, log
    assert "resuming from update" in log and "starts at step 0" not in log, log


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_slow_checkpoint_write_is_not_silence_to_the_waiting_workers(tmp_path, transport):
    """Periodic checkpoints on a slow disk (every fsync of the server takes
    2.5 s, by strace), each write longer than the 1 s stall timeout and its
    margins: the workers waiting for an answer meanwhile do not end the job
    (the server marks its heartbeat while it writes).  Over TCP (osc/pt2pt)
    a worker's read of the server moves only while the server calls MPI:
    the server keeps calling it while another thread writes."""
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.5",
           "HVD_DCASGD_STALL_TIMEOUT": "1"}
    job = Job(tmp_path, "--steps", 40, "--step-time", 0.02, env=env, mca=TRANSPORTS[transport], timeout=240)
    status, log, slowed = run_on_slow_disk(job, rank=0)
    assert status == 0, log
    assert "has not answered" not in log and "dropped" not in log, log
    assert slowed >= 4, log  # a periodic checkpoint and the final one, each a file and its folder
    assert len(list((tmp_path / "checkpoints").glob("checkpoint-*.pt"))) == 2, log


def test_a_suspended_job_resumes_training_without_drops(tmp_path):
    """SIGSTOP to every rank for twice the stall timeout, then SIGCONT (what
    ``scontrol suspend`` and ``resume`` do): no rank counts the time it was
    frozen as silence of the others."""
    env = {"HVD_DCASGD_STALL_TIMEOUT": "3", "HVD_DCASGD_TRACE": str(tmp_path / "trace")}
    job = Job(tmp_path, *TRAINING, env=env)
    job.wait_for("starts at step 0", WORKERS)
    time.sleep(0.3)
    job.signal_ranks(signal.SIGSTOP)
    time.sleep(6)
    job.signal_ranks(signal.SIGCONT)
    status = job.wait()
    log = job.text()
    assert status == 0, log
    assert "dropped" not in log and "has not answered" not in log, log
    assert all(f"worker {m} done: 40 steps" in log for m in range(WORKERS)), log
    records = trace(tmp_path / "trace")
    check_history(records, 40)
    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, TRAINING))))


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_the_job_with_a_checkpoint(tmp_path, number):
    """SIGTERM or Ctrl-C to hvd-dcasgd-run, twice, reaches the ranks at once
    (as SIGUSR1), not after Open MPI's kill delay, and stops the job once;
    mpirun's status is passed on."""
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    job = Job(tmp_path, *TRAINING, env=env, launcher=True)
    job.wait_for("starts at step 0", WORKERS)
    os.kill(job.proc.pid, number)
    time.sleep(0.01)
    os.kill(job.proc.pid, number)  # a second one: counted, the job still stops once with its checkpoint
    signalled = time.monotonic()
    status = job.wait()
    log = job.text()
    assert status == 75, log
    assert time.monotonic() - signalled < 20, log
    assert "asked by SIGUSR1" in log and len(list((tmp_path / "checkpoints").glob("checkpoint-*.pt"))) == 1, log


def test_sigkill_then_the_same_command_resumes_from_the_periodic_checkpoint(tmp_path):
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace"),
           "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.2"}
    job = Job(tmp_path, *TRAINING, env=env)
    job.wait_for(lambda: len(list((tmp_path / "checkpoints").glob("checkpoint-*.pt"))) >= 2)
    time.sleep(0.1)
    job.signal_ranks(signal.SIGKILL, ranks=[2])  # one worker dies: mpirun ends the job
    assert job.wait() != 0
    kept = sorted((tmp_path / "checkpoints").glob("checkpoint-*.pt"))
    assert len(kept) == 2  # the last two
    newest = int(kept[-1].name[11:20])
    assert len(trace(tmp_path / "trace")) >= newest  # the killed job applied pushes after it

    status, log = run_job(tmp_path, *TRAINING, env=env, log="log2")
    assert status == 0, log
    assert f"resuming from update {newest}" in log, log
    records = trace(tmp_path / "trace")  # truncated at the checkpoint, then continued
    check_history(records, 40)
    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, TRAINING))))


def test_a_checkpoint_killed_half_written_leaves_the_previous_one(tmp_path):
    folder = tmp_path / "checkpoints"
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(folder), "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.5"}
    args = ["--steps", 400, "--step-time", 0.02, "--big", 40_000_000]  # 160 MB checkpoints
    for attempt in range(3):  # the kill must land inside a write: try again if it came just after one
        job = Job(tmp_path, *args, env=env, timeout=180, log=f"log{attempt}")
        job.wait_for(lambda: list(folder.glob("checkpoint-*.pt")) and list(folder.glob(".checkpoint-*.tmp")))
        job.signal_ranks(signal.SIGKILL, ranks=[0])  # the server, while it writes
        assert job.wait() != 0
        if list(folder.glob(".checkpoint-*.tmp")):
            break
    complete = list(folder.glob("checkpoint-*.pt"))
    assert complete and list(folder.glob(".checkpoint-*.tmp")), "never killed in the middle of a write"
    for path in complete:  # what carries the name is whole
        assert torch.load(path, weights_only=True)["format"] == 2

    # resumed, a few steps more are enough to show it goes on from the whole checkpoint (each 160 MB write costs)
    status, log = run_job(tmp_path, *args, "--resumed-steps", 5, env=env, timeout=180, log="resumed")
    assert status == 0, log
    assert "resuming from update" in log
    assert not list(folder.glob(".checkpoint-*.tmp"))


def test_a_checkpoint_saved_by_the_script_is_one_moment_of_the_server(tmp_path):
    """``optimizer.state_dict()`` on a worker while training: the server's
    optimizer state and, in the model, the weights of the same update."""
    args = ["--steps", 12, "--compensation", "adaptive", "--momentum", 0.9, "--save-at", 6]
    status, log = run_job(tmp_path, *args, env={"HVD_DCASGD_TRACE": str(tmp_path / "trace")})
    assert status == 0, log
    records = trace(tmp_path / "trace")
    assert sum("sent" in r for r in records) == 1
    check_history(records, 12)
    saved = torch.load(tmp_path / "saved.pt", weights_only=True)
    seen = []

    def compare(weights, optimizer):
        momentum = [optimizer.state[p]["momentum_buffer"] for group in optimizer.param_groups for p in group["params"]]
        seen.append(True)
        assert torch.equal(saved["model"]["a"], weights[0]) and torch.equal(saved["model"]["b"], weights[1])
        assert all(torch.equal(saved["optimizer"]["state"][i]["momentum_buffer"], m) for i, m in enumerate(momentum))

    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, args))), at_sent=compare)
    assert seen == [True]


def test_resuming_with_another_model_is_refused(tmp_path):
    """(Another number of workers resumes: test_membership.py.)"""
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    status, log = run_job(tmp_path, "--steps", 3, env=env)
    assert status == 0, log
    status, log = run_job(tmp_path, "--steps", 3, "--big", 5, env=env, log="log3")
    assert status != 0
    assert "was saved by a server with untrained_state" in log and "checkpoint-" in log, log


@pytest.mark.parametrize("schedule", ["async", "sync"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stalled_worker_is_dropped_and_the_others_finish(tmp_path, transport, schedule):
    env = {"HVD_DCASGD_STALL_TIMEOUT": "2", "HVD_DCASGD_SCHEDULE": schedule, "HVD_DCASGD_TRACE": str(tmp_path / "trace"),
           "HVD_DCASGD_METRICS": str(tmp_path / "runs"), "HVD_DCASGD_METRICS_INTERVAL": "0.5"}
    # three workers: the two that go on must end with the same weights
    job = Job(tmp_path, "--bad", "hang", "--steps", 20, "--step-time", 0.02, mca=TRANSPORTS[transport], env=env,
              workers=3)
    status = job.wait()
    log = job.text()
    assert status == 69, log
    assert "worker 1 (MPI rank 2, host" in log and "dropped after 2 s (HVD_DCASGD_STALL_TIMEOUT)" in log, log
    for m in (0, 2):  # their code after shutdown() ran: the final weights were saved
        assert f"worker {m} done: 20 steps" in log
        assert (tmp_path / f"worker{m}.pt").exists()
    assert not (tmp_path / "worker1.pt").exists()
    final = [torch.load(tmp_path / f"worker{m}.pt", weights_only=True) for m in (0, 2)]
    assert torch.equal(final[0]["a"], final[1]["a"])
    assert time.monotonic() - job.started < 60  # not the stalled worker's 600 s
    # membership: the drop and the others' leaving are events of the trace, and the metrics count the workers
    events = [(r["event"], r["member"]) for r in trace(tmp_path / "trace", events=True) if "event" in r]
    assert sorted(events) == [("dropped", 1), ("left", 0), ("left", 2)], events
    counts = [v for _, v in _scalars(tmp_path / "runs" / "server", "workers")]
    assert counts[-1] == 0 and all(0 <= v <= 3 for v in counts), counts
    if schedule == "async":  # the others finish first, and the hung one is the job for 2 s
        assert events[-1] == ("dropped", 1) and 1 in counts, (events, counts)
    else:  # the others wait for the hung one's push in every round until it is dropped
        assert events[0] == ("dropped", 1) and 3 in counts, (events, counts)


def _scalars(folder, tag):
    """(step, value) of one scalar of the server's TensorBoard event files in ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_silent_server_ends_the_job_naming_it(tmp_path, transport):
    job = Job(tmp_path, "--steps", 200, "--step-time", 0.02, mca=TRANSPORTS[transport],
              env={"HVD_DCASGD_STALL_TIMEOUT": "2"})
    job.wait_for("starts at step 0", WORKERS)
    job.signal_ranks(signal.SIGSTOP, ranks=[0])  # the server stops answering
    status = job.wait()
    log = job.text()
    assert status == 68, log
    assert re.search(r"the server \(MPI rank 0\) has not answered for \d+ s \(HVD_DCASGD_STALL_TIMEOUT=2\)", log), log


@pytest.mark.parametrize("bad, sentence", [
    ("exit-early", "rank 2 (worker 1) exited (sys.exit, an exception it caught, or the end of its script) before "
                   "DistributedOptimizer, so the training session cannot start without it"),
    ("exit-early-status", "rank 2 (worker 1) exited"),
    ("raise-early", "rank 2 (worker 1) ended with ValueError: no data for this rank"),
    ("server-raise", "rank 0 (the server) ended with RuntimeError: the server's data could not be read"),
    ("thread", "rank 2 (worker 1): thread 'loader' ended with IndexError"),
])
def test_a_rank_that_leaves_early_ends_the_job_naming_it(tmp_path, bad, sentence):
    status, log = run_job(tmp_path, "--bad", bad, "--steps", 6, timeout=60)
    assert status != 0, log
    assert sentence in log, log


def test_a_rank_that_exits_early_is_named_over_tcp_too(tmp_path):
    status, log = run_job(tmp_path, "--bad", "exit-early", "--steps", 6, mca=TCP, timeout=60)
    assert status != 0, log
    assert "rank 2 (worker 1) exited" in log, log


def test_an_exception_in_an_atexit_handler_is_shown_and_loses_nothing(tmp_path):
    """Python reports an exception in an atexit handler and goes on with the
    next one: the session still ends normally on every rank."""
    status, log = run_job(tmp_path, "--bad", "atexit-raise", "--steps", 6, timeout=60)
    assert status == 0, log
    assert "ZeroDivisionError" in log
    assert all((tmp_path / f"worker{m}.pt").exists() for m in range(WORKERS))

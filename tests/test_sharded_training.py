"""Several servers under the real mpirun: each server's trace replays, with
the rest of the model taken from what that worker last received, to that
server's final weights; one worker (and the sync schedule) give bit for bit
the weights of one server; every rank ends with the same whole model."""

import json
import signal
import sys
import time

import pytest
import torch

from helpers import (PROGRAMS, TCP, TRAINING, WORKERS, Job, check_resumed_sharded, flat_ab, mpirun,
                     per_shard, run_job, run_on_slow_disk, sharded_replay)

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

STEPS = 10


def _train(tmp_path, servers, *args, workers=WORKERS, mca=(), env=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    trace = tmp_path / "trace.jsonl"
    result = mpirun(workers + servers, PROGRAMS / "synthetic.py", "--out", tmp_path, *args, mca=mca,
                    env={"HVD_DCASGD_TRACE": str(trace), "HVD_DCASGD_SERVERS": str(servers), **(env or {})})
    assert result.returncode == 0, result.stdout
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    finals = [torch.load(tmp_path / f"worker{m}.pt") for m in range(workers)]
    servers_final = [torch.load(tmp_path / ("server.pt" if s == 0 else f"server{s}.pt")) for s in range(servers)]
    return result.stdout, lines, finals, servers_final


@pytest.mark.parametrize("servers,mode,extra", [
    (2, "none", []),
    (2, "constant", ["--momentum", "0.9", "--weight-decay", "0.01"]),
    (2, "adaptive", []),
    (2, "staleness", ["--optimizer", "adam"]),
    (3, "constant", ["--momentum", "0.9", "--weight-decay", "0.01"]),
    (3, "adaptive", ["--optimizer", "adam"]),
], ids=["2-asgd", "2-constant-momentum-wd", "2-adaptive", "2-staleness-adam", "3-constant-momentum-wd",
        "3-adaptive-adam"])
def test_each_servers_trace_replays_to_its_final_weights(tmp_path, servers, mode, extra):
    # the staleness-aware rate divides by staleness >= 2, which two alternating workers never reach
    workers = 3 if mode == "staleness" else WORKERS
    args = synthetic.parse_args(["--compensation", mode, "--steps", str(STEPS), *extra])
    _, lines, finals, servers_final = _train(tmp_path, servers, "--compensation", mode, "--steps", STEPS, *extra,
                                             workers=workers)
    slices, records = per_shard(lines, servers)
    if mode == "staleness":
        assert any(r["staleness"] >= 2 for rs in records for r in rs), "the rule changed no push"
    for rs in records:  # every server took every push once, each worker's in order
        for m in range(workers):
            assert [r["step"] for r in rs if r["worker"] == m] == list(range(STEPS))
    expected = sharded_replay(slices, records, args)
    final = flat_ab(finals[0])
    for (offset, numel), weights in zip(slices, expected):
        assert torch.allclose(final[offset:offset + numel], weights, atol=1e-5), (offset, numel)
    for state in finals[1:] + servers_final:  # every rank, every server included, holds the whole final model
        assert torch.equal(flat_ab(state), final)
        assert torch.equal(state["running"], finals[0]["running"])


@pytest.mark.parametrize("servers", [3])
def test_one_worker_on_several_servers_is_sequential_sgd_bit_for_bit(tmp_path, servers):
    extra = ["--compensation", "adaptive", "--steps", STEPS, "--momentum", "0.9", "--nesterov"]
    _, _, one, _ = _train(tmp_path / "one", 1, *extra, workers=1)
    _, lines, several, _ = _train(tmp_path / "several", servers, *extra, workers=1)
    assert torch.equal(flat_ab(several[0]), flat_ab(one[0]))
    per_shard(lines, servers)


@pytest.mark.parametrize("servers,mca", [(2, ()), (3, TCP)], ids=["2", "3-tcp-pt2pt"])
def test_sync_rounds_per_server_equal_one_server_bit_for_bit(tmp_path, servers, mca):
    extra = ["--compensation", "sync", "--steps", STEPS, "--optimizer", "adam"]
    _, _, one, _ = _train(tmp_path / "one", 1, *extra)
    _, lines, several, _ = _train(tmp_path / "several", servers, *extra, mca=mca)
    for m in range(WORKERS):
        assert torch.equal(flat_ab(several[m]), flat_ab(one[0]))
    _, records = per_shard(lines, servers, sync=True)
    assert all(len(rs) == WORKERS * STEPS for rs in records)


@pytest.mark.parametrize("env,ranks,expected", [
    ({"HVD_DCASGD_SERVERS": "4"}, 4, "4 server(s) (HVD_DCASGD_SERVERS) need at least 5 ranks, one worker or more; "
                                     "this job has 4"),
    ({"HVD_DCASGD_SERVERS": "0"}, 3, "HVD_DCASGD_SERVERS='0' is not valid: use a whole number >= 1"),
], ids=["more-servers-than-ranks", "zero"])
def test_a_bad_number_of_servers_is_one_sentence_for_every_rank(tmp_path, env, ranks, expected):
    """Every rank ends with an error; the sentence is said once, by rank 0, without a traceback."""
    env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}
    result = mpirun(ranks, PROGRAMS / "synthetic.py", "--steps", 2, env=env, timeout=120)
    assert result.returncode != 0
    assert result.stdout.count(expected) == 1 and "Traceback" not in result.stdout, result.stdout


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_restores_and_optimizer_state_on_several_servers_are_those_of_one(tmp_path, optimizer):
    """Horovod's restore idiom (worker 0 loads weights after wrapping, then
    broadcasts parameters and optimizer state) reaches every server, each its
    slice; the optimizer state a worker saves mid-training is the servers'
    put together: with one worker, both are bit for bit those of one server."""
    extra = ["--compensation", "adaptive", "--steps", STEPS, "--optimizer", optimizer, "--momentum", "0.9",
             "--restore", "--save-at", 4]
    if optimizer == "adam":
        extra = [x for x in extra if x not in ("--momentum", "0.9")]
    _, _, one, _ = _train(tmp_path / "one", 1, *extra, workers=1)
    _, _, several, servers_final = _train(tmp_path / "several", 3, *extra, workers=1)
    assert torch.equal(flat_ab(several[0]), flat_ab(one[0]))
    assert all(torch.equal(flat_ab(state), flat_ab(one[0])) for state in servers_final)
    saved = [torch.load(tmp_path / run / "saved.pt") for run in ("one", "several")]
    assert torch.equal(flat_ab(saved[1]["model"]), flat_ab(saved[0]["model"]))
    states = [s["optimizer"]["state"] for s in saved]
    assert sorted(states[1]) == sorted(states[0]) == [0, 1]
    for i in states[0]:
        assert sorted(states[1][i]) == sorted(states[0][i])
        for key, value in states[0][i].items():
            assert torch.equal(torch.as_tensor(states[1][i][key]), torch.as_tensor(value)), (i, key)
    assert saved[1]["optimizer"]["param_groups"] == saved[0]["optimizer"]["param_groups"]


def _wait_until_every_worker_pushed(trace, timeout=120.0):
    """Until the servers' trace holds a push of every worker (a job signalled before a worker's first push
    resumes that worker at its step 0)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = trace.read_text().splitlines() if trace.exists() else []
        seen = {json.loads(line).get("worker") for line in lines[:-1]}  # the last line may be half written
        if set(range(WORKERS)) <= seen:
            return
        time.sleep(0.05)
    raise AssertionError(f"not every worker pushed within {timeout:g} s")


@pytest.mark.parametrize("servers, signals, gap, mca", [
    (2, (signal.SIGTERM,), 0.0, ()),
    (3, (signal.SIGTERM,), 0.0, ()),
    (2, (signal.SIGTERM, signal.SIGUSR1), 0.01, ()),  # scancel, then the batch script's forwarded signal
    (2, (signal.SIGINT, signal.SIGINT, signal.SIGTERM), 0.0, TCP),
], ids=["2-term", "3-term", "2-term-usr1-10ms", "2-int-int-term-tcp"])
def test_stop_signals_stop_every_server_at_one_cut_and_the_same_command_resumes_exactly(tmp_path, servers, signals,
                                                                                         gap, mca):
    """One signal, or several in a row with small and zero gaps, to every
    rank: every server stops at the same cut, once, with status 75; the same
    command resumes and ends bit for bit on the replay of the whole trace."""
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace"),
           "HVD_DCASGD_SERVERS": str(servers)}
    job = Job(tmp_path, *TRAINING, env=env, servers=servers, mca=mca)
    job.wait_for("starts at step 0", WORKERS)
    _wait_until_every_worker_pushed(tmp_path / "trace")  # so that each resumes past its step 0, however busy the machine
    for number in signals:
        job.signal_ranks(number)
        time.sleep(gap)
    status = job.wait()
    log = job.text()
    assert status == 75, log
    assert f"asked by {signals[0].name}" in log, log
    assert log.count("exit status 75 (preempted)") == servers, log
    folders = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert folders == [f"server-{s}-of-{servers}" for s in range(servers)]
    cuts = [sorted(p.name for p in (tmp_path / "checkpoints" / f).iterdir()) for f in folders]
    assert all(names == cuts[0] for names in cuts), cuts  # every server wrote the same cuts
    states = [torch.load(tmp_path / "checkpoints" / f / cuts[0][-1], weights_only=True) for f in folders]
    assert all(s["pushes"] == states[0]["pushes"] for s in states), "one cut: the same pushes on every server"
    assert 0 < sum(states[0]["pushes"]) < WORKERS * 40

    status, log = run_job(tmp_path, *TRAINING, env=env, log="log2", servers=servers, mca=mca)
    assert status == 0, log
    assert log.count("resuming from update") == servers, log
    assert "starts at step 0" not in log
    check_resumed_sharded(tmp_path, [json.loads(line) for line in (tmp_path / "trace").read_text().splitlines()], servers)


def test_sigkill_then_every_server_resumes_from_the_newest_cut_they_all_hold(tmp_path):

    servers = 2
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace"),
           "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.2", "HVD_DCASGD_SERVERS": str(servers)}
    job = Job(tmp_path, *TRAINING, env=env, servers=servers)
    job.wait_for(lambda: all(len(list((tmp_path / "checkpoints").glob(f"server-{s}-of-2/checkpoint-*.pt"))) >= 2
                             for s in range(servers)))
    time.sleep(0.1)
    job.signal_ranks(signal.SIGKILL, ranks=[servers + 1])  # one worker dies: mpirun ends the job
    assert job.wait() != 0
    status, log = run_job(tmp_path, *TRAINING, env=env, log="log2", servers=servers)
    assert status == 0, log
    assert log.count("resuming from update") == servers, log
    check_resumed_sharded(tmp_path, [json.loads(line) for line in (tmp_path / "trace").read_text().splitlines()], servers)


def test_a_checkpoint_folder_of_another_number_of_servers_is_refused(tmp_path):
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_SERVERS": "2"}
    result = mpirun(4, PROGRAMS / "synthetic.py", "--steps", 2, env=env, timeout=120)
    assert result.returncode == 0, result.stdout
    for ranks, servers in ((5, "3"), (4, "1")):
        result = mpirun(ranks, PROGRAMS / "synthetic.py", "--steps", 2, env={**env, "HVD_DCASGD_SERVERS": servers},
                        timeout=120)
        assert result.returncode != 0
        assert "holds server-0-of-2, written by a job with another number of servers" in result.stdout, result.stdout


@pytest.mark.parametrize("schedule", ["async", "sync"])
def test_a_stalled_worker_is_dropped_by_every_server_and_the_others_finish(tmp_path, schedule):

    servers = 2
    env = {"HVD_DCASGD_STALL_TIMEOUT": "2", "HVD_DCASGD_SCHEDULE": schedule, "HVD_DCASGD_SERVERS": str(servers)}
    # three workers: the two that go on must end with the same weights
    job = Job(tmp_path, "--bad", "hang", "--steps", 20, "--step-time", 0.02, env=env, servers=servers, workers=3)
    status = job.wait()
    log = job.text()
    assert status == 69, log
    assert "worker 1 (MPI rank 3, host" in log and "dropped after 2 s (HVD_DCASGD_STALL_TIMEOUT)" in log, log
    for m in (0, 2):  # their code after shutdown() ran: the final weights were saved
        assert f"worker {m} done: 20 steps" in log
    final = [flat_ab(torch.load(tmp_path / f"worker{m}.pt", weights_only=True)) for m in (0, 2)]
    assert torch.equal(final[0], final[1])
    assert not (tmp_path / "worker1.pt").exists()
    assert time.monotonic() - job.started < 60  # not the stalled worker's 600 s


def test_workers_waiting_for_a_slow_server_are_not_silent_to_the_first(tmp_path):
    """The second server is frozen (SIGSTOP) in the middle of a checkpoint
    write, for longer than the stall timeout, then goes on (SIGCONT).  The
    workers wait for its answer (its heartbeat says it is writing) and
    meanwhile owe the first server their next push: they tell it they are
    waiting, so it drops nobody, and the job finishes.  (Over TCP a frozen
    server answers no read, not even of its heartbeat: there, the next test
    makes it slow instead.)"""
    servers = 2
    env = {"HVD_DCASGD_STALL_TIMEOUT": "2", "HVD_DCASGD_SERVERS": str(servers),
           "HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.5"}
    job = Job(tmp_path, "--steps", 60, "--step-time", 0.05, "--big", 25_000_000, env=env, servers=servers,
              timeout=180)
    folder = tmp_path / "checkpoints" / f"server-1-of-{servers}"
    while True:
        job.wait_for(lambda: any(folder.glob(".checkpoint-*.tmp")))  # the second server writes its part of a cut
        writing = set(folder.glob(".checkpoint-*.tmp"))
        job.signal_ranks(signal.SIGSTOP, ranks=[1])
        if writing & set(folder.glob(".checkpoint-*.tmp")):  # frozen in the middle of that write
            break
        job.signal_ranks(signal.SIGCONT, ranks=[1])  # the write ended just before: wait for the next one
    time.sleep(5)  # the timeout, its margins, and more
    job.signal_ranks(signal.SIGCONT, ranks=[1])
    status = job.wait()
    log = job.text()
    assert status == 0, log
    assert "dropped" not in log and "has not answered" not in log and "has not pushed" not in log, log
    assert all(f"worker {m} done: 60 steps" in log for m in range(WORKERS)), log


def test_workers_waiting_for_a_server_slow_to_write_are_not_silent_to_the_first_over_tcp(tmp_path):
    """Over TCP (osc/pt2pt), where a read of a server moves only while that
    server calls MPI: every fsync of the second server takes 2.5 s (a slow
    disk, by strace), so its part of each cut (every 6 s) takes 5 s to
    write, past the 1 s stall timeout and its margins.  It writes on another thread and
    keeps calling MPI, so the workers read that it is writing; waiting for
    it, they keep telling the first server they are waiting, without
    blocking inside MPI.  Nobody is dropped and the job finishes."""
    servers = 2
    env = {"HVD_DCASGD_STALL_TIMEOUT": "1", "HVD_DCASGD_SERVERS": str(servers),
           "HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_CHECKPOINT_INTERVAL": "6"}
    job = Job(tmp_path, "--steps", 160, "--step-time", 0.05, env=env, servers=servers, mca=TCP, timeout=240)
    status, log, slowed = run_on_slow_disk(job, rank=1)
    assert status == 0, log
    assert "dropped" not in log and "has not answered" not in log and "has not pushed" not in log, log
    assert all(f"worker {m} done: 160 steps" in log for m in range(WORKERS)), log
    assert slowed >= 4, log  # at least a cut and the final checkpoint, each a file and its folder

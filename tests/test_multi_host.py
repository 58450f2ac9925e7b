"""Several hosts for real: jobs launched by ``hvd-dcasgd-run`` on emulated
hosts (``tests/cluster/hosts.sh``: a network, UTS and mount namespace each,
a private bridge, an SSH server each), whose ranks mpirun starts on the other
hosts over SSH and which talk over TCP between hosts.

Every job runs on host ``a`` (the head node) with a timeout; its traffic
goes only to the hosts' addresses, which exist inside their namespaces
alone.  The results are those of one host where the order of the updates
does not depend on timing (the sync schedule; one worker), and a replay of
the trace bit for bit (one server) or to 1e-5 (several) otherwise.  A host
that disappears (its link pulled, or every process on it killed) ends the
job, naming the host, and the periodic checkpoint resumes.
"""

import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from hvd_dcasgd.common.process import run_command
from helpers import (PROGRAMS, ROOT, TRAINING, BackgroundJob, check_final_weights, check_history,
                     check_resumed_sharded, flat_ab, gpu_placement_problems, mpirun, per_shard, placed_ranks, run,
                     sharded_replay, trace, unavailable)

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

#: Workers of each job: three, so that the hosts hold workers beside a server and alone.
WORKERS = 3

HOSTS = ROOT / "tests" / "cluster" / "hosts.sh"
LAUNCHER = ROOT / "launch" / "hvd-dcasgd-run"
TRANSPORT = re.compile(r"^\[rank \d+\] hvd_dcasgd server(?:s \(all \d\))?: transport Open MPI \S+ \(osc pt2pt, pml ob1, btl [\w,]*tcp[\w,]*\), thread level serialized; "
                       r"(\d) host\(s\): (.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three emulated hosts a, b, c (two-host jobs use a and b); the
    environment that names them to ``hosts.sh``."""
    if os.geteuid() != 0:
        unavailable("emulated hosts need root (network namespaces, an SSH server per host)")
    env = {**os.environ, "HVD_DCASGD_HOSTS_DIR": str(tmp_path_factory.mktemp("hosts")),
           "HVD_DCASGD_HOSTS_PREFIX": f"hvdt{os.getpid()}",
           # the emulated hosts share this machine's cores: mpirun on each would bind its ranks from core 0 on
           "OMPI_MCA_hwloc_base_binding_policy": "none"}
    started = run_command(["bash", str(HOSTS), "start", "a", "b", "c"], timeout=240, env=env, cwd=ROOT)
    if started.timed_out or started.returncode != 0:
        run_command(["bash", str(HOSTS), "stop"], timeout=60, env=env, cwd=ROOT)
        unavailable(f"no emulated hosts could be started: {started.stdout.strip() or 'timed out'}")
    yield env
    run_command(["bash", str(HOSTS), "stop"], timeout=60, env=env, cwd=ROOT)


def on_a(cluster, *command):
    """``command`` as run on host a, the head node."""
    return ["bash", str(HOSTS), "exec", "a", *map(str, command)]


def launch(cluster, out, *args, hosts=("-H", "a:2,b:2"), workers=WORKERS, servers=1):
    """The launcher's command on host a: the synthetic program, ``workers`` workers, ``servers`` servers."""
    return on_a(cluster, sys.executable, LAUNCHER, "-n", workers, "--servers", servers, *hosts,
                PROGRAMS / "synthetic.py", "--out", out, *args)


def train(cluster, out, *args, env=None, timeout=240, **kwargs):
    out.mkdir(parents=True, exist_ok=True)
    result = run(launch(cluster, out, *args, **kwargs), env={**cluster, "HVD_DCASGD_TRACE": str(out / "trace"),
                                                             **(env or {})}, timeout=timeout)
    assert result.returncode == 0, result.stdout[-6000:]
    return result.stdout


def placement(log):
    """The transport line's hosts and ranks (with several servers, the merged
    summary's), which must name osc/pt2pt over TCP."""
    found = TRANSPORT.findall("\n".join(line for line in log.splitlines()
                                        if "(all" in line or "servers (all" not in log))
    assert found, log[-4000:]
    return found[-1]


def test_every_host_reaches_every_other_by_name_over_ssh(cluster):
    for source in "abc":
        for target in "abc":
            result = run(["bash", str(HOSTS), "exec", source, "ssh", target, "hostname"], env=cluster, timeout=60)
            assert result.stdout.strip() == target, result.stdout


def test_one_server_across_two_hosts_replays_its_trace_bit_for_bit(cluster, tmp_path):
    """``-H a:2,b:2``: the server and worker 0 on a, workers 1 and 2 on b."""
    args = ["--steps", 15, "--compensation", "adaptive", "--momentum", 0.9]
    log = train(cluster, tmp_path, *args)
    assert placement(log) == ("2", "a: server w0; b: w1 w2"), log[-4000:]
    records = trace(tmp_path / "trace")
    check_history(records, 15, workers=WORKERS)
    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, args))), workers=WORKERS)


def test_two_servers_over_three_hosts_from_a_hostfile_replay_their_traces(cluster, tmp_path):
    """A hostfile of a, b, c: the servers go one per host first (a and b)."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\nc slots=2\n")
    args = ["--steps", 10, "--compensation", "constant", "--momentum", 0.9, "--weight-decay", 0.01]
    log = train(cluster, tmp_path / "run", *args, hosts=("--hostfile", hostfile), servers=2)
    assert placement(log) == ("3", "a: s0 w1; b: s1 w2; c: w0"), log[-4000:]
    lines = trace(tmp_path / "run" / "trace")
    slices, records = per_shard(lines, 2, workers=WORKERS)
    expected = sharded_replay(slices, records, synthetic.parse_args(list(map(str, args))))
    final = flat_ab(torch.load(tmp_path / "run" / "worker0.pt", weights_only=True))
    for (offset, numel), weights in zip(slices, expected):
        assert torch.allclose(final[offset:offset + numel], weights, atol=1e-5), (offset, numel)


@pytest.mark.parametrize("servers", [2])
def test_sync_across_hosts_equals_one_host_bit_for_bit(cluster, tmp_path, servers):
    args = ["--steps", 8, "--compensation", "sync", "--optimizer", "adam"]
    (tmp_path / "one").mkdir()
    alone = mpirun(WORKERS + 1, PROGRAMS / "synthetic.py", "--out", tmp_path / "one", *args)
    assert alone.returncode == 0, alone.stdout[-4000:]
    log = train(cluster, tmp_path / "hosts", *args, servers=servers, hosts=("-H", "a:2,b:3"))
    assert placement(log)[0] == "2", log[-4000:]
    one = flat_ab(torch.load(tmp_path / "one" / "worker0.pt", weights_only=True))
    for m in range(WORKERS):
        assert torch.equal(flat_ab(torch.load(tmp_path / "hosts" / f"worker{m}.pt", weights_only=True)), one), m


def test_two_servers_mapped_by_node_put_each_worker_on_a_gpu_no_server_of_its_host_holds(cluster, tmp_path):
    """``--servers 2 -H a:3,b:3``: the launcher adds ``--map-by node``, so a holds ranks 0, 2, 4 (server 0,
    workers 0 and 2) and b ranks 1, 3, 5 (server 1, workers 1 and 3), and each host's first worker has
    ``hvd.local_rank()`` 0.  With four stand-in GPU ids, every rank's ``hvd.init()`` places it by the ranks
    really on its host: each server on its host's first GPU, each worker on one of the others, at the index of
    its ``hvd.local_rank()``."""
    result = run(on_a(cluster, sys.executable, LAUNCHER, "-n", 4, "--servers", 2, "-H", "a:3,b:3",
                      "--gpus", "0,1,2,3", PROGRAMS / "pinning.py", tmp_path), env=cluster, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:]
    ranks = placed_ranks(tmp_path, 6)
    assert [r["host"] for r in ranks] == ["a", "b", "a", "b", "a", "b"]
    assert gpu_placement_problems(ranks, ["0", "1", "2", "3"]) == []
    assert [r["visible"] for r in ranks if r["host"] == "b"] == ["0,1,2,3", "1,2,3,0", "1,2,3,0"]


def test_one_worker_on_another_host_equals_one_host_bit_for_bit(cluster, tmp_path):
    args = ["--steps", 12, "--compensation", "adaptive", "--momentum", 0.9, "--nesterov"]
    (tmp_path / "one").mkdir()
    alone = mpirun(2, PROGRAMS / "synthetic.py", "--out", tmp_path / "one", *args)
    assert alone.returncode == 0, alone.stdout[-4000:]
    log = train(cluster, tmp_path / "hosts", *args, workers=1, hosts=("-H", "a:1,b:1"))
    assert placement(log) == ("2", "a: server; b: w0"), log[-4000:]
    assert torch.equal(flat_ab(torch.load(tmp_path / "hosts" / "worker0.pt", weights_only=True)),
                       flat_ab(torch.load(tmp_path / "one" / "worker0.pt", weights_only=True)))


class HostJob(BackgroundJob):
    """The launcher on host a in the background (see :class:`helpers.BackgroundJob`)."""

    def __init__(self, cluster, out: Path, *args, env=None, timeout=180, log="log", **kwargs):
        self.out = out
        super().__init__(launch(cluster, out, *args, **kwargs), out / log, {**cluster, **(env or {})}, timeout)


def hosts(cluster, *command):
    result = run(["bash", str(HOSTS), *command], env=cluster, timeout=120)
    assert result.returncode == 0, result.stdout


@pytest.fixture
def host_b_comes_back(cluster):
    """Host b is up again after the test, whatever the test did to it."""
    yield
    hosts(cluster, "boot", "b")


def checkpoints(folder: Path, servers: int):
    pattern = "checkpoint-*.pt" if servers == 1 else "server-*-of-*/checkpoint-*.pt"
    return sorted(folder.glob(pattern))


@pytest.mark.parametrize("fault, servers", [("link", 1), ("kill", 2)], ids=["link-down", "killed-with-a-server"])
def test_a_host_that_disappears_ends_the_job_naming_it_and_the_checkpoint_resumes(cluster, tmp_path, fault, servers,
                                                                                   host_b_comes_back):
    """Host b's link pulled (the server, on a, drops b's silent workers after
    the stall timeout and ends the job), or every process on b killed at once,
    the second server included (mpirun loses b's daemon); then the same
    command, b back, resumes from the periodic checkpoint."""

    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace"),
           "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.3", "HVD_DCASGD_STALL_TIMEOUT": "5"}
    layout = ("-H", "a:2,b:2") if servers == 1 else ("-H", "a:3,b:2")
    job = HostJob(cluster, tmp_path, *TRAINING, env=env, hosts=layout, servers=servers)
    job.wait_for(lambda: job.text().count("starts at step 0") == WORKERS
                 and len(checkpoints(tmp_path / "checkpoints", servers)) >= 2 * servers)
    lost = time.monotonic()
    hosts(cluster, *(("link", "b", "down") if fault == "link" else ("kill", "b")))
    status = job.wait()
    log = job.text()
    print(f"{fault}: the job ended {time.monotonic() - lost:.1f} s after host b was lost, status {status}")
    assert status != 0, log[-4000:]
    if fault == "link":
        assert re.search(r"worker \d \(MPI rank \d, host b\).* stopped pushing and was dropped after 5 s", log), log
    else:
        # Open MPI's words: the SSH session to b's daemon closed, a rank's TCP peer on b hung up
        assert re.search(r"Connection to b closed|Peer host:\s+b\n", log), log[-4000:]
    hosts(cluster, "boot", "b")
    newest = checkpoints(tmp_path / "checkpoints", servers)[-1]

    resumed = HostJob(cluster, tmp_path, *TRAINING, env=env, hosts=layout, servers=servers, log="log2")
    status = resumed.wait()
    log = resumed.text()
    assert status == 0, log[-4000:]
    assert log.count("resuming from update") == servers, log[-4000:]
    assert str(newest.parent if servers == 1 else newest.parent.parent) in log
    records = trace(tmp_path / "trace")
    if servers == 1:
        check_history(records, 40, workers=WORKERS)
        check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, TRAINING))), workers=WORKERS)
    else:
        check_resumed_sharded(tmp_path, records, servers, workers=WORKERS)


# --- SLURM on the emulated hosts: a slurmd per host, slurmctld on a -----------------------------

SLURM = ROOT / "tests" / "cluster" / "slurm.sh"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE"}
#: How long a SLURM job may take, from submission (or requeue) to its end, on 2 busy cores.
JOB_DEADLINE = 300
SLURM_TRAINING = ["--steps", 40, "--step-time", 0.1, "--compensation", "adaptive", "--momentum", 0.9]


@pytest.fixture(scope="module")
def slurm(cluster):
    """The environment of a SLURM command on host a, with a SLURM cluster of nodes a, b, c started."""
    started = run_command(["bash", str(SLURM), "start"], timeout=300, env=cluster, cwd=ROOT)
    if started.timed_out or started.returncode != 0:
        run_command(["bash", str(SLURM), "stop"], timeout=120, env=cluster, cwd=ROOT)
        unavailable(f"no SLURM cluster could be started on the emulated hosts: {started.stdout.strip() or 'timed out'}")
    env = {**cluster, "SLURM_CONF": os.path.join(cluster["HVD_DCASGD_HOSTS_DIR"], "slurm", "slurm.conf"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    yield env
    run_command(["bash", str(SLURM), "stop"], timeout=120, env=cluster, cwd=ROOT)


def slurm_command(env, *command, timeout=30):
    result = run_command(on_a(env, *command), timeout=timeout, env=env, cwd=ROOT)
    assert not result.timed_out, f"timed out: {command}"
    return result


def submit(env, out: Path, launcher: str, checkpoints: Path, name="job"):
    """multi_node.sbatch on 2 nodes, 1 server + 3 workers; its job id and output file."""
    output = out / f"{name}.out"
    job_env = {**env, "HVD_DCASGD_VENV": sys.prefix, "HVD_DCASGD_LAUNCHER": launcher,
               "HVD_DCASGD_CHECKPOINT_DIR": str(checkpoints), "HVD_DCASGD_TRACE": str(out / "trace")}
    result = run_command(on_a(env, "sbatch", "--parsable", f"--output={output}", "--time=5", "--nodes=2",
                              "--ntasks=4", "slurm/multi_node.sbatch", PROGRAMS / "synthetic.py", "--out", out,
                              *SLURM_TRAINING), timeout=30, env=job_env, cwd=ROOT)
    assert not result.timed_out and result.returncode == 0, result.stdout
    return result.stdout.strip().split(";")[0], output


def read(output: Path) -> str:
    return output.read_text() if output.exists() else "(no output)"


def job_state(env, job_id):
    result = slurm_command(env, "scontrol", "show", "job", "--oneliner", job_id)
    return dict(re.findall(r"(\w+)=(\S*)", result.stdout)) if result.returncode == 0 else {}


def until(env, job_id, output, done, what):
    deadline = time.monotonic() + JOB_DEADLINE
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.5)
    slurm_command(env, "scancel", job_id)
    pytest.fail(f"SLURM job {job_id} never {what}: cancelled\n{read(output)[-4000:]}")


def ended(env, job_id, output):
    fields = {}

    def final():
        fields.update(job_state(env, job_id))
        return fields.get("JobState") in FINAL_STATES

    until(env, job_id, output, final, "ended")
    return fields["JobState"], fields.get("ExitCode")


@pytest.mark.parametrize("launcher, stop", [("srun", "advance-signal"), ("mpirun", "scancel")])
def test_multi_node_sbatch_on_two_nodes_stops_with_a_checkpoint_and_resumes_exactly(slurm, tmp_path, launcher, stop):
    """The batch script across nodes a and b: training starts, SLURM's advance
    signal (USR1 to the batch script) or ``scancel`` (SIGTERM to everything)
    stops it with a checkpoint; the advance signal requeues the same job, a
    cancelled job is submitted again; either way the run resumes from the
    checkpoint and its whole trace replays bit for bit."""
    checkpoints = tmp_path / "checkpoints"
    job_id, output = submit(slurm, tmp_path, launcher, checkpoints)
    until(slurm, job_id, output, lambda: read(output).count("starts at step 0") == WORKERS, "started training")
    time.sleep(1)
    if stop == "advance-signal":
        assert slurm_command(slurm, "scancel", "--batch", "--signal=USR1", job_id).returncode == 0
        until(slurm, job_id, output, lambda: f"requeueing job {job_id}" in read(output), "requeued itself")
        # SLURM holds a requeued job for about two minutes: once it is pending, let it start now
        # (scontrol's name for the begin time is StartTime; it can be set only on a pending job)
        until(slurm, job_id, output, lambda: job_state(slurm, job_id).get("JobState") == "PENDING", "was requeued")
        time.sleep(10)  # what is left of its previous run on the nodes is gone by then (else a step can fail to launch)
        assert slurm_command(slurm, "scontrol", "update", f"JobId={job_id}", "StartTime=now").returncode == 0
        stopped = re.search(r"stopped at update (\d+), asked by SIGUSR1", read(output))
        assert stopped, read(output)[-4000:]
        update = int(stopped.group(1))
        state, exit_code = ended(slurm, job_id, output)
        text = read(output)
    else:
        assert slurm_command(slurm, "scancel", job_id).returncode == 0
        state, _ = ended(slurm, job_id, output)
        assert state == "CANCELLED", read(output)[-4000:]
        # the output of a cancelled job ends where SLURM stopped taking it: the checkpoint tells the update
        saved = sorted(checkpoints.glob("checkpoint-*.pt"))
        assert saved, read(output)[-4000:]
        update = int(saved[-1].name[11:20])
        job_id, output = submit(slurm, tmp_path, launcher, checkpoints, name="resubmitted")
        state, exit_code = ended(slurm, job_id, output)
        text = read(output)
    assert (state, exit_code) == ("COMPLETED", "0:0"), text[-4000:]
    assert f"2 node(s) a,b, {launcher}:" in text, text[-4000:]
    assert f"resuming from update {update}" in text, text[-4000:]
    assert placement(text)[0] == "2", text[-4000:]
    records = trace(tmp_path / "trace")
    check_history(records, 40, workers=WORKERS)
    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, SLURM_TRAINING))), workers=WORKERS)

"""The SLURM batch scripts, submitted to a real one-node SLURM cluster.

``slurm/local_cluster.sh`` installs Debian's slurm-wlm and munge and starts
munged, slurmctld and slurmd on this machine (8 CPUs declared); the cluster is
stopped when the test session ends.  Where it cannot be started (not root, no
apt-get, no package) the tests are skipped; a job that runs and fails, or
does not end in time (it is then cancelled), fails them.  The jobs are all
submitted at once and run side by side.
"""

import os
import re
import sys
import time

import pytest

from helpers import ROOT, unavailable
from hvd_dcasgd.process import run_command

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CLUSTER = ROOT / "slurm" / "local_cluster.sh"
#: How long a job may take, from submission to its end, on 2 busy cores.
JOB_DEADLINE = 300
#: SLURM's job states after which nothing more happens.
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
ACCURACY = re.compile(r"final test accuracy (\d\.\d+) \(compensation \w+, (\d+) workers")


def _command(cmd, env, timeout):
    """Run ``cmd`` in its own process group, killed as a whole on timeout
    (``None`` then); the result otherwise."""
    result = run_command(cmd, timeout=timeout, env=env, cwd=ROOT)
    return None if result.timed_out else result


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    """The environment of a command that talks to a freshly started local cluster."""
    if os.geteuid() != 0:
        unavailable("starting a local SLURM cluster needs root")
    env = {**os.environ, "HVD_DCASGD_SLURM_DIR": str(tmp_path_factory.mktemp("slurm"))}
    stop = ["bash", str(CLUSTER), "stop"]
    started = _command(["bash", str(CLUSTER), "start"], env, timeout=240)
    if started is None or started.returncode != 0:
        _command(stop, env, timeout=60)
        reason = "timed out after 240 s" if started is None else started.stdout.strip()
        unavailable(f"no local SLURM cluster could be started: {reason}")
    env["SLURM_CONF"] = os.path.join(env["HVD_DCASGD_SLURM_DIR"], "slurm.conf")
    yield env
    _command(stop, env, timeout=60)


@pytest.fixture(scope="module")
def jobs(slurm_env, tmp_path_factory):
    """Submit every job at once; name -> (job id, output file, submission time)."""
    out_dir = tmp_path_factory.mktemp("slurm_jobs")
    venv = {"HVD_DCASGD_VENV": sys.prefix}
    train = ["examples/train_digits.py", "--epochs", "5"]
    plans = {
        # the default launcher (srun --mpi=pmix), 1 server + 4 workers
        "one_node": ({}, [], "one_node.sbatch", train),
        # mpirun inside the allocation, Open MPI's TCP settings (osc/pt2pt), on the one node there is
        "multi_node": ({"HVD_DCASGD_LAUNCHER": "mpirun"}, ["--nodes=1", "--ntasks=3"], "multi_node.sbatch", train),
        # two parameter servers, each a slice of the parameters, and 2 workers
        "two_servers": ({"HVD_DCASGD_SERVERS": "2"}, ["--ntasks=4"], "one_node.sbatch", train),
        # a rank that fails must fail the job
        "failing": ({}, ["--ntasks=3"], "one_node.sbatch", ["no_such_script.py"]),
        # stopped by SLURM's advance signal, requeued, resumed
        "preempted": ({"HVD_DCASGD_CHECKPOINT_DIR": str(out_dir / "checkpoints")}, ["--ntasks=3"], "one_node.sbatch",
                      ["tests/programs/synthetic.py", "--steps", "1000000", "--step-time", "0.05",
                       "--restarted-steps", "20", "--out", str(out_dir)]),
    }
    submitted = {}
    for name, (extra_env, options, script, args) in plans.items():
        output = out_dir / f"{name}.out"
        cmd = ["sbatch", "--parsable", f"--output={output}", "--time=5", *options, f"slurm/{script}", *args]
        result = _command(cmd, {**slurm_env, **venv, **extra_env}, timeout=30)
        assert result is not None and result.returncode == 0, f"sbatch failed: {cmd}\n{result and result.stdout}"
        submitted[name] = (result.stdout.strip().split(";")[0], output, time.monotonic())
    return submitted


def _read(output):
    return output.read_text() if output.exists() else "(no output)"


def _job_fields(job_id, env):
    result = _command(["scontrol", "show", "job", "--oneliner", job_id], env, timeout=20)
    if result is None or result.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", result.stdout))


def finished(name, jobs, env):
    """Wait for the job to end (cancel it and fail past the deadline); its
    state, exit code and output."""
    job_id, output, submitted = jobs[name]
    fields = {}
    while time.monotonic() - submitted < JOB_DEADLINE:
        fields = _job_fields(job_id, env)
        if fields.get("JobState") in FINAL_STATES:
            return fields["JobState"], fields.get("ExitCode"), _read(output)
        time.sleep(1)
    _command(["scancel", job_id], env, timeout=20)
    pytest.fail(f"SLURM job {job_id} ({name}) still {fields.get('JobState', 'unknown')} after "
                f"{JOB_DEADLINE} s: cancelled\n{_read(output)[-4000:]}")


@pytest.mark.parametrize("name, launcher, servers, workers", [
    ("one_node", "srun", 1, 4), ("multi_node", "mpirun", 1, 2), ("two_servers", "srun", 2, 2)])
def test_batch_script_trains_digits(name, launcher, servers, workers, jobs, slurm_env):
    state, exit_code, output = finished(name, jobs, slurm_env)
    assert (state, exit_code) == ("COMPLETED", "0:0"), output[-4000:]
    assert f"{servers} server(s) + {workers} workers on" in output and f", {launcher}: " in output, output[-4000:]
    found = ACCURACY.search(output)
    assert found, output[-4000:]
    assert int(found.group(2)) == workers
    assert float(found.group(1)) > 0.85, output[-4000:]


def test_failing_rank_fails_the_job(jobs, slurm_env):
    state, exit_code, output = finished("failing", jobs, slurm_env)
    assert state == "FAILED" and exit_code != "0:0", output[-4000:]
    assert "no_such_script.py" in output, output[-4000:]


def _wait_for(text, name, jobs, env):
    job_id, output, submitted = jobs[name]
    while time.monotonic() - submitted < JOB_DEADLINE:
        if text in _read(output):
            return
        time.sleep(0.5)
    _command(["scancel", job_id], env, timeout=20)
    pytest.fail(f"SLURM job {job_id} ({name}) never printed {text!r}: cancelled\n{_read(output)[-4000:]}")


def test_a_job_stopped_by_slurms_advance_signal_is_requeued_and_resumes(jobs, slurm_env):
    """What ``--signal=B:USR1@60`` does before the time limit: USR1 to the
    batch script only.  The job stops with a checkpoint, requeues itself,
    and the same job, run again, resumes from it and completes.  (Its first
    run would train for ever: it ends only by being stopped.)"""
    job_id, output, _ = jobs["preempted"]
    _wait_for("worker 1 starts at step 0", "preempted", jobs, slurm_env)
    time.sleep(2)
    signalled = _command(["scancel", "--batch", "--signal=USR1", job_id], slurm_env, timeout=20)
    assert signalled is not None and signalled.returncode == 0, signalled and signalled.stdout
    _wait_for(f"requeueing job {job_id}", "preempted", jobs, slurm_env)
    # SLURM holds a requeued job for about two minutes; let it start now
    _command(["scontrol", "update", f"JobId={job_id}", "BeginTime=now"], slurm_env, timeout=20)
    requeued = {"preempted": (job_id, output, time.monotonic())}  # its second run's deadline starts now
    state, exit_code, text = finished("preempted", requeued, slurm_env)
    assert (state, exit_code) == ("COMPLETED", "0:0"), text[-4000:]
    stopped = re.search(r"stopped at update (\d+), asked by SIGUSR1", text)
    assert stopped, text[-4000:]
    assert f"resuming from update {stopped.group(1)}" in text, text[-4000:]
    resumed = text[text.index("resuming from update"):]
    # each worker starts where the server had taken its pushes, and does 20 more
    starts = [int(re.search(rf"worker {m} starts at step (\d+)", resumed).group(1)) for m in range(2)]
    assert sum(starts) == int(stopped.group(1)), text[-4000:]
    assert all(f"worker {m} done: {starts[m] + 20} steps" in resumed for m in range(2)), text[-4000:]

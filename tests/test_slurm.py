"""The SLURM batch scripts, submitted to a real one-node SLURM cluster.

Stops arrive as SLURM sends them: the advance signal (USR1 to the batch
script), a plain ``scancel`` and the time limit (SIGTERM to every process of
the job, SIGKILL ``KillWait`` seconds later), ``scontrol requeue``; each job
resumes from its checkpoint, bit for bit as a replay of its whole trace.

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
import torch

from helpers import PROGRAMS, ROOT, replay_exactly, trace, unavailable
from hvd_dcasgd.common.process import run_command

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CLUSTER = ROOT / "slurm" / "local_cluster.sh"
#: How long a job may take, from submission (or a requeue) to its end, on 2 busy cores.
JOB_DEADLINE = 400
#: SLURM's job states after which nothing more happens.
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
#: The jobs stopped by a plain scancel, by their time limit, by scontrol requeue: their time limits (minutes).
# 2 minutes for the time limit's job: its ranks start among every other job's, and on 2 busy cores a job
# once took over a minute to start training, so that its limit came before its session (the signal then ends
# it, with nothing to save).  10 minutes for the two that a test stops: past JOB_DEADLINE, so that SLURM's
# advance signal (60 s before the limit) never stops one first (with 5 minutes, it once did, before the
# second test's turn came: the job requeued itself, and the test's requeue found it pending).
STOPPED = {"cancelled": 10, "timed_out": 2, "requeued": 10}
#: What they train: 2 workers, 0.1 s a step, until stopped; resumed, 20 steps more each.
STOPPED_TRAINING = ["--steps", "100000", "--step-time", "0.1", "--resumed-steps", "20", "--compensation", "adaptive",
                    "--momentum", "0.9"]
ACCURACY = re.compile(r"final test accuracy (\d\.\d+) \(compensation \w+[^)]*?, (\d+) workers")


# SLURM's controller answers slowly when the machine is loaded (as CI's two
# cores are, with every job of this module running): a control command gets
# this long before it counts as hung.
CONTROL_TIMEOUT = 90


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
    # the batch script as a user without an advance signal has it: the time limit's SIGTERM is the only warning
    no_advance_signal = out_dir / "no_advance_signal.sbatch"
    no_advance_signal.write_text("".join(line for line in (ROOT / "slurm" / "one_node.sbatch").open()
                                         if "--signal" not in line))
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
    for name, time_limit in STOPPED.items():  # stopped by SLURM's own ways, resumed from the checkpoint
        (out_dir / name).mkdir()
        plans[name] = (stopped_env(out_dir / name), ["--ntasks=3", f"--time={time_limit}"],
                       no_advance_signal if name == "timed_out" else "one_node.sbatch",
                       [str(PROGRAMS / "synthetic.py"), "--out", str(out_dir / name), *STOPPED_TRAINING])
    submitted = {}
    for name, (extra_env, options, script, args) in plans.items():
        output = out_dir / f"{name}.out"
        # 10 minutes: past JOB_DEADLINE, so that SLURM's advance signal (60 s before the limit) never reaches a
        # job that is only slow on a loaded machine (a 5-minute limit signalled a digits job at 4 minutes)
        limit = [] if any(o.startswith("--time") for o in options) else ["--time=10"]
        cmd = ["sbatch", "--parsable", f"--output={output}", *limit, *options, str(ROOT / "slurm" / script), *args]
        result = _command(cmd, {**slurm_env, **venv, **extra_env}, timeout=30)
        assert result is not None and result.returncode == 0, f"sbatch failed: {cmd}\n{result and result.stdout}"
        submitted[name] = (result.stdout.strip().split(";")[0], output, time.monotonic())
    return submitted


def stopped_env(out):
    """A stopped job's checkpoints and trace, in its own folder."""
    return {"HVD_DCASGD_CHECKPOINT_DIR": str(out / "checkpoints"), "HVD_DCASGD_TRACE": str(out / "trace")}


def _read(output):
    return output.read_text() if output.exists() else "(no output)"


def _job_fields(job_id, env):
    result = _command(["scontrol", "show", "job", "--oneliner", job_id], env, timeout=CONTROL_TIMEOUT)
    if result is None or result.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", result.stdout))


def finished(name, jobs, env):
    """Wait for the job to end (cancel it and fail past the deadline); its
    state, exit code and output."""
    job_id, output, submitted = jobs[name]
    while True:  # looked at once at least: a job that ended in time is not late because its test comes late
        fields = _job_fields(job_id, env)
        if fields.get("JobState") in FINAL_STATES:
            return fields["JobState"], fields.get("ExitCode"), _read(output)
        if time.monotonic() - submitted >= JOB_DEADLINE:
            break
        time.sleep(1)
    _command(["scancel", job_id], env, timeout=CONTROL_TIMEOUT)
    pytest.fail(f"SLURM job {job_id} ({name}) still {fields.get('JobState', 'unknown')} after "
                f"{JOB_DEADLINE} s: cancelled\n{_read(output)[-4000:]}")


def _wait_for(text, name, jobs, env):
    job_id, output, submitted = jobs[name]
    while True:  # read once at least, as finished() looks
        if text in _read(output):
            return
        if time.monotonic() - submitted >= JOB_DEADLINE:
            break
        time.sleep(0.5)
    _command(["scancel", job_id], env, timeout=CONTROL_TIMEOUT)
    pytest.fail(f"SLURM job {job_id} ({name}) never printed {text!r}: cancelled\n{_read(output)[-4000:]}")


#: Seconds a requeued job is left pending before it is let start: what is left
#: of its previous run on the node (its step's daemon, srun's PMIx files) is
#: gone by then; a job let start at once can fail to launch its step.
REQUEUE_PAUSE = 10


def released(name, jobs, env):
    """Once the requeued job is pending, let it start (SLURM holds a
    requeued job for about two minutes; scontrol's name for the begin time is
    ``StartTime``, and it can be set only once the job is pending)."""
    job_id, output, _ = jobs[name]
    deadline = time.monotonic() + JOB_DEADLINE
    while time.monotonic() < deadline:
        fields = _job_fields(job_id, env)
        if (fields.get("JobState") == "RUNNING" or fields.get("JobState") in FINAL_STATES) \
                and int(fields.get("Restarts", "0")) > 0:
            return  # SLURM's hold is over: it started the job again itself
        if fields.get("JobState") == "PENDING":
            time.sleep(REQUEUE_PAUSE)
            started = _command(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env, timeout=CONTROL_TIMEOUT)
            if started is not None and started.returncode != 0 and _job_fields(job_id, env).get("JobState") != "PENDING":
                return  # its hold ended meanwhile: it started
            assert started is not None and started.returncode == 0, started and started.stdout
            return
        time.sleep(0.5)
    _command(["scancel", job_id], env, timeout=CONTROL_TIMEOUT)
    pytest.fail(f"SLURM job {job_id} ({name}) was never requeued: cancelled\n{_read(output)[-4000:]}")


def check_resumed_exactly(out, text, resumed_from):
    """The run resumed from update ``resumed_from``; the trace of both runs
    replays, bit for bit, to the weights every worker ended with, each
    worker having done 20 steps more."""
    assert f"resuming from update {resumed_from}" in text, text[-4000:]
    records = trace(out / "trace")
    updates = [r for r in records if "update" in r]
    assert [r["update"] for r in updates] == list(range(len(updates))), "update numbers go on across the restart"
    assert len(updates) == resumed_from + 2 * 20, text[-4000:]
    for m in range(2):
        steps = [r["step"] for r in updates if r["worker"] == m]
        assert steps == list(range(len(steps))), m
    a, b = replay_exactly(records, synthetic.parse_args(STOPPED_TRAINING), workers=2)
    for m in range(2):
        final = torch.load(out / f"worker{m}.pt", weights_only=True)
        assert torch.equal(final["a"], a) and torch.equal(final["b"], b), m


def stopped_and_saved(text, out):
    """The update the job stopped at, with the checkpoint of it."""
    stopped = re.search(r"stopped at update (\d+), asked by SIG\w+: checkpoint \S+checkpoint-(\d+)\.pt; exit status 75",
                        text)
    assert stopped, text[-4000:]
    assert int(stopped.group(2)) == int(stopped.group(1)), text[-4000:]
    assert (out / "checkpoints" / f"checkpoint-{int(stopped.group(1)):09d}.pt").exists()
    return int(stopped.group(1))


def submitted_again(name, jobs, env, out):
    """The same batch job submitted again (a new job, same checkpoint folder)."""
    output = out.parent / f"{name}-again.out"
    cmd = ["sbatch", "--parsable", f"--output={output}", "--time=5", "--ntasks=3", str(ROOT / "slurm" / "one_node.sbatch"),
           str(PROGRAMS / "synthetic.py"), "--out", str(out), *STOPPED_TRAINING]
    result = _command(cmd, {**env, "HVD_DCASGD_VENV": sys.prefix, **stopped_env(out)}, timeout=30)
    assert result is not None and result.returncode == 0, result and result.stdout
    again = {name: (result.stdout.strip().split(";")[0], output, time.monotonic())}
    return finished(name, again, env)


# The stop tests come first: each acts on its job as soon as it trains (the
# jobs were all submitted at once), before SLURM's own advance signal would.


def test_a_plain_scancel_stops_with_a_checkpoint_and_the_job_submitted_again_resumes_exactly(jobs, slurm_env):
    """``scancel JOBID``: SIGTERM to every process of the job (the ranks and
    the batch script) at once.  The job saves a checkpoint and stays
    cancelled (no requeue); submitted again, it resumes from it."""
    job_id, output, _ = jobs["cancelled"]
    out = output.parent / "cancelled"
    _wait_for("worker 1 starts at step 0", "cancelled", jobs, slurm_env)
    time.sleep(1)
    cancelled = _command(["scancel", job_id], slurm_env, timeout=CONTROL_TIMEOUT)
    assert cancelled is not None and cancelled.returncode == 0, cancelled and cancelled.stdout
    # its deadline starts at the stop: the job was submitted with the others, minutes before its turn came
    state, _, text = finished("cancelled", {"cancelled": (job_id, output, time.monotonic())}, slurm_env)
    assert state == "CANCELLED", text[-4000:]
    stopped = stopped_and_saved(text, out)
    assert "requeueing" not in text and _job_fields(job_id, slurm_env).get("Restarts") == "0", text[-4000:]
    state, exit_code, text = submitted_again("cancelled", jobs, slurm_env, out)
    assert (state, exit_code) == ("COMPLETED", "0:0"), text[-4000:]
    check_resumed_exactly(out, text, stopped)


def test_scontrol_requeue_stops_with_a_checkpoint_and_the_requeued_job_resumes_exactly(jobs, slurm_env):
    """``scontrol requeue JOBID`` of a running job: SLURM stops it (SIGTERM
    to every process) and requeues it; its next run resumes from the
    checkpoint the stop saved."""
    job_id, output, _ = jobs["requeued"]
    out = output.parent / "requeued"
    _wait_for("worker 1 starts at step 0", "requeued", jobs, slurm_env)
    time.sleep(1)
    requeued = _command(["scontrol", "requeue", job_id], slurm_env, timeout=CONTROL_TIMEOUT)
    assert requeued is not None and requeued.returncode == 0, requeued and requeued.stdout
    released("requeued", jobs, slurm_env)
    stopped = stopped_and_saved(_read(output), out)
    state, exit_code, text = finished("requeued", {"requeued": (job_id, output, time.monotonic())}, slurm_env)
    assert (state, exit_code) == ("COMPLETED", "0:0"), text[-4000:]
    assert "requeueing" not in text and _job_fields(job_id, slurm_env).get("Restarts") == "1", text[-4000:]
    check_resumed_exactly(out, text, stopped)


def test_a_job_stopped_by_slurms_advance_signal_is_requeued_and_resumes(jobs, slurm_env):
    """What ``--signal=B:USR1@60`` does before the time limit: USR1 to the
    batch script only.  The job stops with a checkpoint, requeues itself,
    and the same job, run again, resumes from it and completes.  (Its first
    run would train for ever: it ends only by being stopped.)"""
    job_id, output, _ = jobs["preempted"]
    _wait_for("worker 1 starts at step 0", "preempted", jobs, slurm_env)
    time.sleep(2)
    # On a loaded machine scancel can deliver the signal and then wait for the controller's reply past its
    # timeout: a hung scancel is not a failure of the job; the job's own output below decides (it stops and
    # requeues only if the batch script got USR1).
    signalled = _command(["scancel", "--batch", "--signal=USR1", job_id], slurm_env, timeout=CONTROL_TIMEOUT)
    assert signalled is None or signalled.returncode == 0, signalled.stdout
    # its deadline starts at the signal: the job was submitted with the others, minutes before its turn came
    # (its ranks alone can take half a minute to exit on a loaded machine)
    _wait_for(f"requeueing job {job_id}", "preempted", {"preempted": (job_id, output, time.monotonic())},
              slurm_env)
    released("preempted", jobs, slurm_env)
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


def test_a_job_at_its_time_limit_stops_with_a_checkpoint_requeues_itself_and_resumes_exactly(jobs, slurm_env):
    """A 2-minute job whose batch script has no advance signal: the time
    limit's SIGTERM to every process is the only warning (SIGKILL follows
    ``KillWait`` seconds later).  The job saves a checkpoint, requeues
    itself, and runs again from it."""
    job_id, output, _ = jobs["timed_out"]
    out = output.parent / "timed_out"
    _wait_for(f"requeueing job {job_id}", "timed_out", jobs, slurm_env)
    text = _read(output)
    assert "DUE TO TIME LIMIT" in text, text[-4000:]
    stopped = stopped_and_saved(text, out)
    released("timed_out", jobs, slurm_env)
    state, exit_code, text = finished("timed_out", {"timed_out": (job_id, output, time.monotonic())}, slurm_env)
    assert (state, exit_code) == ("COMPLETED", "0:0"), text[-4000:]
    assert _job_fields(job_id, slurm_env).get("Restarts") == "1", text[-4000:]
    check_resumed_exactly(out, text, stopped)


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

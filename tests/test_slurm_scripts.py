"""Every branch of the SLURM batch scripts, as a dry run: ``srun`` and
``mpirun`` replaced by stand-ins on PATH that print the command and the
environment they were given, so what the scripts export and start is checked
without a cluster (tests/test_slurm.py submits them to a real one)."""

import os
import re
import shutil
import signal
import stat
import subprocess
import sys

import pytest

from helpers import PROGRAMS, ROOT, gpu_placement_problems, placed_ranks, run

STAND_IN = """#!/bin/sh
echo "$(basename "$0") $*"
env | grep -E '^(OMPI_MCA_|HVD_DCASGD_|OMP_NUM_THREADS|SRUN_CPUS_PER_TASK|SLURM_GPUS_PER_TASK|SLURM_TRES_PER_TASK)' | sort
"""


#: mpirun's stand-in also starts each rank's command, as two ranks on a node
#: with four GPUs would: so the per-rank GPU binding runs for real.
RANKS = """
shift 2; [ "$1" = "--allow-run-as-root" ] && shift 2 || shift 1
for rank in 0 1; do OMPI_COMM_WORLD_LOCAL_RANK=$rank CUDA_VISIBLE_DEVICES=0,1,2,3 "$@"; done
"""
PYTHON = """#!/bin/sh
echo "rank $OMPI_COMM_WORLD_LOCAL_RANK sees GPUs '$CUDA_VISIBLE_DEVICES'"
"""


def executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def stand_ins(tmp_path):
    """A folder with ``srun`` and ``mpirun`` stand-ins, and a venv whose Python says what GPUs it sees."""
    executable(tmp_path / "bin" / "srun", STAND_IN)
    executable(tmp_path / "bin" / "mpirun", STAND_IN + RANKS)
    executable(tmp_path / "venv" / "bin" / "python", PYTHON)
    return tmp_path


def submit(script, stand_ins, *args, timeout=30, **env):
    """``bash slurm/SCRIPT ARGS`` with the stand-ins first on PATH, in a
    3-task allocation unless ``env`` says otherwise; the scripts' own
    defaults, not this machine's MPI settings."""
    env = {"PATH": f"{stand_ins / 'bin'}{os.pathsep}{os.environ['PATH']}", "HVD_DCASGD_LAUNCHER": "srun",
           "HVD_DCASGD_REPO": str(ROOT), "HVD_DCASGD_VENV": str(stand_ins / "venv"), "SLURM_NTASKS": "3",
           **dict.fromkeys(("OMPI_MCA_osc", "OMPI_MCA_btl", "OMPI_MCA_pml", "HVD_DCASGD_HOROVOD", "OMP_NUM_THREADS",
                            "HVD_DCASGD_CHECKPOINT_DIR", "OMPI_MCA_odls_base_sigkill_timeout", "HVD_DCASGD_GPUS"),
                           ""),
           **env}
    return run(["bash", ROOT / "slurm" / script, *args], env=env, timeout=timeout)


def batch(script, stand_ins, launcher, **extra):
    """A successful dry run of SCRIPT as a 5-task, 2-node job with 2 CPUs per task; what it printed."""
    result = submit(script, stand_ins, HVD_DCASGD_LAUNCHER=launcher, SLURM_NTASKS="5", SLURM_JOB_NUM_NODES="2",
                    SLURM_JOB_NODELIST="node[1-2]", SLURM_CPUS_PER_TASK="2", SLURM_JOB_ID="4242", **extra)
    assert result.returncode == 0, result.stdout
    return result.stdout


def exported(output):
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line and " " not in line.split("=")[0])


@pytest.mark.parametrize("script", ["one_node.sbatch", "multi_node.sbatch"])
def test_srun_branch(stand_ins, script):
    out = batch(script, stand_ins, "srun")
    python = stand_ins / "venv" / "bin" / "python"
    assert f"srun --mpi=pmix --kill-on-bad-exit=1 {python} examples/train_digits.py --epochs 30" in out, out
    env = exported(out)
    assert env["OMP_NUM_THREADS"] == "2" and env["SRUN_CPUS_PER_TASK"] == "2"
    assert env["HVD_DCASGD_CHECKPOINT_DIR"] == f"{ROOT}/checkpoints/4242"  # per job: a requeued job finds it
    assert env.get("OMPI_MCA_odls_base_sigkill_timeout", "") == ""  # srun: SLURM's KillWait applies
    if script == "multi_node.sbatch":  # TCP between nodes: osc/pt2pt, which refuses Horovod's thread level
        assert env["OMPI_MCA_osc"] == "pt2pt" and env["HVD_DCASGD_HOROVOD"] == "0"
        assert env["OMPI_MCA_btl"] == "self,vader,tcp" and env["OMPI_MCA_pml"] == "ob1"
    else:
        assert env["OMPI_MCA_osc"] == "sm" and env.get("HVD_DCASGD_HOROVOD", "") == ""


@pytest.mark.parametrize("script", ["one_node.sbatch", "multi_node.sbatch"])
def test_mpirun_branch_binds_one_gpu_per_rank(stand_ins, script):
    out = batch(script, stand_ins, "mpirun", SLURM_GPUS_PER_TASK="gpu:2", SLURM_TRES_PER_TASK="gres:gpu:2")
    root = "--allow-run-as-root " if os.geteuid() == 0 else ""
    assert f"\nmpirun {root}-np 5 bash -c " in out, out
    env = exported(out)
    assert "SLURM_GPUS_PER_TASK" not in env and "SLURM_TRES_PER_TASK" not in env, "the daemon's step gets every GPU"
    assert env["HVD_DCASGD_GPUS"] == "keep", "each rank keeps the two it is given"
    # two GPUs per task: local rank 0 gets the node's first two, rank 1 the next two
    assert "rank 0 sees GPUs '0,1'" in out and "rank 1 sees GPUs '2,3'" in out, out


#: ``srun`` and ``mpirun`` that start the command for real, as 4 ranks of a node with four GPUs, under this
#: machine's mpirun (REAL), without the test's empty settings.
REAL_RANKS = """
for name in $(env | sed -n 's/^\\(OMPI_MCA_[A-Za-z0-9_]*\\|HVD_DCASGD_[A-Z_]*\\)=$/\\1/p'); do unset "$name"; done
export CUDA_VISIBLE_DEVICES=0,1,2,3
if [ "$(basename "$0")" = srun ]; then
    while [ "${1#-}" != "$1" ]; do shift; done  # srun's options, then the command
    exec REAL --oversubscribe $([ "$(id -u)" -eq 0 ] && echo --allow-run-as-root) -np "$SLURM_NTASKS" "$@"
fi
exec REAL --oversubscribe "$@"
"""


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_one_gpu_per_task_gives_every_rank_the_nodes_gpus_and_init_places_it(stand_ins, launcher, tmp_path):
    """sbatch --gpus-per-task=1: every rank is started as it is, given every GPU of its node (``srun
    --gpu-bind=none``; under ``mpirun``, the daemon's step holds them), and its ``hvd.init()`` places it: the
    server on the first, each worker on its own at the index of its ``hvd.local_rank()``."""
    executable(stand_ins / "venv" / "bin" / "python", f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    executable(stand_ins / "bin" / launcher, STAND_IN + REAL_RANKS.replace("REAL", shutil.which("mpirun")))
    out = tmp_path / "ranks"
    out.mkdir()
    result = submit("one_node.sbatch", stand_ins, PROGRAMS / "pinning.py", out, HVD_DCASGD_LAUNCHER=launcher,
                    SLURM_NTASKS="4", SLURM_GPUS_PER_TASK="1", timeout=180)
    assert result.returncode == 0, result.stdout
    python = stand_ins / "venv" / "bin" / "python"
    started = {"srun": f"srun --mpi=pmix --kill-on-bad-exit=1 --gpu-bind=none {python} {PROGRAMS / 'pinning.py'}",
               "mpirun": f"-np 4 {python} {PROGRAMS / 'pinning.py'}"}[launcher]
    assert started in result.stdout, result.stdout
    assert exported(result.stdout).get("HVD_DCASGD_GPUS", "") == "", "auto, each rank's default"
    ranks = placed_ranks(out, 4)
    assert [r["visible"] for r in ranks] == ["0,1,2,3", "1,2,3,0", "1,2,3,0", "1,2,3,0"]
    assert gpu_placement_problems(ranks, ["0", "1", "2", "3"]) == []


def test_several_gpus_per_task_are_kept_as_slurm_binds_them(stand_ins):
    out = batch("one_node.sbatch", stand_ins, "srun", SLURM_GPUS_PER_TASK="2")
    assert "--gpu-bind" not in out and exported(out)["HVD_DCASGD_GPUS"] == "keep", out
    out = batch("one_node.sbatch", stand_ins, "srun", SLURM_GPUS_PER_TASK="2", HVD_DCASGD_GPUS="none")
    assert exported(out)["HVD_DCASGD_GPUS"] == "none", "the user's setting wins"


@pytest.mark.parametrize("script", ["one_node.sbatch", "multi_node.sbatch"])
def test_mpirun_branch_without_gpus_starts_the_script_as_it_is(stand_ins, script):
    out = batch(script, stand_ins, "mpirun")
    python = stand_ins / "venv" / "bin" / "python"
    assert f"-np 5 {python} examples/train_digits.py --epochs 30" in out and "bind-gpus" not in out, out
    assert "rank 0 sees GPUs '0,1,2,3'" in out, "no binding without a GPU request"
    # told to stop by scancel, mpirun gives the ranks 20 s to save instead of Open MPI's 1 s
    assert exported(out)["OMPI_MCA_odls_base_sigkill_timeout"] == "20"


@pytest.mark.parametrize("status, requeued", [(75, True), (0, False), (3, False)])
def test_a_preempted_job_requeues_itself_and_passes_the_status_on(stand_ins, status, requeued):
    executable(stand_ins / "bin" / "srun", f"#!/bin/sh\nexit {status}\n")
    executable(stand_ins / "bin" / "scontrol", "#!/bin/sh\necho \"scontrol $*\"\n")
    result = submit("one_node.sbatch", stand_ins, SLURM_JOB_ID="4242")
    assert result.returncode == status, result.stdout
    assert ("scontrol requeue 4242" in result.stdout) == requeued, result.stdout
    if requeued:
        assert "one_node.sbatch: the job was stopped and saved a checkpoint in" in result.stdout


RANKS_STOP = "echo ranks got USR1; exit 75"


def _signal_one_node_script(stand_ins, number, squeue=None, on_usr1=RANKS_STOP, scontrol=""):
    """Run ``one_node.sbatch`` with stand-in ``srun`` ranks (on USR1 they run
    ``on_usr1``: by default they say so and exit 75) and ``scontrol`` (it
    echoes, after ``scontrol``'s lines), send ``number`` to the batch script
    once the ranks started; its status and output."""
    executable(stand_ins / "bin" / "srun", f"#!/bin/bash\ntrap '{on_usr1}' USR1\n"
                                           "echo ranks started\nfor i in $(seq 300); do sleep 0.1; done\nexit 9\n")
    executable(stand_ins / "bin" / "scontrol", f"#!/bin/sh\n{scontrol}echo \"scontrol $*\"\n")
    if squeue is not None:
        executable(stand_ins / "bin" / "squeue", squeue)
    env = {**os.environ, "PATH": f"{stand_ins / 'bin'}{os.pathsep}{os.environ['PATH']}", "HVD_DCASGD_LAUNCHER": "srun",
           "HVD_DCASGD_REPO": str(ROOT), "HVD_DCASGD_VENV": str(stand_ins / "venv"), "SLURM_NTASKS": "3",
           "SLURM_JOB_ID": "7", "HVD_DCASGD_CHECKPOINT_DIR": str(stand_ins / "checkpoints")}
    # SLURM starts a batch script with every signal's default action; a test run started in the background
    # (`pytest ... &`) has SIGINT ignored, which bash would inherit and could then not trap
    script = subprocess.Popen(["bash", str(ROOT / "slurm" / "one_node.sbatch")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert script.stdout.readline().startswith("hvd_dcasgd: 1 server(s) + 2 workers")
    assert script.stdout.readline() == "ranks started\n"
    script.send_signal(number)
    out, _ = script.communicate(timeout=20)
    return script.returncode, out


def test_a_stop_signal_to_the_script_reaches_the_ranks_as_usr1(stand_ins):
    """SLURM's advance signal (--signal=B:USR1@60) goes to the batch script only."""
    status, out = _signal_one_node_script(stand_ins, signal.SIGUSR1)
    assert status == 75, out
    assert "ranks got USR1" in out and "scontrol requeue 7" in out, out


@pytest.mark.parametrize("number, requeued", [(signal.SIGUSR1, True), (signal.SIGTERM, False), (signal.SIGINT, False)])
def test_only_a_stop_before_the_time_limit_by_term_or_int_leaves_the_job_cancelled(stand_ins, number, requeued):
    """The advance signal requeues the stopped job; SIGTERM or SIGINT before
    the time limit (a plain scancel, SLURM's own requeue) does not."""
    in_an_hour = "#!/bin/sh\ndate -d '+1 hour' +%Y-%m-%dT%H:%M:%S\n"  # squeue: the job ends in an hour
    status, out = _signal_one_node_script(stand_ins, number, squeue=in_an_hour)
    assert status == 75, out
    assert ("scontrol requeue 7" in out) == requeued, out
    assert ("stopped before its time limit (cancelled, or requeued by SLURM)" in out) != requeued, out


def test_at_the_time_limit_a_saved_job_is_requeued_before_slurm_kills_the_script(stand_ins):
    """SLURM kills the batch script ``KillWait`` seconds after the time
    limit's SIGTERM, whether or not the ranks have exited: ranks that saved
    their checkpoint but are slow to exit must not cost the requeue."""
    ends_now = "#!/bin/sh\ndate +%Y-%m-%dT%H:%M:%S\n"  # squeue: the job ends now, so SIGTERM is the time limit's
    kill_wait = 'case "$*" in "show config") echo "KillWait                = 12 sec";; esac\n'
    # the ranks save a checkpoint at once, then take 6 s to exit
    slow_exit = ('echo ranks got USR1; sleep 0.1; touch "$HVD_DCASGD_CHECKPOINT_DIR/checkpoint-000000009.pt"; '
                 'sleep 6; echo ranks exit; exit 75')
    status, out = _signal_one_node_script(stand_ins, signal.SIGTERM, squeue=ends_now, on_usr1=slow_exit,
                                          scontrol=kill_wait)
    assert status == 75, out
    # 2 s after the SIGTERM (10 s before KillWait's end), while the ranks are still exiting
    assert out.count("scontrol requeue 7") == 1, out
    assert out.index("requeueing job 7") < out.index("ranks exit"), out
    assert "its ranks are still exiting, and SLURM ends this script 12 s after the time limit" in out, out


def test_at_the_time_limit_a_job_with_no_checkpoint_since_the_stop_is_not_requeued_early(stand_ins):
    ends_now = "#!/bin/sh\ndate +%Y-%m-%dT%H:%M:%S\n"
    kill_wait = 'case "$*" in "show config") echo "KillWait                = 10 sec";; esac\n'
    status, out = _signal_one_node_script(stand_ins, signal.SIGTERM, squeue=ends_now, scontrol=kill_wait,
                                          on_usr1="echo ranks got USR1; sleep 3; echo ranks exit; exit 9")
    assert status == 9 and "requeue" not in out, out


def test_the_script_given_arguments_runs_them(stand_ins):
    out = batch("one_node.sbatch", stand_ins, "srun")
    assert "--epochs 30" in out
    python = stand_ins / "venv" / "bin" / "python"
    result = submit("one_node.sbatch", stand_ins, "other.py", "--x", "1")
    assert f"srun --mpi=pmix --kill-on-bad-exit=1 {python} other.py --x 1" in result.stdout, result.stdout


@pytest.mark.parametrize("env,sentence", [
    ({"SLURM_NTASKS": "1"}, "needs more tasks than servers (1), so that there is a worker; got 1."),
    ({"SLURM_NTASKS": "3", "HVD_DCASGD_SERVERS": "3"}, "needs more tasks than servers (3), so that there is a worker; got 3."),
    ({"HVD_DCASGD_SERVERS": "two"}, "HVD_DCASGD_SERVERS must be a whole number >= 1, not 'two'."),
    ({"HVD_DCASGD_LAUNCHER": "ssh"}, "HVD_DCASGD_LAUNCHER must be srun or mpirun, not 'ssh'."),
    ({"HVD_DCASGD_VENV": "/nowhere"}, "no Python at /nowhere/bin/python"),
])
def test_bad_settings_say_one_sentence(stand_ins, env, sentence):
    result = submit("multi_node.sbatch", stand_ins, **env)
    assert result.returncode == 1 and f"multi_node.sbatch: {sentence}" in result.stdout, result.stdout

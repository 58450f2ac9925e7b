"""Every branch of the SLURM batch scripts, as a dry run: ``srun`` and
``mpirun`` replaced by stand-ins on PATH that print the command and the
environment they were given, so what the scripts export and start is checked
without a cluster (tests/test_slurm.py submits them to a real one)."""

import os
import stat

import pytest

from conftest import ROOT, run

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


def submit(script, stand_ins, *args, **env):
    """``bash slurm/SCRIPT ARGS`` with the stand-ins first on PATH, in a
    3-task allocation unless ``env`` says otherwise; the scripts' own
    defaults, not this machine's MPI settings."""
    env = {"PATH": f"{stand_ins / 'bin'}{os.pathsep}{os.environ['PATH']}", "HVD_DCASGD_LAUNCHER": "srun",
           "HVD_DCASGD_REPO": str(ROOT), "HVD_DCASGD_VENV": str(stand_ins / "venv"), "SLURM_NTASKS": "3",
           **dict.fromkeys(("OMPI_MCA_osc", "OMPI_MCA_btl", "OMPI_MCA_pml", "HVD_DCASGD_HOROVOD", "OMP_NUM_THREADS"),
                           ""),
           **env}
    return run(["bash", ROOT / "slurm" / script, *args], env=env, timeout=30)


def batch(script, stand_ins, launcher, **extra):
    """A successful dry run of SCRIPT as a 5-task, 2-node job with 2 CPUs per task; what it printed."""
    result = submit(script, stand_ins, HVD_DCASGD_LAUNCHER=launcher, SLURM_NTASKS="5", SLURM_JOB_NUM_NODES="2",
                    SLURM_JOB_NODELIST="node[1-2]", SLURM_CPUS_PER_TASK="2", **extra)
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
    # two GPUs per task: local rank 0 gets the node's first two, rank 1 the next two
    assert "rank 0 sees GPUs '0,1'" in out and "rank 1 sees GPUs '2,3'" in out, out


@pytest.mark.parametrize("script", ["one_node.sbatch", "multi_node.sbatch"])
def test_mpirun_branch_without_gpus_starts_the_script_as_it_is(stand_ins, script):
    out = batch(script, stand_ins, "mpirun")
    python = stand_ins / "venv" / "bin" / "python"
    assert f"-np 5 {python} examples/train_digits.py --epochs 30" in out and "bind-gpus" not in out, out
    assert "rank 0 sees GPUs '0,1,2,3'" in out, "no binding without a GPU request"


def test_the_script_given_arguments_runs_them(stand_ins):
    out = batch("one_node.sbatch", stand_ins, "srun")
    assert "--epochs 30" in out
    python = stand_ins / "venv" / "bin" / "python"
    result = submit("one_node.sbatch", stand_ins, "other.py", "--x", "1")
    assert f"srun --mpi=pmix --kill-on-bad-exit=1 {python} other.py --x 1" in result.stdout, result.stdout


@pytest.mark.parametrize("env,sentence", [
    ({"SLURM_NTASKS": "1"}, "needs at least 2 tasks (a server and a worker), got 1."),
    ({"HVD_DCASGD_LAUNCHER": "ssh"}, "HVD_DCASGD_LAUNCHER must be srun or mpirun, not 'ssh'."),
    ({"HVD_DCASGD_VENV": "/nowhere"}, "no Python at /nowhere/bin/python"),
])
def test_bad_settings_say_one_sentence(stand_ins, env, sentence):
    result = submit("multi_node.sbatch", stand_ins, **env)
    assert result.returncode == 1 and f"multi_node.sbatch: {sentence}" in result.stdout, result.stdout

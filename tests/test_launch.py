"""hvd-dcasgd-run: real runs through the real mpirun (training, GPU pinning, exit
status, dry run, clear errors), and the command built for each MPI and layout."""

import json
import re
import shlex
import shutil
import sys
import pytest

from helpers import ROOT, run

from hvd_dcasgd.launcher import command, launch, rank
from hvd_dcasgd.launcher.command import MPICH, OPEN_MPI
from hvd_dcasgd.launcher.probe import Machine
from hvd_dcasgd.launcher.rank import LaunchError

LAUNCHER = ROOT / "launch" / "hvd-dcasgd-run"
PY = "/opt/python"
SCRIPT = "train.py"
RANK_PROGRAM = """\
import os, sys
line = f"rank {os.environ['OMPI_COMM_WORLD_RANK']} gpu {os.environ.get('CUDA_VISIBLE_DEVICES')!r} args {sys.argv[1:]}"
os.write(1, (line + "\\n").encode())  # one write per rank, so lines from different ranks do not interleave
sys.exit(int(os.environ.get("EXIT_STATUS", "0")))
"""


def hvd_dcasgd_run(*args, env=None, timeout=180):
    """The checkout's launcher, under this interpreter."""
    return run([sys.executable, str(LAUNCHER), *map(str, args)], env=env, timeout=timeout)


def options(*argv):
    """Parsed command-line options, as build() gets them."""
    return launch.parser().parse_args([*argv, "--python", PY, SCRIPT, "--epochs", "5"])


def rank_program(tmp_path):
    program = tmp_path / "ranks.py"
    program.write_text(RANK_PROGRAM)
    return program


# Real runs through the real mpirun.

@pytest.mark.mpi
@pytest.mark.slow
def test_trains_the_digits_example_with_two_workers():
    result = hvd_dcasgd_run("-n", 2, "examples/train_digits.py", "--epochs", 2, timeout=300)
    assert result.returncode == 0, result.stdout
    assert re.search(r"final test accuracy \d\.\d+ \(compensation adaptive, lambda_0 8, bound 1, [^)]*2 workers", result.stdout), result.stdout


@pytest.mark.mpi
@pytest.mark.slow
def test_trains_the_digits_example_on_two_servers():
    result = hvd_dcasgd_run("-n", 2, "--servers", 2, "examples/train_digits.py", "--epochs", 1, timeout=300)
    assert result.returncode == 0, result.stdout
    assert re.search(r"final test accuracy \d\.\d+ \(compensation adaptive, lambda_0 8, bound 1, [^)]*2 workers", result.stdout), result.stdout
    assert "hvd_dcasgd server 1: " in result.stdout and "hvd_dcasgd servers (all 2): " in result.stdout


@pytest.mark.parametrize("gpus, expected", [
    # server on 4, workers over 5 and 6, each GPU at the index of hvd.local_rank() (0, 1, 2 for the workers)
    ("4,5,6", {"0": "'4,5,6'", "1": "'5,6,4'", "2": "'5,6,4'", "3": "'6,4,5'"}),
    ("7", {"0": "'7'", "1": "'7'", "2": "'7'", "3": "'7'"}),      # one GPU: every rank shares it
    ("none", {"0": "''", "1": "''", "2": "''", "3": "''"}),        # CPU only
])
@pytest.mark.mpi
def test_each_rank_gets_its_gpu_and_the_script_its_arguments(tmp_path, gpus, expected):
    result = hvd_dcasgd_run("-n", 3, "--gpus", gpus, "--verbose", rank_program(tmp_path), "-n", 9, "--flag")
    assert result.returncode == 0, result.stdout
    seen = dict(re.findall(r"^rank (\d) gpu ('[\d,]*'|None) args \['-n', '9', '--flag'\]$", result.stdout, re.M))
    assert seen == expected, result.stdout
    assert "hvd-dcasgd-run: " + shlex.quote(shutil.which("mpirun")) + " " in result.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("workers, servers", [(3, 1), (5, 1), (3, 2)])
def test_set_device_of_local_rank_selects_the_pinned_gpu(workers, servers):
    """Horovod's ``torch.cuda.set_device(hvd.local_rank())``, unchanged: in the list each rank sees (four
    stand-in GPU ids, no CUDA needed), the entry at ``hvd.local_rank()`` -- or at its remainder by the length
    of the list, where a node has more workers than GPUs -- is the GPU the launcher pinned it to."""
    gpus = ["0", "1", "2", "3"]
    result = hvd_dcasgd_run("-n", workers, "--servers", servers, "--gpus", ",".join(gpus),
                            ROOT / "tests" / "programs" / "pinning.py")
    assert result.returncode == 0, result.stdout
    # each rank prints one JSON object; mpirun may join two ranks' output on one line
    ranks = [json.loads(found) for found in re.findall(r"\{[^{}]*\}", result.stdout)]
    assert sorted(r["world_rank"] for r in ranks) == list(range(workers + servers)), result.stdout
    for r in ranks:
        visible = r["visible"].split(",")
        assert r["server"] == (r["world_rank"] < servers)
        assert visible[r["local_rank"] % len(visible)] == rank.gpu_for_rank(r["world_rank"], r["world_rank"], gpus), r
        assert len(visible) == (1 if r["local_rank"] >= len(gpus) else len(gpus)), r


@pytest.mark.mpi
def test_exit_status_is_the_jobs(tmp_path):
    result = hvd_dcasgd_run("-n", 1, rank_program(tmp_path), env={"EXIT_STATUS": "3"})
    assert result.returncode == 3, result.stdout


def test_dry_run_prints_the_command_and_runs_nothing(tmp_path):
    program = tmp_path / "marks.py"
    program.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    result = hvd_dcasgd_run("-n", 4, "--dry-run", program, "--epochs", 5)
    assert result.returncode == 0, result.stdout
    command = shlex.split(result.stdout.strip().splitlines()[-1])
    assert command[0] == shutil.which("mpirun")
    assert command[command.index("-np") + 1] == "5"
    assert command[-4:] == [sys.executable, str(program), "--epochs", "5"]
    assert not (tmp_path / "ran").exists()


def test_detects_mpich_by_its_version_text(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'HYDRA build details:'\necho '    Version: 4.1.2'\n")
    fake.chmod(0o755)
    result = hvd_dcasgd_run("-n", 2, "--dry-run", "examples/train_digits.py", env={"PATH": str(tmp_path)})
    assert result.returncode == 0, result.stdout
    command = shlex.split(result.stdout.strip().splitlines()[-1])
    assert command[:3] == [str(fake), "-n", "3"]
    assert command[3:6] == ["-genv", "MPIR_CVAR_ASYNC_PROGRESS", "1"]


# Clear errors: one sentence, status 2, no traceback.

@pytest.mark.parametrize("args, env, sentence", [
    (("-n", 2, "missing.py"), {}, "hvd-dcasgd-run: the training script missing.py does not exist."),
    (("-n", 0, "examples/train_digits.py"), {}, "hvd-dcasgd-run: -n/--workers must be at least 1 (got 0)."),
    (("-n", 2, "examples/train_digits.py"), "empty PATH",
     "hvd-dcasgd-run: no MPI launcher (mpirun or mpiexec) is on PATH; install Open MPI "
     "(Debian: `apt-get install openmpi-bin libopenmpi-dev`) or MPICH."),
    (("-n", 2, "--hosts", "a:0", "examples/train_digits.py"), {},
     "hvd-dcasgd-run: 'a:0' in --hosts is not host or host:slots with slots a positive number."),
    (("-n", 2, "--gpus", "0,,1", "examples/train_digits.py"), {},
     "hvd-dcasgd-run: --gpus '0,,1' is not auto, none, or a list of GPU ids such as 0,1,2."),
])
def test_bad_launch_says_one_sentence_and_exits_2(tmp_path, args, env, sentence):
    result = hvd_dcasgd_run(*args, env={"PATH": str(tmp_path)} if env == "empty PATH" else env)
    assert result.returncode == 2, result.stdout
    assert result.stdout.strip() == sentence


def test_a_launcher_of_another_mpi_is_refused(tmp_path):
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'some other launcher 1.0'\n")
    fake.chmod(0o755)
    result = hvd_dcasgd_run("-n", 2, "--mpirun", fake, "examples/train_digits.py")
    assert result.returncode == 2, result.stdout
    assert result.stdout.startswith(f"hvd-dcasgd-run: {fake} is neither Open MPI's nor MPICH's launcher"), result.stdout
    assert "Traceback" not in result.stdout


def test_rank_step_outside_an_mpi_job_says_so(tmp_path):
    result = run([sys.executable, str(ROOT / "hvd_dcasgd" / "launcher" / "rank.py"), "--rank-exec", "0,1", "x.py"],
                 env={name: "" for name in rank.WORLD_RANK_VARIABLES + rank.LOCAL_RANK_VARIABLES})
    assert result.returncode == 2, result.stdout
    assert result.stdout.startswith("hvd-dcasgd-run: --rank-exec runs inside an MPI job, but none of"), result.stdout


# The command built for each MPI and layout (no MPI started).

def test_open_mpi_one_node_as_root_with_more_ranks_than_cores():
    plan = command.build(options("-n", "4"), Machine(OPEN_MPI, "mpirun", is_root=True, cores=2), {})
    assert plan.command == ["mpirun", "--allow-run-as-root", "-np", "5", "--oversubscribe", "--mca", "osc", "sm",
                            PY, SCRIPT, "--epochs", "5"]
    assert plan.notes == []


def test_open_mpi_one_node_not_root_with_enough_cores():
    plan = command.build(options("-n", "4"), Machine(OPEN_MPI, "mpirun", is_root=False, cores=8), {})
    assert plan.command == ["mpirun", "-np", "5", "--mca", "osc", "sm", PY, SCRIPT, "--epochs", "5"]
    forced = command.build(options("-n", "4", "--oversubscribe"), Machine(OPEN_MPI, "mpirun", cores=8), {})
    assert "--oversubscribe" in forced.command


def test_open_mpi_passes_the_projects_variables_and_pythonpath_only():
    environ = {"HVD_DCASGD_COMPENSATION": "none", "PYTHONPATH": "/src", "HOME": "/root"}
    plan = command.build(options("-n", "1"), Machine(OPEN_MPI, "mpirun", cores=8), environ)
    assert plan.command == ["mpirun", "-np", "2", "--mca", "osc", "sm",
                            "-x", "HVD_DCASGD_COMPENSATION", "-x", "PYTHONPATH", PY, SCRIPT, "--epochs", "5"]


def test_open_mpi_several_nodes_over_tcp_uses_pt2pt_at_thread_level_serialized():
    plan = command.build(options("-n", "8", "-H", "a:4,b:5"), Machine(OPEN_MPI, "mpirun", cores=2), {})
    assert plan.command == ["mpirun", "-np", "9", "--host", "a:4,b:5",
                            "--mca", "pml", "ob1", "--mca", "btl", "tcp,vader,self", "--mca", "osc", "pt2pt",
                            "-x", "HVD_DCASGD_THREAD_LEVEL=serialized", "-x", "HVD_DCASGD_HOROVOD=0",
                            PY, SCRIPT, "--epochs", "5"]
    assert plan.notes == [command.PT2PT_NOTE]


def test_open_mpi_several_nodes_with_rdma_uses_ucx():
    plan = command.build(options("-n", "8", "-H", "a:4,b:5"), Machine(OPEN_MPI, "mpirun", ucx_rdma=True), {})
    assert plan.command[plan.command.index("--host") + 2:] == ["--mca", "pml", "ucx", "--mca", "osc", "ucx",
                                                               PY, SCRIPT, "--epochs", "5"]
    assert plan.notes == []


def test_several_servers_are_more_ranks_told_to_every_rank_and_spread_over_hosts():
    machine = Machine(OPEN_MPI, "mpirun", cores=8)
    plan = command.build(options("-n", "4", "--servers", "2"), machine, {})
    assert plan.command == ["mpirun", "-np", "6", "--mca", "osc", "sm", "-x", "HVD_DCASGD_SERVERS=2",
                            PY, SCRIPT, "--epochs", "5"]
    plan = command.build(options("-n", "4"), machine, {"HVD_DCASGD_SERVERS": "3"})  # the caller's own value
    assert plan.command == ["mpirun", "-np", "7", "--mca", "osc", "sm", "-x", "HVD_DCASGD_SERVERS",
                            PY, SCRIPT, "--epochs", "5"]
    plan = command.build(options("-n", "4", "--servers", "2", "-H", "a:3,b:3"), Machine(OPEN_MPI, "mpirun", ucx_rdma=True), {})
    assert plan.command[:7] == ["mpirun", "-np", "6", "--host", "a:3,b:3", "--map-by", "node"]
    mpich = command.build(options("-n", "4", "--servers", "2", "-H", "a:3,b:3"), Machine(MPICH, "mpiexec"), {})
    assert mpich.command == ["mpiexec", "-n", "6", "-hosts", "a:3,b:3", "-ppn", "1", "-genv",
                             "MPIR_CVAR_ASYNC_PROGRESS", "1", "-genv", "HVD_DCASGD_SERVERS", "2", PY, SCRIPT,
                             "--epochs", "5"]
    with pytest.raises(LaunchError, match="--servers must be at least 1"):
        command.build(options("-n", "4", "--servers", "0"), machine, {})


def test_open_mpi_hostfile_is_passed_as_is(tmp_path):
    several, one = tmp_path / "several", tmp_path / "one"
    several.write_text("# cluster\nnode1 slots=4\nnode2 slots=4 max_slots=8  # second\n")
    one.write_text("node1 slots=8\n")
    plan = command.build(options("-n", "6", "--hostfile", str(several)), Machine(OPEN_MPI, "mpirun"), {})
    assert plan.command[:6] == ["mpirun", "-np", "7", "--hostfile", str(several), "--mca"]
    assert "pt2pt" in plan.command and "--oversubscribe" not in plan.command
    plan = command.build(options("-n", "6", "--hostfile", str(one)), Machine(OPEN_MPI, "mpirun"), {})
    assert plan.command[3:8] == ["--hostfile", str(one), "--mca", "osc", "sm"]


def test_a_hostfile_in_the_other_mpis_syntax_is_refused(tmp_path):
    mpich_style, open_mpi_style = tmp_path / "mpich", tmp_path / "ompi"
    mpich_style.write_text("node1:4\n")
    open_mpi_style.write_text("node1 slots=4\n")
    with pytest.raises(LaunchError, match=r"line 1 uses MPICH's `host:N`; Open MPI's hostfile wants `node1 slots=4`"):
        command.build(options("-n", "2", "--hostfile", str(mpich_style)), Machine(OPEN_MPI, "mpirun"), {})
    with pytest.raises(LaunchError, match=r"line 1 uses Open MPI's `slots=`; MPICH's hostfile wants `node1:4`"):
        command.build(options("-n", "2", "--hostfile", str(open_mpi_style)), Machine(MPICH, "mpiexec"), {})


def test_user_choice_of_one_sided_component_wins():
    tcp = options("-n", "2", "--mpi-arg=--mca btl tcp,self --mca osc pt2pt")
    plan = command.build(tcp, Machine(OPEN_MPI, "mpirun", cores=8), {"HVD_DCASGD_THREAD_LEVEL": "funneled"})
    assert plan.command == ["mpirun", "-np", "3", "-x", "HVD_DCASGD_THREAD_LEVEL", "-x", "HVD_DCASGD_HOROVOD=0",
                            "--mca", "btl", "tcp,self", "--mca", "osc", "pt2pt", PY, SCRIPT, "--epochs", "5"]
    plan = command.build(options("-n", "2"), Machine(OPEN_MPI, "mpirun", cores=8), {"OMPI_MCA_osc": "rdma"})
    assert plan.command == ["mpirun", "-np", "3", PY, SCRIPT, "--epochs", "5"]


def test_mpich_gets_asynchronous_progress_and_its_own_options(tmp_path):
    environ = {"HVD_DCASGD_COMPENSATION": "none", "PYTHONPATH": "/src", "HOME": "/root"}
    machine = Machine(MPICH, "mpiexec", is_root=True, cores=1)
    plan = command.build(options("-n", "4"), machine, environ)
    assert plan.command == ["mpiexec", "-n", "5", "-genv", "MPIR_CVAR_ASYNC_PROGRESS", "1",
                            "-genvlist", "HVD_DCASGD_COMPENSATION,PYTHONPATH", PY, SCRIPT, "--epochs", "5"]
    plan = command.build(options("-n", "4", "-H", "a:2,b:3"), machine, {})
    assert plan.command[:5] == ["mpiexec", "-n", "5", "-hosts", "a:2,b:3"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a:2\nb:3\n")
    plan = command.build(options("-n", "4", "--hostfile", str(hostfile)), machine, {"MPIR_CVAR_ASYNC_PROGRESS": "0"})
    assert plan.command == ["mpiexec", "-n", "5", "-f", str(hostfile), PY, SCRIPT, "--epochs", "5"]


@pytest.mark.parametrize("flag, found, pinned", [
    ("auto", ("0", "1"), "0,1"),
    ("auto", (), None),
    ("none", ("0", "1"), "none"),
    ("2,3", (), "2,3"),
])
def test_gpu_pinning_goes_through_the_rank_step_only_when_there_is_something_to_set(flag, found, pinned):
    plan = command.build(options("-n", "2", "--gpus", flag), Machine(OPEN_MPI, "mpirun", cores=8, gpus=found), {})
    tail = [SCRIPT, "--epochs", "5"]
    if pinned is None:
        assert plan.command[-4:] == [PY, *tail]
    else:
        assert plan.command[-7:] == [PY, str(ROOT / "hvd_dcasgd" / "launcher" / "rank.py"), "--rank-exec", pinned, *tail]


def test_gpu_for_each_rank():
    gpus = ["0", "1", "2", "3"]
    server_node = [rank.gpu_for_rank(r, r, gpus) for r in range(6)]
    assert server_node == ["0", "1", "2", "3", "1", "2"]
    other_node = [rank.gpu_for_rank(6 + local, local, gpus) for local in range(5)]
    assert other_node == ["0", "1", "2", "3", "0"]
    assert {rank.gpu_for_rank(r, r % 2, ["5"]) for r in range(4)} == {"5"}


def test_everything_after_the_script_goes_to_the_script():
    args = launch.parser().parse_args(["-n", "2", "train.py", "-n", "3", "--dry-run", "--", "x"])
    assert (args.workers, args.dry_run, args.script, args.script_args) == (2, False, "train.py",
                                                                           ["-n", "3", "--dry-run", "--", "x"])


# Each rank sees the list turned so that its own GPU stands at the index of its hvd.local_rank().
@pytest.mark.parametrize("env, expected", [
    ({"PMI_RANK": "0", "MPI_LOCALRANKID": "0"}, "'4,5,6'"),   # MPICH's Hydra: the server, GPU 4 at 0
    ({"PMI_RANK": "2", "MPI_LOCALRANKID": "2"}, "'5,6,4'"),   # the server node's worker 1: GPU 6 at 1
    ({"PMI_RANK": "5", "MPI_LOCALRANKID": "1"}, "'4,5,6'"),   # another node's worker 1: GPU 5 at 1
    ({"PMIX_RANK": "3", "SLURM_LOCALID": "0"}, "'4,5,6'"),    # srun --mpi=pmix, another node's worker 0: GPU 4
])
def test_the_rank_step_reads_mpich_and_slurm_rank_variables(tmp_path, env, expected):
    program = tmp_path / "gpu.py"
    program.write_text("import os; print('gpu', repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n")
    blank = {name: "" for name in rank.WORLD_RANK_VARIABLES + rank.LOCAL_RANK_VARIABLES}
    result = run([sys.executable, str(ROOT / "hvd_dcasgd" / "launcher" / "rank.py"), "--rank-exec", "4,5,6", program],
                 env={**blank, **env})
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == f"gpu {expected}"

"""hvd-dcasgd-run: real runs through the real mpirun (training, GPU pinning, exit
status, dry run, clear errors), and the command built for each MPI and layout."""

import re
import shlex
import shutil
import sys
import pytest

from helpers import PROGRAMS, ROOT, gpu_placement_problems, mpirun, placed_ranks, run

from hvd_dcasgd.launcher import command, launch
from hvd_dcasgd.launcher.command import MPICH, OPEN_MPI, LaunchError
from hvd_dcasgd.launcher.probe import Machine

LAUNCHER = ROOT / "launch" / "hvd-dcasgd-run"
PY = "/opt/python"
SCRIPT = "train.py"
RANK_PROGRAM = """\
import os, sys
line = f"rank {os.environ['OMPI_COMM_WORLD_RANK']} gpus {os.environ.get('HVD_DCASGD_GPUS')!r} args {sys.argv[1:]}"
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


@pytest.mark.mpi
def test_every_rank_gets_the_gpus_setting_and_the_script_its_arguments(tmp_path):
    result = hvd_dcasgd_run("-n", 3, "--gpus", "4, 5,6", "--verbose", rank_program(tmp_path), "-n", 9, "--flag")
    assert result.returncode == 0, result.stdout
    seen = dict(re.findall(r"^rank (\d) gpus ('[\d,]*'|None) args \['-n', '9', '--flag'\]$", result.stdout, re.M))
    assert seen == {str(r): "'4,5,6'" for r in range(4)}, result.stdout
    assert "hvd-dcasgd-run: " + shlex.quote(shutil.which("mpirun")) + " " in result.stdout


@pytest.mark.parametrize("gpus, expected", [
    # server on 4, workers over 5 and 6, each GPU at the index of hvd.local_rank() (0, 1, 2 for the workers)
    ("4,5,6", ["4,5,6", "5,6,4", "5,6,4", "6,4,5"]),
    ("7", ["7", "7", "7", "7"]),      # one GPU: every rank shares it
    ("none", ["", "", "", ""]),        # CPU only
])
@pytest.mark.mpi
def test_hvd_init_places_each_rank_on_the_gpus_the_launcher_passes(tmp_path, gpus, expected):
    result = hvd_dcasgd_run("-n", 3, "--gpus", gpus, PROGRAMS / "pinning.py", tmp_path,
                            env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.returncode == 0, result.stdout
    assert [r["visible"] for r in placed_ranks(tmp_path, 4)] == expected


@pytest.mark.mpi
@pytest.mark.parametrize("workers, servers, env", [
    (3, 1, {"HVD_DCASGD_GPUS": "0,1,2,3"}),
    (5, 1, {"HVD_DCASGD_GPUS": "0,1,2,3"}),
    (3, 2, {"HVD_DCASGD_GPUS": "0,1,2,3", "HVD_DCASGD_SERVERS": "2"}),
    (4, 2, {"HVD_DCASGD_GPUS": "", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "HVD_DCASGD_SERVERS": "2"}),  # auto
])
def test_plain_mpirun_gets_each_worker_a_gpu_no_server_holds(tmp_path, workers, servers, env):
    """A plain ``mpirun`` (no launcher), one host: in the list each rank sees (four stand-in GPU ids, no CUDA
    needed), the entry at ``hvd.local_rank()`` -- Horovod's ``torch.cuda.set_device(hvd.local_rank())`` --, or
    at its remainder by the list's length where a node has more workers than GPUs, is a GPU no server holds,
    and the workers together use every GPU the servers leave."""
    result = mpirun(workers + servers, PROGRAMS / "pinning.py", tmp_path, env=env)
    assert result.returncode == 0, result.stdout
    ranks = placed_ranks(tmp_path, workers + servers)
    assert [r["server"] for r in ranks] == [r < servers for r in range(workers + servers)]
    assert gpu_placement_problems(ranks, ["0", "1", "2", "3"]) == []
    workers_on = {r["visible"].split(",")[r["local_rank"] % len(r["visible"].split(","))]
                  for r in ranks if not r["server"]}
    assert workers_on == set("0123") - {str(s) for s in range(servers)}


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
     "hvd-dcasgd-run: --gpus '0,,1' is not valid: use auto, none, keep, or GPU ids such as 0,1,2 (numbers or "
     "UUIDs, each once)."),
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


def test_gpus_reach_every_rank_as_hvd_dcasgd_gpus():
    machine = Machine(OPEN_MPI, "mpirun", cores=8)
    tail = [PY, SCRIPT, "--epochs", "5"]
    assert command.build(options("-n", "2"), machine, {}).command[-4:] == tail  # auto: each rank's default
    plan = command.build(options("-n", "2", "--gpus", "2, 3"), machine, {})
    assert plan.command[-6:] == ["-x", "HVD_DCASGD_GPUS=2,3", *tail]
    plan = command.build(options("-n", "2", "--gpus", "None"), machine, {"HVD_DCASGD_GPUS": "keep"})  # --gpus wins
    assert plan.command[-7:] == ["sm", "-x", "HVD_DCASGD_GPUS=none", *tail]
    plan = command.build(options("-n", "2"), machine, {"HVD_DCASGD_GPUS": "keep"})  # the caller's own
    assert plan.command[-6:] == ["-x", "HVD_DCASGD_GPUS", *tail]
    mpich = command.build(options("-n", "2", "--gpus", "keep"), Machine(MPICH, "mpiexec"), {"PYTHONPATH": "/src"})
    assert mpich.command == ["mpiexec", "-n", "3", "-genv", "MPIR_CVAR_ASYNC_PROGRESS", "1", "-genv",
                             "HVD_DCASGD_GPUS", "keep", "-genvlist", "PYTHONPATH", *tail]


def test_everything_after_the_script_goes_to_the_script():
    args = launch.parser().parse_args(["-n", "2", "train.py", "-n", "3", "--dry-run", "--", "x"])
    assert (args.workers, args.dry_run, args.script, args.script_args) == (2, False, "train.py",
                                                                           ["-n", "3", "--dry-run", "--", "x"])

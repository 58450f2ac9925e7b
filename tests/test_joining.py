"""A process of another launch joins a running job (``hvd_dcasgd.protocol.joining``):
real, separate ``mpirun``s that find each other through a real Open MPI
``ompi-server``; the door admits joiners in its own thread while the running
job's main thread goes on calling MPI."""

import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from helpers import PROGRAMS, BackgroundJob, run, unavailable
from hvd_dcasgd.common.process import without_mpi_variables
from hvd_dcasgd.launcher.command import local_command

#: What a job that admits joiners needs: thread level multiple, and a one-sided component that allows it.
ENV = {"HVD_DCASGD_THREAD_LEVEL": "multiple"}
PROGRAM = PROGRAMS / "joining.py"


@pytest.fixture
def name_server(tmp_path):
    """A real ``ompi-server``; the path of the URI file it wrote."""
    if shutil.which("ompi-server") is None:
        unavailable("Open MPI's ompi-server is not installed")
    uri, log = tmp_path / "ompi-server.uri", tmp_path / "ompi-server.log"
    # not this process's MPI variables: a test before may have initialised MPI here, and ompi-server would take
    # them for a job of its own
    env = without_mpi_variables(os.environ)
    with open(log, "w") as output:
        server = subprocess.Popen(["ompi-server", "--no-daemonize", "--report-uri", str(uri)], env=env,
                                  stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not (uri.exists() and uri.read_text().strip()):
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            pytest.fail(f"ompi-server wrote no URI within 20 s:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    yield uri
    server.terminate()
    server.wait(timeout=20)


def _command(uri, *args):
    return local_command(1, [PROGRAM, *args], ("--mca", "pmix_server_uri", f"file:{uri}", "--mca", "osc", "ucx"))


def test_joiners_of_other_launches_are_admitted_one_at_a_time_while_the_job_runs(name_server, tmp_path):
    out = tmp_path / "seen.json"
    running = BackgroundJob(_command(name_server, "running", 3, out), tmp_path / "running.log", env=ENV,
                            timeout=180)
    jobs = [running]
    try:  # a joiner left waiting in MPI spins on a core: every job ends with the test
        running.wait_for("door open")
        port = int(running.text().split("door open 127.0.0.1:")[1].split()[0])
        with socket.create_connection(("127.0.0.1", port)) as stray:  # a connection that is not a joiner
            stray.sendall(b"GET / HTTP/1.0\r\n\r\n")
        jobs += [BackgroundJob(_command(name_server, "joiner", value), tmp_path / f"joiner{value}.log", env=ENV)
                 for value in (11, 22)]  # two at once
        running.wait_for("admitted", count=2)
        jobs.append(BackgroundJob(_command(name_server, "joiner", 33), tmp_path / "joiner33.log", env=ENV))
        for joiner in jobs[1:]:
            assert joiner.wait() == 0, joiner.text()
            assert "joined" in joiner.text(), joiner.text()
        assert running.wait() == 0, running.text()
    finally:
        for job in jobs:
            if job.proc.poll() is None:
                job.kill()
    seen = json.loads(out.read_text())
    admitted, closed = seen[:-1], seen[-1]
    assert sorted(s["value"] for s in admitted) == [11, 22, 33], seen
    assert all(s["size"] == 2 and s["rank"] == 0 for s in admitted), seen
    assert closed["refused"] == 1, seen
    assert "a join door was used after close()" in closed["after close"], seen


def test_a_joiner_with_no_running_job_says_so(name_server):
    result = run(_command(name_server, "late"), env=ENV, timeout=120)
    assert result.returncode == 0, result.stdout
    assert "no running job 't' is published at Open MPI's name server" in result.stdout, result.stdout


def test_a_door_needs_thread_level_multiple(tmp_path):
    code = ("from hvd_dcasgd.protocol.joining import JoinDoor\nfrom hvd_dcasgd.runtime.mpi import load_mpi\n"
            "from hvd_dcasgd.common.errors import HvdDcasgdError\n"
            "try:\n    JoinDoor(load_mpi(), 't', print)\nexcept HvdDcasgdError as exc:\n    print(exc)\n")
    program = tmp_path / "door.py"
    program.write_text(code)
    result = run(local_command(1, [program]), env={"HVD_DCASGD_THREAD_LEVEL": "serialized"}, timeout=120)
    assert "needs MPI's thread level 'multiple'" in result.stdout and "--mca osc ucx" in result.stdout, result.stdout

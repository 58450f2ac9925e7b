"""Shared helpers: run a program under the real ``mpirun``, with a timeout."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_dcasgd.launch import local_command
from hvd_dcasgd.process import run_command

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
TCP = ("--mca", "btl", "tcp,self", "--mca", "osc", "pt2pt")


def run(cmd, env=None, timeout=180):
    """Run ``cmd`` in its own process group, this checkout first on
    PYTHONPATH; a run past ``timeout`` (a hang) fails the test."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    result = run_command(cmd, timeout=timeout, env=full_env, cwd=ROOT)
    if result.timed_out:
        pytest.fail(f"timed out after {timeout} s (a hang): {' '.join(result.args)}\n{result.stdout[-4000:]}")
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, "")


def mpirun(np, program, *args, mca=(), env=None, timeout=180):
    """``mpirun -np np python program args`` (oversubscribed, root allowed),
    built by the launcher's builder."""
    return run(local_command(np, [program, *args], mca), env=env, timeout=timeout)


def python(program, *args, env=None, timeout=180):
    return run([sys.executable, str(program), *map(str, args)], env=env, timeout=timeout)


def unavailable(reason, deliberate=False):
    """A real component the test needs (Horovod, SLURM) could not be had:
    skip, saying why -- except under CI (``CI`` set), whose set-up is there to
    provide it, where the test fails; ``deliberate`` (the set-up was told to
    leave the component out) skips there too."""
    if os.environ.get("CI") and not deliberate:
        pytest.fail(f"{reason} (CI is set: its set-up is supposed to provide this)")
    pytest.skip(reason)


def horovod_installed() -> bool:
    return importlib.util.find_spec("horovod") is not None


@pytest.fixture
def horovod_required():
    """Use with ``@pytest.mark.usefixtures("horovod_required")``."""
    if not horovod_installed():
        unavailable("Horovod is not installed: `bash .ci/setup.sh` builds it",
                    deliberate=os.environ.get("HVD_DCASGD_WITHOUT_HOROVOD") == "1")

"""Shared helpers: run a program under the real ``mpirun``, with a timeout."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    """``mpirun -np np python program args`` (oversubscribed, root allowed)."""
    root = ("--allow-run-as-root",) if os.geteuid() == 0 else ()
    cmd = ["mpirun", *root, "--oversubscribe", "-np", str(np), *mca, sys.executable, str(program), *map(str, args)]
    return run(cmd, env=env, timeout=timeout)


def python(program, *args, env=None, timeout=180):
    return run([sys.executable, str(program), *map(str, args)], env=env, timeout=timeout)

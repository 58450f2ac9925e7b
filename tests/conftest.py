"""Shared helpers: run a program under the real ``mpirun``, with a timeout."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
TCP = ("--mca", "btl", "tcp,self", "--mca", "osc", "pt2pt")


def run(cmd, env=None, timeout=180):
    """Run ``cmd`` in its own process group; kill the group on timeout."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout} s (a hang): {' '.join(map(str, cmd))}\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def mpirun(np, program, *args, mca=(), env=None, timeout=180):
    """``mpirun -np np python program args`` (oversubscribed, root allowed)."""
    root = ("--allow-run-as-root",) if os.geteuid() == 0 else ()
    cmd = ["mpirun", *root, "--oversubscribe", "-np", str(np), *mca, sys.executable, str(program), *map(str, args)]
    return run(cmd, env=env, timeout=timeout)


def python(program, *args, env=None, timeout=180):
    return run([sys.executable, str(program), *map(str, args)], env=env, timeout=timeout)

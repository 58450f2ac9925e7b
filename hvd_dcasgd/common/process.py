"""Running a command that may hang: in its own process group, killed as a
whole on timeout.

``mpirun`` starts daemons and ranks of its own; killing only the process we
started would leave them running (and holding the cores).  The tests, the
benchmarks and the evidence command all run multi-process jobs through
:func:`run_command`, so a hang ends as a timeout, never as a stuck caller.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Union

__all__ = ["CommandResult", "run_command"]


@dataclass(frozen=True)
class CommandResult:
    """What a command did: its status, its output (stdout and stderr
    together) and whether it was killed for running past its timeout."""

    args: Sequence[str]
    returncode: int
    stdout: str
    timed_out: bool = False


def run_command(
    cmd: Sequence[Union[str, os.PathLike]],
    *,
    timeout: float,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Union[str, os.PathLike]] = None,
) -> CommandResult:
    """Run ``cmd`` with ``env`` (the whole environment, default this one's)
    in a new session; on timeout SIGKILL its process group and return what it
    had printed, with ``timed_out`` set and ``returncode`` -9."""
    args = [str(a) for a in cmd]
    proc = subprocess.Popen(args, cwd=cwd, env=None if env is None else dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended between the timeout and the kill
            pass
        out, _ = proc.communicate()
        return CommandResult(args, -signal.SIGKILL, out, timed_out=True)
    return CommandResult(args, proc.returncode, out)


#: What Open MPI puts into an MPI process's environment.
MPI_VARIABLE_PREFIXES = ("OMPI_", "PMIX_", "ORTE_", "OPAL_")


def without_mpi_variables(environ: Mapping[str, str]) -> Dict[str, str]:
    """``environ`` without Open MPI's per-process variables: a tool started
    from an MPI process (``ompi-server``) would take them for a job of its own."""
    return {k: v for k, v in environ.items() if not k.startswith(MPI_VARIABLE_PREFIXES)}

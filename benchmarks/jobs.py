"""How the benchmarks start MPI jobs of this tree: the ``mpirun`` command
line and the environment its ranks get."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # this tree's package, as its ranks get it (child_env)

from hvd_dcasgd.launcher.command import local_command  # noqa: E402  (standard library only: no torch, no MPI)


def mpirun(ranks: int, *args, mca: Sequence[str] = ()) -> List[str]:
    """``mpirun -np ranks [mca] python args`` on this host, oversubscribed (a
    benchmark often runs more ranks than there are cores), built by the
    launcher's builder (:func:`hvd_dcasgd.launcher.command.local_command`)."""
    return local_command(ranks, args, mca)


def child_env(**extra: str) -> Dict[str, str]:
    """This environment with this tree's package first on the path, and ``extra``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def own_env(variables: Dict[str, str], varied: Iterable[str] = ()) -> Dict[str, str]:
    """:func:`child_env` without this package's and Horovod's own variables
    and the settings named in ``varied`` (so that a job has only the settings
    it is given), plus ``variables``."""
    varied = set(varied)
    env = {k: v for k, v in child_env().items() if k not in varied and not k.startswith(("HVD_DCASGD_", "HOROVOD_"))}
    return {**env, **variables}


def horovodrun() -> str:
    """The ``horovodrun`` next to this Python (or on the path); the sentence
    that says how to get it, as the exit, where there is none."""
    found = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    if found is None:
        sys.exit("horovodrun is not installed next to this Python (Horovod: bash .ci/setup.sh)")
    return found

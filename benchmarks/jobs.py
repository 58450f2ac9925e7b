"""How the benchmarks start MPI jobs of this tree: the ``mpirun`` command
line and the environment its ranks get."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parent.parent


def mpirun(ranks: int, *args, mca: Sequence[str] = ()) -> List[str]:
    """``mpirun -np ranks [mca] python args`` on this host, oversubscribed (a
    benchmark often runs more ranks than there are cores), and allowed to run
    as root where it is root."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "--oversubscribe", "-np", str(ranks), *mca, sys.executable, *map(str, args)]


def child_env(**extra: str) -> Dict[str, str]:
    """This environment with this tree's package first on the path, and ``extra``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}

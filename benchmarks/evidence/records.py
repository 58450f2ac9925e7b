"""``evidence.json``: reading and writing it.

The file holds the scale's name, one entry per ``run.py`` session that ran
something (start time, commit, clean tree, command, machine, load,
seconds: what only a live run knows) and
one record per finished run: the fields of its plan entry, ``key``, and its
results, or ``failed`` with the last lines it printed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict

from plan import key_of


def empty(scale: str) -> Dict:
    return {"scale": scale, "sessions": [], "records": []}


def load(path: Path) -> Dict:
    """The evidence in ``path``, every record with its key."""
    data = json.loads(Path(path).read_text())
    return {"scale": data["scale"], "sessions": data.get("sessions", []),
            "records": [{"key": key_of(r), **r} for r in data["records"]]}


def save(path: Path, evidence: Dict) -> None:
    """Write ``evidence`` to ``path`` through a temporary file in the same
    folder, so that a run killed while writing leaves the last complete file."""
    partial = Path(path).with_name(f"{Path(path).name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(evidence, indent=1))
    os.replace(partial, path)


def succeeded(evidence: Dict) -> Dict[str, Dict]:
    """The records that did not fail, by key: the runs done."""
    return {r["key"]: r for r in evidence["records"] if "failed" not in r}

"""The server's checkpoints: the whole training state, written atomically.

A checkpoint is :meth:`.server.ParameterServer.state_dict` -- weights, the
model's buffers, the optimizer's and the compensation's state, every worker's
backup and applied pushes, the update counter, the settings and a format
version -- taken between two updates and saved with ``torch.save`` to a
temporary file that is then renamed (:func:`.files.atomic_write`): a reader
sees the old checkpoint or the new one, never half of one, even if the
server is killed while writing.  Files are named by the update counter
(``checkpoint-000001234.pt``); the last two are kept.  Loading never
unpickles: ``torch.load(..., weights_only=True)``.

With S servers each writes into its own subfolder, ``server-<s>-of-<S>``,
files named by the number of the consistent cut they belong to (every
server writes cut n at the same point of every worker's pushes, see
:mod:`.cuts`); a job resumes from the newest cut every server has.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from .config import resolve
from .errors import HvdDcasgdError
from .files import atomic_write

__all__ = ["Checkpoints", "KEEP"]

#: How many checkpoints stay in the folder.
KEEP = 2
_NAME = re.compile(r"^checkpoint-(\d{9,})\.pt$")


class Checkpoints:
    """The checkpoint folder of one job, and when the next one is due.

    Arguments:
        folder: where checkpoints go (created if missing).
        interval: seconds between periodic checkpoints; 0 for none (only
            at preemption and at the end).
    """

    def __init__(self, folder: str, interval: float = 600.0):
        self.folder = Path(folder)
        self.interval = interval
        self.top = self.folder  # the job's folder (a server's subfolder lies in it)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HvdDcasgdError(f"hvd_dcasgd: cannot use checkpoint folder {folder} ({exc.strerror})") from None
        for leftover in self.folder.glob(".checkpoint-*.tmp"):  # a writer killed before its rename
            leftover.unlink(missing_ok=True)
        self.due = time.monotonic() + interval if interval else None
        self.written = 0
        self.seconds = 0.0  # spent writing

    @classmethod
    def from_settings(cls, folder: Optional[str], shard: int = 0, servers: int = 1) -> Optional["Checkpoints"]:
        """``HVD_DCASGD_CHECKPOINT_DIR`` (or ``folder``) and
        ``HVD_DCASGD_CHECKPOINT_INTERVAL``; ``None`` when no folder is set.
        With several servers, server ``shard``'s subfolder.  A folder that
        holds the checkpoints of another number of servers is refused: they
        could not be resumed from, and starting afresh would lose them."""
        folder = resolve("HVD_DCASGD_CHECKPOINT_DIR", folder)
        if not folder:
            return None
        interval = resolve("HVD_DCASGD_CHECKPOINT_INTERVAL")
        top = Path(folder)
        mine = f"server-{shard}-of-{servers}" if servers > 1 else None
        others = sorted(p.name for p in top.glob("server-*-of-*") if not p.name.endswith(f"-of-{servers}"))
        if top.is_dir() and servers > 1 and any(_NAME.match(p.name) for p in top.iterdir()):
            others.insert(0, "checkpoints of one server")
        if others:
            raise HvdDcasgdError(f"hvd_dcasgd: the checkpoint folder {folder} holds {others[0]}, written by a job "
                                 f"with another number of servers; this one has {servers} (resume with the same "
                                 "number, or use another HVD_DCASGD_CHECKPOINT_DIR)")
        checkpoints = cls(str(top / mine) if mine else folder, interval)
        checkpoints.top = top
        return checkpoints

    def paths(self) -> List[Tuple[int, Path]]:
        """(update, path) of every checkpoint in the folder, oldest first."""
        found = []
        for entry in os.scandir(self.folder):
            match = _NAME.match(entry.name)
            if match and entry.is_file():
                found.append((int(match.group(1)), Path(entry.path)))
        return sorted(found)

    def newest(self, number: Optional[int] = None) -> Optional[Tuple[Path, Dict[str, Any]]]:
        """The newest checkpoint's path and content (with ``number``, that
        checkpoint's), or ``None`` if there is none."""
        paths = self.paths() if number is None else [(n, p) for n, p in self.paths() if n == number]
        if not paths:
            return None
        path = paths[-1][1]
        try:
            return path, torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a damaged or foreign file: say which, never unpickle it
            raise HvdDcasgdError(f"hvd_dcasgd: cannot read checkpoint {path}: {exc}") from None

    def is_due(self) -> bool:
        return self.due is not None and time.monotonic() >= self.due

    def write(self, state: Dict[str, Any], number: Optional[int] = None) -> Path:
        """Save ``state`` as the checkpoint of its update (with ``number``,
        of that cut), atomically; keep the last :data:`KEEP`."""
        started = time.perf_counter()
        path = self.folder / f"checkpoint-{int(state['updates'] if number is None else number):09d}.pt"
        atomic_write(path, lambda out: torch.save(state, out), binary=True)
        for _, old in self.paths()[:-KEEP]:
            old.unlink(missing_ok=True)
        self.written += 1
        self.seconds += time.perf_counter() - started
        if self.interval:
            self.due = time.monotonic() + self.interval
        return path

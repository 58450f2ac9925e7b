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
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from .config import setting
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
    def from_settings(cls, folder: Optional[str]) -> Optional["Checkpoints"]:
        """``HVD_DCASGD_CHECKPOINT_DIR`` (or ``folder``) and
        ``HVD_DCASGD_CHECKPOINT_INTERVAL``; ``None`` when no folder is set."""
        folder = setting("HVD_DCASGD_CHECKPOINT_DIR") or folder
        if not folder:
            return None
        interval = setting("HVD_DCASGD_CHECKPOINT_INTERVAL")
        return cls(folder, 600.0 if interval is None else interval)

    def paths(self) -> List[Tuple[int, Path]]:
        """(update, path) of every checkpoint in the folder, oldest first."""
        found = []
        for entry in os.scandir(self.folder):
            match = _NAME.match(entry.name)
            if match and entry.is_file():
                found.append((int(match.group(1)), Path(entry.path)))
        return sorted(found)

    def newest(self) -> Optional[Tuple[Path, Dict[str, Any]]]:
        """The newest checkpoint's path and content, or ``None`` if there is none."""
        paths = self.paths()
        if not paths:
            return None
        path = paths[-1][1]
        try:
            return path, torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a damaged or foreign file: say which, never unpickle it
            raise HvdDcasgdError(f"hvd_dcasgd: cannot read checkpoint {path}: {exc}") from None

    def is_due(self) -> bool:
        return self.due is not None and time.monotonic() >= self.due

    def write(self, state: Dict[str, Any]) -> Path:
        """Save ``state`` as the checkpoint of its update, atomically; keep the last :data:`KEEP`."""
        started = time.perf_counter()
        path = self.folder / f"checkpoint-{int(state['updates']):09d}.pt"
        atomic_write(path, lambda out: torch.save(state, out), binary=True)
        for _, old in self.paths()[:-KEEP]:
            old.unlink(missing_ok=True)
        self.written += 1
        self.seconds += time.perf_counter() - started
        if self.interval:
            self.due = time.monotonic() + self.interval
        return path

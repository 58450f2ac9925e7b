"""The server's checkpoints: the whole training state, written atomically,
checked when read back.

A checkpoint is :meth:`.server.ParameterServer.state_dict` -- weights, the
model's buffers, the optimizer's and the compensation's state, every worker's
backup and applied pushes, the update counter, the settings and a format
version -- taken between two updates, with the id of the run it belongs to
and a CRC-32 checksum of all of it.  It is saved with ``torch.save`` to a
temporary file that is then renamed (:func:`.files.atomic_write`): a reader
sees the old checkpoint or the new one, never half of one, even if the
server is killed while writing.  Files are named by the update counter
(``checkpoint-000001234.pt``); the last two are kept.  Loading never
unpickles: ``torch.load(..., weights_only=True)``.

Writing never ends training: a write that fails (no space left, quota, an
I/O error) warns, naming the folder and the error, keeps the previous
checkpoints and is tried again at the next interval; weights holding NaN or
Inf are never written over good checkpoints.  The folder is checked when
the job starts (created, writable, room for one more checkpoint) and locked
(:class:`.files.FolderLock`) so that a second job cannot write into it.

Resuming (:func:`open_checkpoints`) takes the newest checkpoint that can be
read and whose content matches its checksum, warning about each one it
skips; files newer than the one resumed from are moved to ``set-aside/``,
so they are never mixed with the ones this job writes.

With S servers each writes into its own subfolder, ``server-<s>-of-<S>``,
files named by the number of the consistent cut they belong to (every
server writes cut n at the same point of every worker's pushes, see
:mod:`.cuts`); a job resumes from the newest cut that every server holds
whole, of the same run and at the same push counts of every worker.
"""

from __future__ import annotations

import atexit
import errno
import os
import re
import shutil
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..common.config import resolve
from ..common.errors import HvdDcasgdError
from ..common.files import FolderInUse, FolderLock, atomic_write
from ..common.log import get_logger
from ..common.tensors import all_finite
from ..runtime.place import OnlyServer, ServerPlace

__all__ = ["Checkpoints", "KEEP", "open_checkpoints", "estimate_bytes", "checksum"]

log = get_logger("checkpoints")

#: How many checkpoints stay in the folder.
KEEP = 2
#: The lock file in a checkpoint folder, and the subfolder for checkpoints never to be resumed from.
LOCK, ASIDE = ".lock", "set-aside"
_NAME = re.compile(r"^checkpoint-(\d{9,})\.pt$")


def _reason(exc: BaseException) -> str:
    """An exception in a few words: an ``OSError`` by its message and code."""
    if isinstance(exc, OSError) and exc.strerror:
        code = errno.errorcode.get(exc.errno or 0)
        return f"{exc.strerror}{f' ({code})' if code else ''}"
    return f"{type(exc).__name__}: {str(exc).split('. ')[0].strip()}"  # torch's first sentence says what


def _crc(value: Any, crc: int) -> int:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        crc = zlib.crc32(f"T{t.dtype}{tuple(value.shape)}".encode(), crc)
        return zlib.crc32(t.view(torch.uint8).numpy(), crc)
    if isinstance(value, dict):
        crc = zlib.crc32(f"D{len(value)}".encode(), crc)
        for key, item in value.items():
            crc = _crc(item, _crc(key, crc))
        return crc
    if isinstance(value, (list, tuple)):
        crc = zlib.crc32(f"L{len(value)}".encode(), crc)
        for item in value:
            crc = _crc(item, crc)
        return crc
    return zlib.crc32(f"V{value!r}".encode(), crc)


def checksum(state: Dict[str, Any]) -> str:
    """CRC-32 (zip's own checksum, several times faster than SHA-256: a
    checkpoint holds up the serving) of everything in ``state`` but its
    ``"checksum"``: every tensor's dtype, shape and bytes, every other
    value's ``repr``, in order."""
    return f"crc32:{_crc({k: v for k, v in state.items() if k != 'checksum'}, 0):08x}"


def estimate_bytes(numel: int, dtype: torch.dtype, num_workers: int,
                   untrained_state: Optional[Dict[str, torch.Tensor]] = None) -> int:
    """The least a checkpoint of a server of ``numel`` parameters takes:
    the weights and one backup per worker, and the model's buffers (the
    optimizer's and the compensation's state come on top)."""
    size = torch.empty((), dtype=dtype).element_size()
    untrained = sum(t.numel() * t.element_size() for t in (untrained_state or {}).values())
    return (1 + num_workers) * numel * size + untrained


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


class Checkpoints:
    """The checkpoint folder of one job, and when the next one is due.

    Opening it creates the folder, checks that a file can be written there
    and that there is room for one more checkpoint, and locks it for this
    job; each check that fails raises a sentence naming the folder.

    Arguments:
        folder: where checkpoints go (created if missing).
        interval: seconds between periodic checkpoints; 0 for none (only
            at preemption and at the end).
        needs: bytes one checkpoint takes, at least (:func:`estimate_bytes`);
            the newest checkpoint's size if that is more.
    """

    def __init__(self, folder: str, interval: float = 600.0, needs: int = 0):
        self.folder = Path(folder)
        self.interval = interval
        self.top = self.folder  # the job's folder (a server's subfolder lies in it)
        self.run: Optional[str] = None  # the id of the run, set when the job resumes or starts afresh
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(dir=self.folder, prefix=".probe.", suffix=".tmp")
            try:
                os.write(handle, b"hvd_dcasgd")
                os.fsync(handle)
            finally:
                os.close(handle)
                os.unlink(probe)
        except OSError as exc:
            why = "it is a file, not a folder" if self.folder.exists() and not self.folder.is_dir() else \
                f"cannot write there ({_reason(exc)})"
            raise HvdDcasgdError(f"hvd_dcasgd: cannot use checkpoint folder {folder}: {why}; give "
                                 "HVD_DCASGD_CHECKPOINT_DIR a folder this job can write in") from None
        self.lock = FolderLock(self.folder / LOCK)
        try:
            self.lock.acquire()
        except FolderInUse as exc:
            holder = exc.holder
            raise HvdDcasgdError(
                f"hvd_dcasgd: the checkpoint folder {folder} is in use by another job (process "
                f"{holder.get('pid', '?')} on host {holder.get('host', '?')}, lock file {exc.path}); give this job "
                "another HVD_DCASGD_CHECKPOINT_DIR, or, if that job is gone, remove the lock file") from None
        atexit.register(self.close)
        if self.lock.took_over:
            holder = self.lock.took_over
            log.warning(f"hvd_dcasgd: the checkpoint folder {folder} was locked by process {holder.get('pid')} on "
                        f"host {holder.get('host')}, which is gone; this job took it over")
        for leftover in self.folder.glob(".checkpoint-*.tmp"):  # a writer killed before its rename
            leftover.unlink(missing_ok=True)
        paths = self.paths()
        needs = max([needs] + [p.stat().st_size for _, p in paths[-1:]])
        free = shutil.disk_usage(self.folder).free
        if free < needs:
            self.close()
            raise HvdDcasgdError(f"hvd_dcasgd: the checkpoint folder {folder} has {_megabytes(free)} free, and one "
                                 f"checkpoint takes at least {_megabytes(needs)}; free some space or give "
                                 "HVD_DCASGD_CHECKPOINT_DIR a larger disk")
        self.due = time.monotonic() + interval if interval else None
        self.written = 0
        self.seconds = 0.0  # spent writing

    @classmethod
    def from_settings(cls, folder: Optional[str], place: ServerPlace = OnlyServer(),
                      needs: int = 0) -> Optional["Checkpoints"]:
        """``HVD_DCASGD_CHECKPOINT_DIR`` (or ``folder``) and
        ``HVD_DCASGD_CHECKPOINT_INTERVAL``; ``None`` when no folder is set.
        The server's own subfolder where its place has one (one of several
        servers).  A folder that holds the checkpoints of another number of
        servers is refused: they could not be resumed from, and starting
        afresh would lose them."""
        folder = resolve("HVD_DCASGD_CHECKPOINT_DIR", folder)
        if not folder:
            return None
        interval = resolve("HVD_DCASGD_CHECKPOINT_INTERVAL")
        top = Path(folder)
        mine = place.checkpoint_folder
        others = sorted(p.name for p in top.glob("server-*-of-*") if not p.name.endswith(f"-of-{place.count}"))
        if top.is_dir() and mine is not None and any(_NAME.match(p.name) for p in top.iterdir()):
            others.insert(0, "checkpoints of one server")
        if others:
            raise HvdDcasgdError(f"hvd_dcasgd: the checkpoint folder {folder} holds {others[0]}, written by a job "
                                 f"with another number of servers; this one has {place.count} (resume with the "
                                 "same number, or use another HVD_DCASGD_CHECKPOINT_DIR)")
        if mine is not None:  # a job of one server locks the folder itself
            lock = FolderLock(top / LOCK)
            holder = lock.holder()
            if holder is not None and (not holder or not lock.stale(holder)):
                raise HvdDcasgdError(f"hvd_dcasgd: the checkpoint folder {folder} is in use by a job of one "
                                     f"server (process {holder.get('pid', '?')} on host {holder.get('host', '?')}, "
                                     f"lock file {lock.path}); give this job another HVD_DCASGD_CHECKPOINT_DIR")
        checkpoints = cls(str(top / mine) if mine else folder, interval, needs)
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

    @staticmethod
    def read(path: Path, verify: bool = True) -> Dict[str, Any]:
        """A checkpoint's content, never unpickled (``weights_only``), its
        tensors mapped from the file; with ``verify``, checked against its
        checksum.  Raises ``ValueError`` saying what is wrong."""
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # a damaged or foreign file: say which, never unpickle it
            raise ValueError(f"it cannot be read ({_reason(exc)})") from None
        if not isinstance(state, dict):
            raise ValueError(f"it holds a {type(state).__name__}, not a server's state")
        if verify and "checksum" in state:  # written without one: before checksums were
            try:
                ok = checksum(state) == state["checksum"]
            except Exception as exc:  # a file mapped but short of its data
                raise ValueError(f"it cannot be read ({_reason(exc)})") from None
            if not ok:
                raise ValueError("its content does not match the checksum stored with it")
        return state

    def set_aside(self, path: Path, why: str) -> None:
        """Move ``path`` into ``set-aside/`` (never read from there), warning."""
        aside = self.folder / ASIDE
        target, n = aside / path.name, 0
        try:
            aside.mkdir(exist_ok=True)
            while target.exists():
                n += 1
                target = aside / f"{path.name}.{n}"
            os.replace(path, target)
        except OSError as exc:  # it stays; a warning says so (the servers go on in step)
            log.warning(f"hvd_dcasgd: checkpoint {path} {why}; it could not be moved to {aside} "
                        f"({_reason(exc)})")
            return
        log.warning(f"hvd_dcasgd: checkpoint {path} {why}: moved to {target}")

    def is_due(self) -> bool:
        return self.due is not None and time.monotonic() >= self.due

    def write(self, state: Dict[str, Any], number: Optional[int] = None) -> Optional[Path]:
        """Save ``state`` as the checkpoint of its update (with ``number``,
        of that cut), atomically; keep the last :data:`KEEP`.  Weights
        holding NaN or Inf are not written, and a write that fails leaves
        the folder as it was: either warns, naming the folder and why, and
        returns ``None``; the next checkpoint is due an interval later."""
        started = time.perf_counter()
        path = self.folder / f"checkpoint-{int(state['updates'] if number is None else number):09d}.pt"
        kept = ", ".join(p.name for _, p in self.paths()) or "none"
        retry = f"the next is due in {self.interval:g} s" if self.interval else "none is due before the end"
        try:
            if not all_finite(state["weights"]):
                log.warning(f"hvd_dcasgd: the server's weights hold NaN or Inf at update {state['updates']}: "
                            f"{path.name} not written in {self.folder}, the checkpoints there are kept ({kept})")
                return None
            state = {**state, "run": self.run}
            state["checksum"] = checksum(state)
            atomic_write(path, lambda out: torch.save(state, out), binary=True)
        except Exception as exc:  # never ends training: the previous checkpoints stay, the next one is tried
            log.warning(f"hvd_dcasgd: could not write checkpoint {path.name} in {self.folder} ({_reason(exc)}); the "
                        f"checkpoints there are kept ({kept}), training goes on and {retry}")
            return None
        finally:
            if self.interval:
                self.due = time.monotonic() + self.interval
            self.seconds += time.perf_counter() - started
        for _, old in self.paths()[:-KEEP]:
            old.unlink(missing_ok=True)
        self.written += 1
        return path

    def close(self) -> None:
        """Release the folder's lock (at the end of the process at the latest)."""
        self.lock.release()


def _survey(checkpoints: Checkpoints) -> List[Tuple[int, Optional[str], Optional[List[int]]]]:
    """(number, run, pushes taken per worker) of every checkpoint that can be
    read, newest first; the ones that cannot are set aside."""
    found = []
    for number, path in reversed(checkpoints.paths()):
        try:
            state = checkpoints.read(path, verify=False)
            taken = [int(a) + int(r) for a, r in zip(state["pushes"], state["refused"])]
            found.append((number, state.get("run"), taken))
        except (ValueError, KeyError, TypeError) as exc:
            checkpoints.set_aside(path, f"is skipped: {exc}" if isinstance(exc, ValueError) else
                                 "is skipped: it is not a server's state")
    return found


def open_checkpoints(folder: Optional[str], place: ServerPlace = OnlyServer(),
                     gather: Callable[[Any], List[Any]] = lambda mine: [mine],
                     needs: int = 0) -> Tuple[Optional[Checkpoints], Optional[Tuple[Path, Dict[str, Any]]],
                                              Optional[int]]:
    """Open this server's checkpoint folder (:meth:`Checkpoints.from_settings`)
    and choose what to resume from: (checkpoints, (path, content) or
    ``None``, the checkpoint's number: with several servers, the cut's).
    ``gather(mine)`` is every server's ``mine``, in the servers' order
    (collective among them: no server loads anything before all of them
    agree).

    The choice is the newest checkpoint (cut) that every server holds, of
    the same run, with the same pushes taken of every worker, and whole:
    readable, and matching its checksum.  Each one skipped is named in a
    warning; files newer than the choice, and damaged ones, are moved to
    ``set-aside/``.  With checkpoints but none to resume from, every server
    raises the same sentence (never a silent fresh start); with none at
    all, the servers start a new run."""
    problem, checkpoints = None, None
    try:
        checkpoints = Checkpoints.from_settings(folder, place, needs)
    except HvdDcasgdError as exc:
        problem = str(exc)
    survey = _survey(checkpoints) if checkpoints is not None else None
    everyone = gather((problem, survey, uuid.uuid4().hex))
    if problem is not None:
        raise HvdDcasgdError(problem)
    for s, (theirs, _, _) in enumerate(everyone):
        if theirs is not None:
            raise HvdDcasgdError(f"hvd_dcasgd: server {s} cannot open its checkpoint folder: {theirs}")
    if checkpoints is None:
        return None, None, None
    surveys = [theirs for _, theirs, _ in everyone]
    numbers = sorted(set.intersection(*(set(n for n, _, _ in s) for s in surveys)), reverse=True)
    where = place.owner
    chosen, found = None, None
    for number in numbers:
        views = [next(v for v in s if v[0] == number) for s in surveys]
        if any(v[1:] != views[0][1:] for v in views):
            if place.speaks_for_all:
                log.warning(f"hvd_dcasgd: the servers' checkpoints of cut {number} in {checkpoints.top} are not of "
                            f"one cut (runs {[v[1] for v in views]}, pushes per worker {[v[2] for v in views]}): "
                            "skipped")
            continue
        path = dict((n, p) for n, p in checkpoints.paths())[number]
        try:
            found = (path, checkpoints.read(path))
        except ValueError as exc:
            checkpoints.set_aside(path, f"is skipped: {exc}")
            found = None
        if all(gather(found is not None)):
            chosen = number
            break
        if found is not None and place.speaks_for_all:
            log.warning(f"hvd_dcasgd: cut {number} is damaged on another server: skipped")
        found = None
    if chosen is None and any(surveys):
        held = {s: [n for n, _, _ in survey] for s, survey in enumerate(surveys)}
        raise HvdDcasgdError(
            f"hvd_dcasgd: none of the checkpoints in {checkpoints.top} can be resumed from"
            + (f" ({held[0]})" if len(held) == 1 else f" together (the servers hold {held})")
            + "; move them away, or use another HVD_DCASGD_CHECKPOINT_DIR, to start afresh")
    for number, path in checkpoints.paths():
        if chosen is not None and number > chosen:
            checkpoints.set_aside(path, f"is newer than the {where}checkpoint resumed from "
                                        f"({found[0].name}): never mixed with this run's")
    checkpoints.run = (found[1].get("run") if found is not None else None) or everyone[0][2]
    return checkpoints, found, chosen

"""Writing files so that a reader never sees half of one; a folder's lock.

The content goes to a temporary file in the target's folder, is flushed to
disk, gets the permissions a plain ``open(path, "w")`` would give (the
user's umask, not the temporary file's 0600), and then replaces the target in
one rename, after which the folder itself is flushed (so the rename survives
a power failure).  A crash leaves the old file or the new one, never a mix.

A :class:`FolderLock` keeps a second job out of a folder in use: a lock file
holding the host, the process and its start time; a lock whose process is
gone (same host) is stale and taken over.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from typing import IO, Any, Callable, Dict, Optional, Union

__all__ = ["atomic_write", "fsync_folder", "FolderLock", "FolderInUse"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_folder(folder: Union[str, os.PathLike]) -> None:
    """Flush ``folder``'s entries (a rename, a new file) to disk."""
    handle = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


class _Keeping:
    """A file whose ``write`` keeps the first ``OSError`` it raised: a writer
    that reports only its own summary (``torch.save``: "unexpected pos")
    loses the cause (no space left, quota, I/O error), this keeps it."""

    def __init__(self, out: IO):
        self.out, self.error = out, None

    def write(self, data: Any) -> int:
        try:
            return self.out.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.out, name)


def atomic_write(path: Union[str, os.PathLike], write: Callable[[IO], None], binary: bool = False) -> None:
    """Call ``write(file)`` on a temporary file, then move it to ``path``.
    A failure removes the temporary file and raises; an ``OSError`` of the
    file's own (no space left, I/O error) is raised as itself even when
    ``write`` turned it into another exception."""
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    out = None
    try:
        with os.fdopen(handle, "wb" if binary else "w") as raw:
            out = _Keeping(raw)
            write(out)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
        fsync_folder(folder)
    except BaseException as exc:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if out is not None and out.error is not None and out.error is not exc:
            raise out.error from None
        raise


def _started(pid: int) -> Optional[str]:
    """When process ``pid`` started (clock ticks since boot, from
    ``/proc``), to tell it from a later process given the same number;
    ``None`` if there is no such process (or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(holder: Dict[str, Any]) -> bool:
    """Whether the holder of a lock made on this host still runs."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    started = _started(pid)
    return started is None or holder.get("started") in (None, started)


class FolderInUse(OSError):
    """The folder's lock is held by a live job; ``holder`` says whose."""

    def __init__(self, path: str, holder: Dict[str, Any]):
        super().__init__(f"{path} is held by process {holder.get('pid')} on host {holder.get('host')}")
        self.path, self.holder = path, holder


class FolderLock:
    """A lock file in a folder, holding this process's host, PID and start
    time (and the SLURM job, if any).

    :meth:`acquire` creates it, or raises :class:`FolderInUse` naming the
    holder.  A lock is *stale*, and taken over, when its holder is gone: on
    this host, its process no longer runs (or its number now belongs to a
    process started later); anywhere, it was an earlier run of this same
    SLURM job (a requeued job keeps its id, and SLURM starts it again only
    once the earlier run is gone).  A lock of a live job, or of another host
    that cannot be checked, is never taken.

    Arguments:
        path: the lock file.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = os.fspath(path)
        self.held = False
        self.took_over: Optional[Dict[str, Any]] = None  # the stale holder replaced, if any

    @staticmethod
    def me() -> Dict[str, Any]:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": _started(os.getpid())}
        if os.environ.get("SLURM_JOB_ID"):
            me["slurm_job"] = os.environ["SLURM_JOB_ID"]
            me["slurm_restart"] = os.environ.get("SLURM_RESTART_COUNT", "0")
        return me

    def holder(self) -> Optional[Dict[str, Any]]:
        """Who holds the lock (``{}`` for a file that cannot be read), or ``None``."""
        try:
            with open(self.path) as f:
                holder = json.load(f)
            return holder if isinstance(holder, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    def stale(self, holder: Dict[str, Any]) -> bool:
        me = self.me()
        if holder.get("slurm_job") and holder.get("slurm_job") == me.get("slurm_job") \
                and holder.get("slurm_restart") != me.get("slurm_restart"):
            return True
        return holder.get("host") == me["host"] and not _alive(holder)

    def acquire(self) -> None:
        me = self.me()
        folder = os.path.dirname(os.path.abspath(self.path))
        for _ in range(3):  # another job may take over the same stale lock at the same moment
            handle, temporary = tempfile.mkstemp(dir=folder, prefix=".lock.", suffix=".tmp")
            try:
                with os.fdopen(handle, "w") as out:
                    json.dump(me, out)
                    out.flush()
                    os.fsync(out.fileno())
                os.chmod(temporary, 0o666 & ~_umask())
                os.link(temporary, self.path)  # created whole, or not at all if it exists
                fsync_folder(folder)
                self.held = True
                return
            except FileExistsError:
                holder = self.holder()
                if holder is None:
                    continue  # released meanwhile
                if not holder or not self.stale(holder):
                    raise FolderInUse(self.path, holder) from None
                os.replace(temporary, self.path)  # stale: ours in its place, in one rename
                fsync_folder(folder)
                if self.holder() == me:  # not replaced in turn by a job taking it over at the same moment
                    self.held, self.took_over = True, holder
                    return
            finally:
                if os.path.exists(temporary):
                    os.unlink(temporary)
        raise FolderInUse(self.path, self.holder() or {})

    def release(self) -> None:
        """Remove the lock if it is still this process's."""
        if self.held and self.holder() == self.me():
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self.held = False

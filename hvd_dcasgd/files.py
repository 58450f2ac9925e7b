"""Writing files so that a reader never sees half of one.

The content goes to a temporary file in the target's folder, is flushed to
disk, gets the permissions a plain ``open(path, "w")`` would give (the
user's umask, not the temporary file's 0600), and then replaces the target in
one rename.  A crash leaves the old file or the new one, never a mix.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, IO, Union

__all__ = ["atomic_write"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Union[str, os.PathLike], write: Callable[[IO], None], binary: bool = False) -> None:
    """Call ``write(file)`` on a temporary file, then move it to ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb" if binary else "w") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise

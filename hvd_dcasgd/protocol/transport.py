"""MPI one-sided (RMA) primitives the parameter-server protocol is built from.

Two windows, both allocated on the owner (rank 0) with ``MPI.Win.Allocate`` so
that Open MPI's fast paths and atomics apply, both opened once with
``Lock_all`` for the whole run (passive target: the owner posts nothing):

* :class:`ControlWords` -- a few int64 words, touched only with atomics
  (``Fetch_and_op`` / ``Accumulate`` / ``Get_accumulate``) followed by a flush,
  so a reader never sees a torn value and a flag is never seen before the data
  it announces;
* :class:`Mailboxes` -- one slot per worker, an *inbox* only that worker writes
  (its gradient) and an *outbox* only the server writes (its weights), so
  writers never overlap.  A whole message is one ``Put`` or one ``Get``.

:class:`Backoff` paces polling loops so that waiting processes leave the CPU to
those that compute, and keep calling into MPI (progress on stacks without
asynchronous progress).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np
import torch

from ..common.errors import HvdDcasgdError

ALIGN = 64


#: MPI 3.1 counts are C ints: a message longer than this goes as several
#: operations, all completed by the one flush that follows them.
MAX_OPERATION_BYTES = 1 << 30


def _pieces(nbytes: int):
    """(start, end) byte ranges of at most MAX_OPERATION_BYTES covering nbytes."""
    return [(s, min(s + MAX_OPERATION_BYTES, nbytes)) for s in range(0, nbytes, MAX_OPERATION_BYTES)] or [(0, 0)]


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


#: Reads given up while under way (the rank is ending): their requests and
#: result buffers, which MPI may still complete and write into.
_abandoned: list = []


class _Freed:
    """Stands in for a freed window: any use is a clear error, not MPI's."""

    def __getattr__(self, name: str) -> Any:
        raise HvdDcasgdError(f"hvd_dcasgd: a window was used after free() (calling {name})")


def free_window(owner: Any) -> None:
    """Unlock and free ``owner.win`` once; afterwards any use of it raises."""
    if isinstance(owner.win, _Freed):
        return
    win, owner.win = owner.win, _Freed()
    win.Unlock_all()
    win.Free()


class Backoff:
    """Sleeps a little longer each time nothing happened, up to ``max_sleep``."""

    def __init__(self, max_sleep: float = 1e-3, spins: int = 20):
        self.max_sleep = max_sleep
        self.spins = spins
        self.idle = 0  # waits since the last reset

    def reset(self) -> None:
        self.idle = 0

    def wait(self) -> None:
        self.idle += 1
        if self.idle <= self.spins:
            time.sleep(0)
        else:
            time.sleep(min(self.max_sleep, 1e-5 * 2 ** min(self.idle - self.spins, 10)))


class ControlWords:
    """``count`` int64 words in ``owner``'s memory, read and written atomically.

    Every operation but :meth:`post_add` is complete when it returns (flushed, or
    its request completed and the memory synchronised), so its effect is
    visible to every other rank (and ordered after any data the caller
    flushed before); a post lands at the latest with the next flush.
    """

    def __init__(self, mpi: Any, comm: Any, count: int, owner: int = 0):
        self._mpi = mpi
        self.owner = owner
        self.count = count
        is_owner = comm.Get_rank() == owner
        self.win = mpi.Win.Allocate(count * 8 if is_owner else 0, 8, mpi.INFO_NULL, comm)
        self.win.Lock_all(mpi.MODE_NOCHECK)
        if is_owner:
            np.frombuffer(self.win.tomemory(), dtype=np.int64)[:] = 0
            self.win.Sync()
        comm.Barrier()
        self._operand = np.zeros(1, dtype=np.int64)
        self._result = np.zeros(1, dtype=np.int64)
        self._zeros = np.zeros(count, dtype=np.int64)  # the operand of load_all's NO_OP
        self._posted: Optional[Tuple[Any, np.ndarray, np.ndarray]] = None  # the post under way, its buffers
        self._pending = np.zeros(1, dtype=np.int64)  # load_meanwhile's result

    def _fetch_and_op(self, index: int, value: int, op: Any) -> int:
        self._operand[0] = value
        self.win.Fetch_and_op(self._operand, self._result, self.owner, index, op)
        self.win.Flush(self.owner)
        return int(self._result[0])

    def load(self, index: int) -> int:
        """Atomically read word ``index``."""
        return self._fetch_and_op(index, 0, self._mpi.NO_OP)

    def load_meanwhile(self, index: int, meanwhile: Callable[[], None]) -> int:
        """Atomically read word ``index``, as :meth:`load`, calling
        ``meanwhile()`` until the value has arrived.  Where one-sided
        operations progress only while their target calls MPI (Open MPI's
        osc/pt2pt over TCP), a read of an owner that is busy or stopped
        waits until it calls MPI again: this rank goes on with ``meanwhile``
        (which may raise to give up, and does not read this window's words
        this way itself) instead of blocking inside MPI."""
        result = self._pending
        request = self.win.Rget_accumulate(self._zeros[:1], result, self.owner, (index, 1), self._mpi.NO_OP)
        if not request.Test():
            backoff = Backoff()
            try:
                while not request.Test():
                    meanwhile()
                    backoff.wait()
            except BaseException:
                _abandoned.append((request, result))  # MPI may still write the result: keep both alive
                self._pending = np.zeros(1, dtype=np.int64)
                raise
        self.win.Sync()  # a memory barrier, as the flush of load is: what the caller reads next comes after
        return int(result[0])

    def post_add(self, index: int, value: int) -> bool:
        """Start an atomic add of ``value`` to word ``index`` and return
        without waiting for it: where one-sided operations progress only
        while their target calls MPI, it lands once the owner calls MPI
        again.  While the previous post is still under way, nothing is
        added and the answer is False (for a word that only has to move,
        the next post carries the news).  The add fetches the old value
        (``Rget_accumulate``): a request that completes has reached the
        owner, where a bare ``Raccumulate`` may complete while still queued
        at this rank."""
        if self._posted is not None:
            if not self._posted[0].Test():
                return False
            self._posted = None
        operand, result = np.array([value], dtype=np.int64), np.zeros(1, dtype=np.int64)
        request = self.win.Rget_accumulate(operand, result, self.owner, (index, 1), self._mpi.SUM)
        self._posted = (request, operand, result)  # the buffers stay alive while MPI may use them
        return True

    def store(self, index: int, value: int) -> None:
        """Atomically write ``value`` into word ``index``."""
        self._fetch_and_op(index, value, self._mpi.REPLACE)

    def add(self, index: int, value: int) -> int:
        """Atomically add ``value`` to word ``index``; return the old value."""
        return self._fetch_and_op(index, value, self._mpi.SUM)

    def load_all(self, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Atomically (element-wise) read every word with one ``Get_accumulate``."""
        out = np.empty(self.count, dtype=np.int64) if out is None else out
        self.win.Get_accumulate(self._zeros, out, self.owner, op=self._mpi.NO_OP)
        self.win.Flush(self.owner)
        return out

    def progress(self) -> None:
        """One turn of MPI's progress engine, so that one-sided operations
        aimed at this rank move on: a probe for a message, which every
        transport answers by making progress (an operation on one's own
        window need not)."""
        self._mpi.COMM_SELF.Iprobe(self._mpi.ANY_SOURCE, self._mpi.ANY_TAG)

    def free(self) -> None:
        """Complete a post under way, close the access epoch and free the
        window (collective); a second call does nothing."""
        if self._posted is not None:
            self._posted[0].Wait()
            self._posted = None
        free_window(self)


class Mailboxes:
    """Per-worker inbox and outbox slots in one window owned by ``owner``.

    Workers address slots by worker index (0-based).  The owner reads inboxes
    and writes outboxes through zero-copy tensors over its window memory.
    """

    def __init__(self, mpi: Any, comm: Any, num_workers: int, inbox_bytes: int, outbox_bytes: int, owner: int = 0):
        self._mpi = mpi
        self.owner = owner
        self.inbox_bytes = inbox_bytes
        self.outbox_bytes = outbox_bytes
        self._outbox_offset = _aligned(inbox_bytes)
        self._slot_bytes = self._outbox_offset + _aligned(outbox_bytes)
        is_owner = comm.Get_rank() == owner
        size = num_workers * self._slot_bytes if is_owner else 0
        self.win = mpi.Win.Allocate(size, 1, mpi.INFO_NULL, comm)
        self._memory = torch.from_numpy(np.frombuffer(self.win.tomemory(), dtype=np.uint8)) if is_owner else None
        self.win.Lock_all(mpi.MODE_NOCHECK)
        comm.Barrier()

    def _inbox_disp(self, worker: int) -> int:
        return worker * self._slot_bytes

    def _outbox_disp(self, worker: int) -> int:
        return worker * self._slot_bytes + self._outbox_offset

    def put_inbox(self, worker: int, message: np.ndarray) -> None:
        """Write ``message`` (bytes) into ``worker``'s inbox; complete on return."""
        self.put_inbox_pieces(worker, [(0, message)])

    def put_inbox_pieces(self, worker: int, pieces: Sequence[Tuple[int, np.ndarray]], flush: bool = True) -> None:
        """Write each ``(offset, bytes)`` of ``pieces`` at that offset of
        ``worker``'s inbox: every ``Put`` issued, then one flush completes
        them all; complete on return (with ``flush=False``, only once
        :meth:`flush` has run)."""
        base = self._inbox_disp(worker)
        for offset, data in pieces:
            for start, end in _pieces(data.nbytes):
                self.win.Put(data[start:end], self.owner, (base + offset + start, end - start, self._mpi.BYTE))
        if flush:
            self.flush()

    def get_outbox(self, worker: int, out: np.ndarray, flush: bool = True) -> None:
        """Read ``worker``'s outbox into ``out`` (bytes); complete on return
        (with ``flush=False``, only once :meth:`flush` has run)."""
        base = self._outbox_disp(worker)
        for start, end in _pieces(out.nbytes):
            self.win.Get(out[start:end], self.owner, (base + start, end - start, self._mpi.BYTE))
        if flush:
            self.flush()

    def flush(self) -> None:
        """Complete every ``Put`` and ``Get`` this rank issued on the window."""
        self.win.Flush(self.owner)

    def inbox(self, worker: int) -> torch.Tensor:
        """The owner's uint8 view of ``worker``'s inbox."""
        start = self._inbox_disp(worker)
        return self._memory[start : start + self.inbox_bytes]

    def outbox(self, worker: int) -> torch.Tensor:
        """The owner's uint8 view of ``worker``'s outbox."""
        start = self._outbox_disp(worker)
        return self._memory[start : start + self.outbox_bytes]

    def sync(self) -> None:
        """Memory barrier between the owner's loads/stores and remote accesses."""
        self.win.Sync()

    def free(self) -> None:
        """Close the access epoch and free the window (collective); a second
        call does nothing."""
        free_window(self)

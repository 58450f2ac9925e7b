"""The smallest parameter-server protocol on MPI one-sided windows: the
reference the end-to-end benchmark measures every mode against.

Rank 0 is the server, ranks 1..W the workers.  A worker's step is: ``Put``
its gradient into its inbox and flush; raise its ``pushed`` word (an atomic
``Accumulate``, flushed); wait until the server's ``replied`` word for it
reaches the step; ``Get`` the weights from its outbox and flush.  The server
reads every ``pushed`` word with one ``Get_accumulate``, and for each worker
that has pushed: ``w -= lr * g`` in numpy, the weights into that worker's
outbox, then its ``replied`` word.  Nothing else: no staleness, no
compensation, no checks, no trace, no optimizer -- what any protocol built
from a Put, a flag and a Get costs on this machine.  The waits use the
package's ``Backoff``, so both sides of the comparison wait alike.

Run it under mpirun (``bench_end_to_end.py --run raw``); the server writes
the same end-of-run figures as the package's (``HVD_DCASGD_SUMMARY``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

PUSHED, REPLIED = 0, 1  # each worker's two control words
LR = 1e-4


def _aligned(nbytes: int, align: int = 64) -> int:
    return (nbytes + align - 1) // align * align


def run(MPI: Any, numel: int, steps: int, backoff: Any) -> None:
    """One job of the raw protocol: ``steps`` pushes per worker of a
    ``numel``-element float32 gradient."""
    comm = MPI.COMM_WORLD
    rank, workers = comm.Get_rank(), comm.Get_size() - 1
    nbytes = numel * 4
    slot = 2 * _aligned(nbytes)  # inbox, then outbox
    server = rank == 0
    data = MPI.Win.Allocate(workers * slot if server else 0, 1, MPI.INFO_NULL, comm)
    flags = MPI.Win.Allocate(2 * workers * 8 if server else 0, 8, MPI.INFO_NULL, comm)
    data.Lock_all(MPI.MODE_NOCHECK)
    flags.Lock_all(MPI.MODE_NOCHECK)
    if server:
        np.frombuffer(flags.tomemory(), dtype=np.int64)[:] = 0
        flags.Sync()
    comm.Barrier()
    if server:
        _serve(MPI, data, flags, workers, numel, slot, steps, backoff)
    else:
        _work(MPI, data, flags, rank - 1, numel, slot, steps, backoff)
    comm.Barrier()
    for win in (data, flags):
        win.Unlock_all()
        win.Free()


def _work(MPI: Any, data: Any, flags: Any, worker: int, numel: int, slot: int, steps: int, backoff: Any) -> None:
    gradient = np.random.default_rng(worker).standard_normal(numel).astype(np.float32) * 1e-3
    weights = np.empty(numel, dtype=np.float32)
    operand, result = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    inbox, outbox = worker * slot, worker * slot + slot // 2
    for step in range(1, steps + 1):
        data.Put(gradient, 0, (inbox, gradient.nbytes, MPI.BYTE))
        data.Flush(0)
        operand[0] = step
        flags.Accumulate(operand, 0, 2 * worker + PUSHED, MPI.REPLACE)
        flags.Flush(0)
        backoff.reset()
        while True:
            flags.Fetch_and_op(operand, result, 0, 2 * worker + REPLIED, MPI.NO_OP)
            flags.Flush(0)
            if result[0] >= step:
                break
            backoff.wait()
        data.Get(weights, 0, (outbox, weights.nbytes, MPI.BYTE))
        data.Flush(0)


def _serve(MPI: Any, data: Any, flags: Any, workers: int, numel: int, slot: int, steps: int, backoff: Any) -> None:
    memory = np.frombuffer(data.tomemory(), dtype=np.uint8)
    inboxes = [memory[m * slot:m * slot + numel * 4].view(np.float32) for m in range(workers)]
    outboxes = [memory[m * slot + slot // 2:m * slot + slot // 2 + numel * 4].view(np.float32) for m in range(workers)]
    weights = np.random.default_rng(1234).standard_normal(numel).astype(np.float32)
    words = np.zeros(2 * workers, dtype=np.int64)
    zeros = np.zeros_like(words)
    operand = np.zeros(1, dtype=np.int64)
    served = [0] * workers
    updates, first, last = 0, None, 0.0
    while min(served) < steps:
        flags.Get_accumulate(zeros, words, 0, op=MPI.NO_OP)
        flags.Flush(0)
        ready = [m for m in range(workers) if words[2 * m + PUSHED] > served[m]]
        if not ready:
            backoff.wait()
            continue
        backoff.reset()
        for m in ready:
            data.Sync()
            weights -= LR * inboxes[m]
            outboxes[m][:] = weights
            data.Sync()
            served[m] = int(words[2 * m + PUSHED])
            operand[0] = served[m]
            flags.Accumulate(operand, 0, 2 * m + REPLIED, MPI.REPLACE)
            flags.Flush(0)
            updates += 1
            last = time.perf_counter()
            first = last if first is None else first
    path = os.environ.get("HVD_DCASGD_SUMMARY")
    if path:
        elapsed = max(last - (first or 0.0), 1e-9)
        with open(path, "w") as f:
            json.dump({"updates": updates, "gradients": updates, "seconds": elapsed,
                       "updates_per_s": updates / elapsed, "gradients_per_s": updates / elapsed}, f)

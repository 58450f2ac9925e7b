"""How a rank ends when something goes wrong: exit statuses, one sentence, no hang.

Open MPI's ``MPI_Finalize`` waits for every rank, and no collective can
complete while one rank is missing, so a rank that leaves early (an uncaught
exception, ``sys.exit`` before the session starts, an exception in a thread)
must end the whole job with ``MPI_Abort``, after saying which rank and why.
A rank that exits before the training session started tells the others with
a small message (:func:`announce_departure`), which the session's start-up
(:func:`rendezvous`) turns into the same sentence on every rank.

Exit statuses of a job (``mpirun`` returns the first non-zero one):

* :data:`PREEMPTED` (75, ``EX_TEMPFAIL``: try again) -- the job was asked to
  stop (SIGTERM, SIGINT, SIGUSR1), stopped after the current step and saved a
  checkpoint; run the same command again to resume.
* :data:`WORKER_DROPPED` (69) -- a worker was silent past
  ``HVD_DCASGD_STALL_TIMEOUT`` and the others finished without it.
* :data:`SERVER_SILENT` (68) -- the server was silent past the timeout.
* 1 -- an error on some rank, named in its sentence.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from typing import Any, Callable, Optional

from ..common.errors import HvdDcasgdError, HvdDcasgdValueError
from ..common.log import get_logger
from ..common.tags import DEPARTURE as DEPARTURE_TAG
from .place import place_of

log = get_logger("exits")

PREEMPTED = 75
WORKER_DROPPED = 69
SERVER_SILENT = 68


def flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def abort(comm: Any, sentence: Optional[str], status: int) -> None:
    """Print ``sentence``, then end every rank of the job with ``status``."""
    if sentence:
        log.error(sentence)
    flush()
    comm.Abort(status)
    os._exit(status)  # not reached: Abort does not return


def rank_name(world_rank: int, servers: int = 1) -> str:
    """``rank 0 (the server)``, ``rank 1 (server 1)`` or ``rank 3 (worker 2)``,
    where world ranks ``0..servers-1`` are the servers."""
    if world_rank >= servers:
        return f"rank {world_rank} (worker {world_rank - servers})"
    return place_of(world_rank, servers).rank_name


def abort_on_uncaught(previous: Callable, comm: Any, servers: int = 1) -> Callable:
    """A ``sys.excepthook`` that prints the traceback, then one sentence naming
    the rank and the cause, and ends the job: an uncaught exception on one
    rank would otherwise leave the others waiting for it forever.  An error
    every rank raised together (``collective``) needs no abort: its sentence
    is said once, by the rank that speaks for the others, without a
    traceback (every rank's traceback at ``HVD_DCASGD_LOG_LEVEL=debug``), and
    every rank exits with status 1."""

    def hook(kind, value, tb):
        if getattr(value, "collective", False):
            if log.isEnabledFor(logging.DEBUG):
                previous(kind, value, tb)
            elif getattr(value, "speaks", True):
                log.error(str(value))
            flush()
            return
        previous(kind, value, tb)
        status = getattr(value, "status", 1)
        abort(comm, f"hvd_dcasgd: {rank_name(comm.Get_rank(), servers)} ended with {kind.__name__}: {value}; "
                    f"ending the job (status {status}).", status)

    return hook


def abort_on_thread_exception(comm: Any, servers: int = 1) -> Callable:
    """A ``threading.excepthook`` that does the same for a thread."""

    def hook(args):
        if args.exc_type is SystemExit:
            return
        traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback)
        name = args.thread.name if args.thread is not None else "a thread"
        abort(comm, f"hvd_dcasgd: {rank_name(comm.Get_rank(), servers)}: thread {name!r} ended with "
                    f"{args.exc_type.__name__}: {args.exc_value}; ending the job.", 1)

    return hook


def announce_departure(comm: Any, cause: str) -> None:
    """This rank is exiting before the training session started: tell every
    other rank (small eager messages; the ones waiting in :func:`rendezvous`
    end the job, naming this rank)."""
    me = comm.Get_rank()
    requests = [comm.isend(cause, dest=r, tag=DEPARTURE_TAG) for r in range(comm.Get_size()) if r != me]
    deadline = time.monotonic() + 2.0
    while requests and time.monotonic() < deadline:
        requests = [r for r in requests if not r.Test()]
        time.sleep(0.001)


def raise_together(comm: Any, problem: Optional[HvdDcasgdError]) -> None:
    """Collective over ``comm``: where any rank found a problem (``None``:
    this rank found none), raise the first, in rank order, on every rank
    alike, said once by rank 0 -- never one traceback per rank, and never a
    rank left waiting for one that stopped."""
    found = [p for p in comm.allgather(None if problem is None else (str(problem), isinstance(problem, ValueError)))
             if p]
    if found:
        message, value = found[0]
        kind = HvdDcasgdValueError if value else HvdDcasgdError
        raise kind(message, collective=True, speaks=comm.Get_rank() == 0)


def rendezvous(comm: Any, mpi: Any, servers: int = 1) -> None:
    """Wait until every rank arrived here; if one exited instead, raise a
    sentence naming it (the caller's excepthook then ends the job)."""
    arrived = comm.Ibarrier()
    status = mpi.Status()
    while not arrived.Test():
        if comm.Iprobe(source=mpi.ANY_SOURCE, tag=DEPARTURE_TAG, status=status):
            source = status.Get_source()
            cause = comm.recv(source=source, tag=DEPARTURE_TAG)
            raise HvdDcasgdError(f"hvd_dcasgd: {rank_name(source, servers)} {cause}, so the training session cannot "
                                 "start without it")
        time.sleep(0.001)


__all__ = ["PREEMPTED", "WORKER_DROPPED", "SERVER_SILENT", "abort", "abort_on_uncaught",
           "abort_on_thread_exception", "announce_departure", "raise_together", "rendezvous", "rank_name"]

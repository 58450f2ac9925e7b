"""Consistent checkpoints of several servers.

Each server applies pushes in its own order, so the servers' checkpoints
belong together only when they are taken at the same point of every
worker's pushes: a *cut*, where every server has applied exactly the first
``target[m]`` pushes of each worker m.  The first server decides when (its
checkpoint interval, or a stop: preemption) and orders cut n to the others,
which look for orders between polls.  Every server then gives its counts of
applied pushes; ``target`` is their maximum (a push one server applied has
been announced to every server, so every server will see it).  Each server
goes on serving, holding back only the pushes beyond the target, until it
has applied exactly the target, and writes checkpoint n.  After a cut
ordered for a stop, every server answers later pushes "stop" without
applying them, as one server does.

The first server also decides alone which silent worker to drop
(``HVD_DCASGD_STALL_TIMEOUT``) and orders the others to drop it too, so that
every server ends with the same workers.  It ends the exchange
(:meth:`Cuts.end`) once its workers have left; the others keep serving
orders until then, so an order sent late is never left waiting.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Type, TypeVar

import numpy as np

from ..common.tags import CUT as CUT_TAG, DROP as DROP_TAG, END as END_TAG, STOP as STOP_TAG
from ..runtime.exits import rank_name
from .messages import CutOrder, DropOrder, EndOfCuts, StopRequest, expect

__all__ = ["Cuts"]

M = TypeVar("M")


class Cuts:
    """One server's end of the exchange over ``comm``, the servers' communicator.

    Every message is typed (:mod:`.messages`): :class:`CutOrder`,
    :class:`DropOrder` and :class:`EndOfCuts` from the first server,
    :class:`StopRequest` to it, each under its own tag.

    Arguments:
        mpi: mpi4py's ``MPI``.
        comm: the servers (server s at rank s).
        number: the number of the last cut (of the checkpoint resumed from; 0 on a fresh start).
    """

    def __init__(self, mpi: Any, comm: Any, number: int = 0):
        self.mpi, self.comm = mpi, comm
        self.first = comm.Get_rank() == 0
        self.number = number
        self.ended = False
        self._stop_sent = False
        self._status = mpi.Status()

    def _name(self, rank: int) -> str:
        """How sentences name server ``rank`` (its world rank too)."""
        return rank_name(rank, self.comm.Get_size())

    def _receive(self, source: int, tag: int, kind: Type[M]) -> M:
        """The message from server ``source`` under ``tag``, which must be a ``kind``."""
        return expect(self.comm.recv(source=source, tag=tag), kind, self._name(self.comm.Get_rank()),
                      self._name(source))

    def _to_others(self, message: Any, tag: int) -> None:
        """First server: send ``message`` to every other server."""
        for server in range(1, self.comm.Get_size()):
            self.comm.send(message, dest=server, tag=tag)

    def order(self, stop: bool) -> CutOrder:
        """First server: order the next cut to every server; the order."""
        self.number += 1
        order = CutOrder(self.number, stop)
        self._to_others(order, CUT_TAG)
        return order

    def drop(self, worker: int) -> None:
        """First server: have every server drop ``worker``."""
        self._to_others(DropOrder(worker), DROP_TAG)

    def dropped(self) -> List[int]:
        """Another server: the workers the first has dropped since the last call."""
        workers = []
        while self.comm.Iprobe(source=0, tag=DROP_TAG):
            workers.append(self._receive(0, DROP_TAG, DropOrder).worker)
        return workers

    def ordered(self) -> Optional[CutOrder]:
        """Another server: the next cut ordered, if one is; the end, once
        ordered, sets :attr:`ended`."""
        if self.comm.Iprobe(source=0, tag=CUT_TAG):
            order = self._receive(0, CUT_TAG, CutOrder)
            self.number = order.number
            return order
        if self.comm.Iprobe(source=0, tag=END_TAG):
            self._receive(0, END_TAG, EndOfCuts)
            self.ended = True
        return None

    def want_stop(self) -> None:
        """Another server was asked to stop: ask the first (once)."""
        if not self._stop_sent:
            self.comm.send(StopRequest(), dest=0, tag=STOP_TAG)
            self._stop_sent = True

    def stop_wanted(self) -> bool:
        """First server: whether another server asked to stop."""
        wanted = False
        while self.comm.Iprobe(source=self.mpi.ANY_SOURCE, tag=STOP_TAG, status=self._status):
            self._receive(self._status.Get_source(), STOP_TAG, StopRequest)
            wanted = True
        return wanted

    def targets(self, applied: Sequence[int], stop: bool) -> Tuple[np.ndarray, bool]:
        """Every server's counts of applied pushes, per worker: the cut's
        target (their maximum), and whether it stops (collective)."""
        mine = np.array([*applied, int(stop)], dtype=np.int64)
        everyone = np.empty_like(mine)
        self.comm.Allreduce(mine, everyone, op=self.mpi.MAX)
        return everyone[:-1], bool(everyone[-1])

    def end(self) -> None:
        """First server: no cut will be ordered any more."""
        self._to_others(EndOfCuts(), END_TAG)
        self.ended = True

"""Horovod's process sets, among the workers.

A :class:`ProcessSet` names a subset of the workers (by worker rank); the
collective calls take ``process_set=`` and then run among that subset only.
:data:`global_process_set` is every worker.  :func:`add_process_set` is
collective over every worker, as Horovod's is (with dynamic process sets);
sets can also be given to ``init(process_sets=[...])``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

from ..common.errors import HvdDcasgdError, HvdDcasgdValueError
from ..runtime.roles import WORKER, runtime

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]


class ProcessSet:
    """A set of worker ranks.  ``ranks=None`` is every worker."""

    def __init__(self, ranks: Optional[Sequence[int]] = None):
        self.ranks: Optional[List[int]] = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id: Optional[int] = 0 if ranks is None else None
        self._comm: Any = None

    def _resolved_ranks(self) -> List[int]:
        return list(range(runtime().num_workers)) if self.ranks is None else self.ranks

    def size(self) -> int:
        """How many workers the set holds."""
        return len(self._resolved_ranks())

    def rank(self) -> int:
        """This worker's rank within the set (-1 where it is not in it)."""
        ranks = self._resolved_ranks()
        me = runtime().worker_rank
        return ranks.index(me) if me in ranks else -1

    def included(self) -> bool:
        """Whether this worker belongs to the set."""
        return self.rank() >= 0

    def _add(self) -> None:
        """Register this set (``init(process_sets=...)``)."""
        add_process_set(self)

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks if self.ranks else 'all'})"


#: Every worker.
global_process_set = ProcessSet()
_registered: Dict[int, ProcessSet] = {0: global_process_set}


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a set of workers; collective over every worker.  Returns the set."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    rt = runtime()
    ranks = process_set._resolved_ranks()
    if not ranks or ranks[0] < 0 or ranks[-1] >= rt.num_workers or len(set(ranks)) != len(ranks):
        raise HvdDcasgdValueError(f"hvd_dcasgd: a process set needs distinct worker ranks in 0..{rt.num_workers - 1}, "
                                  f"got {process_set.ranks}")
    if any(p.ranks == process_set.ranks for p in _registered.values()):
        raise HvdDcasgdValueError(f"hvd_dcasgd: a process set with ranks {process_set.ranks} exists already")
    if rt.role == WORKER:
        included = rt.worker_rank in ranks
        process_set._comm = rt.workers.Split(0 if included else rt.mpi.UNDEFINED, rt.worker_rank)
    process_set.process_set_id = max(_registered) + 1
    _registered[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set (not the global one); collective over every worker."""
    if process_set is global_process_set or _registered.get(process_set.process_set_id) is not process_set:
        return False
    del _registered[process_set.process_set_id]
    comm, process_set._comm = process_set._comm, None
    if comm is not None and comm != runtime().mpi.COMM_NULL:
        comm.Free()
    process_set.process_set_id = None
    return True


def communicator(process_set: ProcessSet) -> Any:
    """The MPI communicator of ``process_set`` on this worker; ``None`` on
    the server and when training locally (the calls then answer alone)."""
    rt = runtime()
    if rt.role != WORKER:
        return None
    if process_set is global_process_set or process_set.ranks is None:
        return rt.workers
    if process_set.process_set_id is None:
        raise HvdDcasgdValueError(f"hvd_dcasgd: {process_set!r} was not added: call hvd.add_process_set() first")
    if not process_set.included():
        raise HvdDcasgdError(f"hvd_dcasgd: worker {rt.worker_rank} is not in {process_set!r}")
    return process_set._comm

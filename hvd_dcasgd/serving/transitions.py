"""The transitions every rank of a session runs, each one function both
sides call with their own part, so that the two sides make the same
collectives in the same order and cannot drift apart: :func:`start` (the
checkpoint found, the windows opened, the resume, the initial broadcast) and
:func:`end` (leaving, the workers dropped, the untrained state combined, the
final exchange, the windows freed, the whole model's final weights).

Each server runs a session with the workers over its own communicator
(``Runtime.shard_comms``: the server at rank 0, worker m at rank m+1), so
with S servers a worker takes part in S sessions at once, one per slice of
the parameters (:mod:`hvd_dcasgd.algorithm.shards`), and the one-server
protocol runs unchanged in each.  If the server dropped a silent worker, the
end runs among the others only.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch

from ..common.errors import HvdDcasgdError
from ..common.tags import SURVIVORS
from ..common.tensors import broadcast_
from ..runtime.exits import WORKER_DROPPED, abort
from ..runtime.lifecycle import Lifecycle
from ..runtime.preemption import stop_grace_seconds
from ..runtime.roles import SERVER, Runtime
from .messages import Resumed


def combine_untrained_state(mpi: Any, workers: Any, tensors: List[torch.Tensor]) -> None:
    """Among ``workers`` (a communicator of workers), each of ``tensors`` of
    the untrained state: where it differs between them, average it (floating
    point: BatchNorm statistics) or sum it (integers: counters); where it is
    the same everywhere (frozen parameters), leave it alone."""
    for buffer in tensors:
        wide = torch.float64 if buffer.is_floating_point() else torch.int64
        host = buffer.detach().to("cpu", dtype=wide, copy=True).contiguous()
        low, high = host.clone(), host.clone()
        workers.Allreduce(mpi.IN_PLACE, low.numpy(), op=mpi.MIN)
        workers.Allreduce(mpi.IN_PLACE, high.numpy(), op=mpi.MAX)
        if torch.equal(low, high):
            continue
        workers.Allreduce(mpi.IN_PLACE, host.numpy(), op=mpi.SUM)
        if buffer.is_floating_point():
            host.div_(workers.Get_size())
        with torch.no_grad():
            buffer.copy_(host)


def _from_server(comm: Any, produce: Callable[[], Any]) -> Any:
    """Run ``produce`` on the server of ``comm`` (its rank 0) and give its
    result to every rank; a failure there is raised on every rank alike,
    never a hang."""
    result, problem = None, None
    if comm.Get_rank() == 0:
        try:
            result = produce()
        except HvdDcasgdError as exc:
            problem = str(exc)
    problem, result = comm.bcast((problem, result), root=0)
    if problem:
        raise HvdDcasgdError(problem, collective=True, speaks=comm.Get_rank() == 0)
    return result


class Opening(Protocol):
    """One side's part in each step of :func:`start`."""

    def find_checkpoint(self) -> None:
        """Server: open the checkpoint folder and find what to resume (may raise)."""

    def open_windows(self, shard: int, comm: Any) -> None:
        """Open server ``shard``'s windows (collective over ``comm``)."""

    def resume(self) -> Resumed:
        """Server: load the checkpoint found, if any; what every worker needs to know."""

    def start_tensors(self, shard: int) -> List[torch.Tensor]:
        """What server ``shard`` broadcasts at the start: its weights, the rest of the model's state."""


def start(comms: Sequence[Any], side: Opening, lifecycle: Lifecycle) -> Resumed:
    """The start of a session, run by every rank: the server (a list of its
    one session) and the worker (one session per server), each step with
    every server in turn, so that the servers' own exchanges between two
    steps (the checkpoint they agree on, the shared trace) never wait for a
    worker held by another server.  The same collectives in the same order
    on both sides: the server finds its checkpoint, everyone opens the
    windows, the server resumes and says where (:class:`.messages.Resumed`),
    everyone starts training, then the server broadcasts its weights and
    buffers.

    Every rank's lifecycle is training before any rank leaves the start: each
    moves, then waits in a barrier with every server in turn.  So a stop
    signal that reaches the job once any rank has started (the server between
    this start and its serving loop, say) stops the session on every rank
    with a checkpoint; one that comes earlier does what it did before on
    every rank, before anything was trained.  ``lifecycle`` is this rank's
    (:class:`hvd_dcasgd.runtime.lifecycle.Lifecycle`): from its move to training on, a stop
    signal stops the session gracefully, and one that comes
    ``HVD_DCASGD_STOP_GRACE`` seconds after the first ends the rank at once."""
    for comm in comms:
        _from_server(comm, side.find_checkpoint)
    for shard, comm in enumerate(comms):
        side.open_windows(shard, comm)
    resumed = [_from_server(comm, side.resume) for comm in comms][0]
    lifecycle.start_training(stops_on_signal=True, grace=stop_grace_seconds())
    for comm in comms:
        comm.Barrier()
    for shard, comm in enumerate(comms):
        broadcast_(comm, side.start_tensors(shard), root=0)
    return resumed


class Ending(Protocol):
    """One side's part in each step of :func:`end`."""

    def begin(self) -> None:
        """The lifecycle's end."""

    def leave(self) -> None:
        """Worker: leave every server and wait until each has closed (a server has nothing to do)."""

    def dropped(self) -> List[int]:
        """The workers the servers dropped (the same on every rank that is still there)."""

    def combine(self, workers: Any) -> None:
        """Worker: combine the untrained state among ``workers`` (a server has nothing to do)."""

    def final_tensors(self, shard: int) -> Tuple[List[torch.Tensor], torch.Tensor, Optional[Dict[str, Any]]]:
        """What server ``shard``'s final exchange takes from this side: the untrained state, the weights (of
        the shard), the optimizer state (the server's; ``None`` from a worker)."""

    def exchanged(self, shard: int, optimizer_state: Dict[str, Any]) -> None:
        """After server ``shard``'s final exchange, the windows still open: the server writes its last
        checkpoint, a worker keeps the optimizer state."""

    def free(self, shard: int) -> None:
        """Free server ``shard``'s windows (collective; not with a dropped worker, who cannot take part)."""

    def whole_model(self) -> Optional[torch.Tensor]:
        """Where the servers hold slices of the model: the tensor the whole model's final weights travel in
        (a worker's weights, which it put together from every slice; a server's empty buffer); ``None``
        where one server holds it all."""

    def took_whole_model(self, weights: torch.Tensor) -> None:
        """The whole model's final weights have arrived in ``weights`` (:meth:`whole_model`'s)."""

    def close(self, dropped: List[int], comms: List[Any]) -> None:
        """The lifecycle's finish, and this side's last word: the server's report, a worker's final weights
        and optimizer state, the end of a job that dropped a worker."""


def end(rt: Runtime, comms: Sequence[Any], side: Ending) -> None:
    """The end of a session, run by every rank: a server (its one session)
    and a worker (one session per server), each step as its side says, the
    collectives the same and in the same order on both sides."""
    side.begin()
    side.leave()
    dropped = side.dropped()
    workers = rt.workers
    if dropped:  # every server dropped the same workers: the end runs among the others
        ends = [survivors(rt, comm, dropped) for comm in comms]
        comms, workers = [comm for comm, _ in ends], ends[0][1]
    side.combine(workers)
    for shard, comm in enumerate(comms):
        side.exchanged(shard, final_exchange(comm, *side.final_tensors(shard)))
        if not dropped:  # with a dropped worker the windows cannot be freed (that is collective with it)
            side.free(shard)
    whole = side.whole_model()
    if whole is not None:  # from the first worker still there (the servers come first), to every rank
        world = survivors(rt, rt.world, dropped, rt.servers)[0] if dropped else rt.world
        broadcast_(world, [whole], root=rt.servers)
        side.took_whole_model(whole)
    side.close(dropped, list(comms))


def final_exchange(comm: Any, untrained_state: List[torch.Tensor], weights: torch.Tensor,
                   optimizer_state: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The end of a session, run by every rank of ``comm`` (the server at
    rank 0, then the workers): the same collectives in the same order on both
    sides, so they cannot drift apart.  The workers' combined buffers come
    from the first worker (rank 1), the server's final weights and optimizer
    state from rank 0.  The windows stay open (the server's last checkpoint
    reads the backups in them); both sides free them next."""
    broadcast_(comm, untrained_state, root=1)
    broadcast_(comm, [weights], root=0)
    return comm.bcast(optimizer_state, root=0)


def survivors(rt: Runtime, session: Any, dropped: List[int], servers: int = 1) -> Tuple[Any, Any]:
    """The communicator of the ``servers`` server(s) and the workers not
    ``dropped`` (of ``session``: a server's session, or the world), and the
    workers' part of it (``COMM_NULL`` on a server); collective over those
    ranks only, so a dropped worker need not take part."""
    ranks = list(range(servers)) + [m + servers for m in range(rt.num_workers) if m not in dropped]
    group = session.Get_group().Incl(ranks)
    comm = session.Create_group(group, tag=SURVIVORS)
    group.Free()
    workers = comm.Split(rt.mpi.UNDEFINED if rt.role == SERVER else 1, comm.Get_rank())
    return comm, workers


def end_without_dropped(rt: Runtime, comm: Any, sentence: str) -> None:
    """Once every rank of ``comm`` has come here (the healthy workers at
    exit, after their script's last line), the server ends the job, the
    dropped workers included, with status 69 and ``sentence``.  Never returns."""
    everyone = comm.Ibarrier()
    while not everyone.Test():
        time.sleep(0.01)
    if rt.role == SERVER:
        abort(rt.world, sentence, WORKER_DROPPED)
    time.sleep(30)  # the server's abort ends this process
    abort(rt.world, None, WORKER_DROPPED)

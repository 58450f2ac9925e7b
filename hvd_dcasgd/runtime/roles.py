"""Process roles and Horovod's basic calls: ``init``, ``rank``, ``size``, ...

Launched with N+S MPI ranks (S servers, 1 unless ``HVD_DCASGD_SERVERS`` or
``init(servers=...)`` says otherwise), world ranks 0..S-1 become the
parameter servers, one slice of the parameters each, and ranks S..N+S-1 the
workers.  ``rank()`` and ``size()`` answer as Horovod would among the workers
(worker index, number of workers), so existing data sharding works
unchanged; when Horovod is installed the workers also start it on their own
communicator, so Horovod's answers are the same.  Each server s talks to the
workers over its own communicator (server s at its rank 0, worker m at rank
m+1), where the one-server protocol runs unchanged.  Launched as one process,
the script trains locally.  Before anything else, each rank places itself
on its node's GPUs (``HVD_DCASGD_GPUS``, :mod:`.gpus`), from the ranks really
on its node, whatever the launcher's mapping.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, List, Optional, Protocol, Tuple

if TYPE_CHECKING:
    import torch

from ..common.errors import HvdDcasgdError, warn
from . import exits, gpus, preemption
from .horovod import start_horovod
from .lifecycle import Lifecycle
from .mpi import MpiUnavailable, load_mpi

SERVER, WORKER, LOCAL = "server", "worker", "local"



class Session(Protocol):
    """What the collectives and ``shutdown`` need of a running session (the
    worker's, the server's, or Horovod's baseline)."""

    #: Whether broadcasts while training also reach the server (it holds the weights).
    server_holds_weights: bool

    def restore_on_server(self, items: List[Tuple[str, "torch.Tensor"]]) -> None:
        """Have the server take these state-dict entries (a restored
        checkpoint), all or nothing; raise what it could not take."""

    def register_untrained_state(self, tensors: List["torch.Tensor"]) -> None:
        """Also combine these tensors over the workers at the end."""

    def finish(self) -> None:
        """End the session: the collectives every rank takes part in."""


@dataclass
class Runtime:
    """Everything ``init()`` learned about this process."""

    role: str
    mpi: Any = None
    world: Any = None  # every rank, the servers included
    workers: Any = None  # the workers only (None on a server)
    servers_comm: Any = None  # on a server: the servers only (server s at rank s); None on a worker
    worker_rank: int = 0
    num_workers: int = 1
    servers: int = 1  # server ranks: world ranks 0..servers-1
    shard: int = 0  # on a server: its index, which slice of the parameters it holds
    shard_comms: List[Any] = field(default_factory=list)  # per server s: s at rank 0, worker m at m+1 (None: not ours)
    local_rank: int = 0
    local_size: int = 1
    session: Optional[Session] = None  # the running worker or Horovod session, if any
    lifecycle: Lifecycle = field(default_factory=Lifecycle)  # this rank's phase and why it stops
    horovod: Any = None  # horovod.torch, running among the workers, if installed
    horovod_off: Optional[str] = None  # why Horovod is not running, where it is not
    join_counter: Any = None  # arrivals at join() when Horovod is not running
    cross: Any = None  # the workers with this worker's local rank, one per node (Horovod's cross_rank/size)
    joined: bool = False  # this rank reached the start of a training session with every other rank


_runtime: Optional[Runtime] = None


def _warn_local(reason: str) -> None:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "train.py"
    warn(
        f"{reason}, so this trains locally as sequential SGD; to train asynchronously launch one more rank "
        f"than workers, e.g. `mpirun -np 5 python {script}` (server + 4 workers).",
        stacklevel=4,
    )


def init(comm: Any = None, process_sets: Optional[List[Any]] = None, servers: Optional[int] = None) -> None:
    """Start the runtime: decide this process's role and build communicators.

    Arguments:
        comm: an mpi4py communicator that replaces ``MPI.COMM_WORLD``, as in
            Horovod (a list of world ranks is not supported: pass a communicator).
        process_sets: :class:`ProcessSet` s of workers to register, as
            Horovod's ``init(process_sets=...)``.
        servers: how many ranks serve (default 1): world ranks
            ``0..servers-1``, each holding one slice of the parameters.
            ``HVD_DCASGD_SERVERS`` overrides it.

    Calling ``init`` twice is harmless.
    """
    global _runtime
    if _runtime is not None:
        return
    _start(comm, servers)
    for process_set in process_sets or ():
        process_set._add()  # registers it (process_sets.add_process_set), collective over the workers


def _servers(requested: Optional[int]) -> int:
    from ..common.config import resolve

    servers = resolve("HVD_DCASGD_SERVERS", requested)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise HvdDcasgdError(f"hvd_dcasgd: init(servers={servers!r}) takes a whole number >= 1")
    return servers


def _shard_comms(world: Any, mpi: Any, servers: int) -> List[Any]:
    """Server s's communicator with every worker, for each s (collective over
    the world): s at rank 0, worker m at rank m+1; ``None`` for the servers
    this rank does not talk to.  One server talks over the world itself."""
    if servers == 1:
        return [world]
    me, comms = world.Get_rank(), []
    for s in range(servers):
        member = me == s or me >= servers
        comm = world.Split(1 if member else mpi.UNDEFINED, 0 if me == s else me)
        comms.append(comm if member else None)
    return comms


def _settings_agreed(world: Any, requested: Optional[int]) -> int:
    """The number of servers, once every rank has read its settings: a value
    that cannot be used, on any rank, is raised on every rank alike and said
    once (collective over ``world``), never one traceback per rank."""
    from ..common.config import settings

    servers, problem = 1, None
    try:
        settings()
        servers = _servers(requested)
    except HvdDcasgdError as exc:
        problem = exc
    exits.raise_together(world, problem)
    return servers


def _pin_gpus(node: Any = None, server: bool = False) -> None:
    """Set this rank's ``CUDA_VISIBLE_DEVICES`` (:func:`gpus.decide`) from the
    roles and GPUs of the ranks of ``node`` (its node's communicator, in
    world-rank order; ``None``: this process alone), collective over ``node``.
    CUDA reads the variable once, when it starts: where it already has, this
    warns and leaves it."""
    from ..common.config import resolve

    mine = gpus.NodeRank(server, resolve("HVD_DCASGD_GPUS"), gpus.listed(os.environ.get("CUDA_VISIBLE_DEVICES")))
    ranks = [mine] if node is None else node.allgather(mine)
    me = 0 if node is None else node.Get_rank()
    listing: Tuple[str, ...] = ()
    if any(rank.needs_listing for rank in ranks):  # the same on every rank of the node: one nvidia-smi for all
        found = gpus.nvidia_smi_ids(os.environ) if me == 0 else None
        listing = found if node is None else node.bcast(found)
    chosen = gpus.decide(ranks, me, listing)
    if chosen is None or chosen == os.environ.get("CUDA_VISIBLE_DEVICES"):
        return
    if gpus.cuda_started():
        warn(f"CUDA started in this process before hvd_dcasgd.init(), so init() cannot place this rank on its GPU "
             f"(CUDA_VISIBLE_DEVICES={chosen!r}); call hvd.init() before anything uses CUDA, or set "
             f"HVD_DCASGD_GPUS=keep to leave the GPUs as they are", stacklevel=5)
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = chosen


def _start(comm: Any, requested: Optional[int] = None) -> None:
    global _runtime
    if comm is not None and not hasattr(comm, "Dup"):
        raise HvdDcasgdError(f"hvd_dcasgd: init(comm=...) takes an mpi4py communicator, not {type(comm).__name__}")
    try:
        mpi = load_mpi()
    except MpiUnavailable:
        from ..common.config import launched_size

        if launched_size() > 1:
            raise
        _servers(requested)
        _pin_gpus()
        _runtime = Runtime(role=LOCAL)
        _warn_local("MPI is not available (install Open MPI and mpi4py)")
        return
    world = (comm if comm is not None else mpi.COMM_WORLD).Dup()
    if world.Get_size() == 1:
        _servers(requested)
        _pin_gpus()
        horovod, horovod_off = start_horovod(mpi, world)
        _runtime = Runtime(role=LOCAL, mpi=mpi, world=world, workers=world, horovod=horovod, horovod_off=horovod_off)
        _warn_local("running as a single process with no parameter server")
        return
    previous = sys.excepthook
    sys.excepthook = exits.abort_on_uncaught(previous, world)  # from here an error never leaves the others waiting
    servers = _settings_agreed(world, requested)
    sys.excepthook = exits.abort_on_uncaught(previous, world, servers)  # the same, naming the servers as such
    threading.excepthook = exits.abort_on_thread_exception(world, servers)
    if servers >= world.Get_size():
        raise HvdDcasgdError(f"hvd_dcasgd: {servers} server(s) (HVD_DCASGD_SERVERS) need at least "
                             f"{servers + 1} ranks, one worker or more; this job has {world.Get_size()}",
                             collective=True, speaks=world.Get_rank() == 0)
    is_server = world.Get_rank() < servers
    node = world.Split_type(mpi.COMM_TYPE_SHARED, key=world.Get_rank())  # every rank on this node
    _pin_gpus(node, is_server)
    node.Free()
    peers = world.Split(0 if is_server else 1, world.Get_rank())  # the servers, or the workers
    node = peers.Split_type(mpi.COMM_TYPE_SHARED)
    _runtime = Runtime(
        role=SERVER if is_server else WORKER,
        mpi=mpi,
        world=world,
        workers=None if is_server else peers,
        servers_comm=peers if is_server else None,
        worker_rank=0 if is_server else peers.Get_rank(),
        num_workers=world.Get_size() - servers,
        servers=servers,
        shard=world.Get_rank() if is_server else 0,
        shard_comms=_shard_comms(world, mpi, servers),
        local_rank=node.Get_rank(),  # on a server: its index among the servers on its node
        local_size=node.Get_size(),
    )
    # Horovod's cross communicator: the workers with this node-local rank, one per node
    _runtime.cross = peers.Split(_runtime.local_rank, _runtime.worker_rank)
    node.Free()
    if not is_server:
        _runtime.horovod, _runtime.horovod_off = start_horovod(mpi, peers)
        if _runtime.horovod is None:
            from mpi4py.util.sync import Counter

            try:
                _runtime.join_counter = Counter(comm=peers)
            except mpi.Exception:  # no one-sided support here: the optimizer explains why, join() says so
                pass
    atexit.register(_at_exit)
    preemption.install(_runtime.lifecycle.signal_received, exits.rank_name(world.Get_rank(), servers))


def _at_exit() -> None:
    """This rank is exiting.  Before the training session started: tell the
    others, which would wait for it forever.  Then end the session
    (:func:`shutdown`); after a worker was dropped, end the job."""
    rt = _runtime
    if rt is None:
        return
    if not rt.joined and rt.role != LOCAL:
        exits.announce_departure(rt.world, "exited (sys.exit, an exception it caught, or the end of its script) "
                                           "before DistributedOptimizer")
    shutdown()
    rt.lifecycle.exit()


def runtime() -> Runtime:
    """The initialised runtime, or a clear error if ``init()`` was not called."""
    if _runtime is None:
        raise HvdDcasgdError("hvd_dcasgd has not been initialized; call hvd_dcasgd.init() first.")
    return _runtime


def shutdown() -> None:
    """End training: every rank ends up with the server's final weights.

    A worker tells the server it has left, waits for the others, then takes
    part in the final exchange (buffers averaged, final weights broadcast).
    Called automatically at exit; safe to call more than once.
    """
    if _runtime is None:
        return
    if _runtime.session is not None:
        session, _runtime.session = _runtime.session, None
        session.finish()
    if _runtime.join_counter is not None and _runtime.lifecycle.at_exit is None:  # collective with every worker
        counter, _runtime.join_counter = _runtime.join_counter, None
        counter.free()


def rank() -> int:
    """This worker's index among the workers (0 on the server and locally)."""
    return runtime().worker_rank


def size() -> int:
    """The number of workers (1 when training locally)."""
    return runtime().num_workers


def local_rank() -> int:
    """This worker's index among the workers on its node (on a server: its
    index among the servers on its node)."""
    return runtime().local_rank


def local_size() -> int:
    """The number of workers on this node."""
    return runtime().local_size


def is_server() -> bool:
    """True on a parameter-server rank."""
    return runtime().role == SERVER


def is_initialized() -> bool:
    return _runtime is not None

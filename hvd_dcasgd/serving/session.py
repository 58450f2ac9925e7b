"""Opening a session and wiring its parts, on each side: what the server
and a worker each bring to :func:`.transitions.start` (``_ServerOpening``,
``_WorkerOpening``), and the two entry points ``DistributedOptimizer`` calls,
:func:`run_server` (a server's whole lifecycle) and :func:`start_worker`.

Start: every rank describes its model and settings and the server checks
that they agree (:mod:`.agreement`), opens the windows, resumes from the
newest checkpoint if there is one, and broadcasts its weights and the rest of
the model's state (buffers, frozen parameters); a resumed worker then takes
its own backup, the weights it last received.  End: :mod:`.sides`, through
:func:`.transitions.end`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..algorithm.compensation import Compensation
from ..algorithm.endpoints import open_server, open_worker_channel
from ..algorithm.server import ParameterServer
from ..algorithm.shards import Piece, shard_layout
from ..algorithm.update import lr_factor
from ..common.errors import HvdDcasgdError
from ..common.log import get_logger
from ..protocol.layout import ModelLayout, trained_parameters, untrained_state
from ..protocol.worker import Worker
from ..runtime.mpi import transport
from ..runtime.roles import Runtime
from .agreement import agree
from .checkpoints import estimate_bytes
from .coordination import Coordination, ModelSplit, coordination_for, model_split_for
from .messages import Description, Resumed
from .sides import HorovodSession, ServerSession, WorkerSession, idle_server
from .transitions import start

__all__ = ["HorovodSession", "idle_server", "run_server", "start_worker"]

log = get_logger("session")


def _untrained_state_of(model: Optional[torch.nn.Module],
                        optimizer: torch.optim.Optimizer) -> Dict[str, torch.Tensor]:
    if model is None:
        return {}
    return untrained_state(model, trained_parameters(optimizer))


class _ServerOpening:
    """The server's part in :func:`start`."""

    def __init__(self, rt: Runtime, coordination: Coordination, optimizer: torch.optim.Optimizer,
                 layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype, device: torch.device,
                 untrained_state: Dict[str, torch.Tensor], described: List[Tuple[str, Description]],
                 trace_path: Optional[str], checkpoint_dir: Optional[str], slice_: Tuple[int, int],
                 lr_scaling: str):
        self.rt, self.coordination = rt, coordination
        self.lr_factor = lr_factor(lr_scaling, compensation.schedule, rt.num_workers)
        self.optimizer, self.layout, self.compensation = optimizer, layout, compensation
        self.wire_dtype, self.device, self.untrained_state = wire_dtype, device, untrained_state
        self.described = described  # each worker's name for messages, and its description
        self.trace_path, self.checkpoint_dir, self.slice = trace_path, checkpoint_dir, slice_
        self.found: Optional[Tuple[Any, Dict[str, Any]]] = None
        self.server: Optional[ParameterServer] = None

    def find_checkpoint(self) -> None:
        """This server's checkpoint folder and the checkpoint to resume from
        (with several servers, the newest cut every server holds)."""
        needs = estimate_bytes(self.layout.numel, self.layout.dtype, self.rt.num_workers, self.untrained_state)
        self.found = self.coordination.open_checkpoints(self.checkpoint_dir, needs)

    def open_windows(self, shard: int, comm: Any) -> None:
        telemetry = self.coordination.open_trace(self.rt.num_workers, self.trace_path, self.slice,
                                                 int(self.found[1]["updates"]) if self.found else None)
        telemetry.note_transport(transport(self.rt.mpi), self.rt.mpi.Get_processor_name(),
                                 [description.host for _, description in self.described])
        self.server = open_server(comm, self.optimizer, self.layout, self.compensation,
                                  num_workers=self.rt.num_workers, wire_dtype=self.wire_dtype, device=self.device,
                                  telemetry=telemetry, untrained_state=self.untrained_state,
                                  checked_by_workers=[d.check_finite for _, d in self.described],
                                  lr_factor=self.lr_factor)

    def resume(self) -> Resumed:
        """Load the checkpoint found into the server; what the workers need to know."""
        if self.found is None:
            return Resumed()
        path, state = self.found
        server = self.server
        try:
            server.load_state_dict(state)
        except HvdDcasgdError as exc:
            raise HvdDcasgdError(f"{exc} (checkpoint {path}; another HVD_DCASGD_CHECKPOINT_DIR starts afresh)") \
                from None
        server.channel.mailboxes.sync()  # every backup is in its outbox, for the workers to read
        log.info(f"{server.telemetry.name}: resuming from update {server.updates} ({path})")
        saved = state["settings"].get("num_workers") if isinstance(state.get("settings"), dict) else None
        if saved != server.channel.num_workers:
            self.coordination.membership.resized(server.updates, saved, server.channel.num_workers)
            log.info(f"{server.telemetry.name}: the checkpoint's job had {saved} workers and this one has "
                     f"{server.channel.num_workers}: {_resize_sentence(saved, server.channel.num_workers)}; every "
                     f"worker resumes at batch {server.base} of its shard, the even share of the "
                     f"{server.before['applied'] + server.before['refused']} pushes taken before")
        return Resumed(server.updates, str(path), tuple(server.position(m) for m in range(server.channel.num_workers)))

    def start_tensors(self, shard: int) -> List[torch.Tensor]:
        return [self.server.weights, *self.untrained_state.values()]


def _resize_sentence(saved: int, workers: int) -> str:
    """What a change of the number of workers does to the workers' state (:mod:`..algorithm.membership`)."""
    if workers < saved:
        if saved - workers == 1:
            return f"worker {saved - 1} left (its last weights and own state are dropped; nothing of it was pending)"
        return (f"workers {workers} to {saved - 1} left (their last weights and own state are dropped; nothing of "
                "theirs was pending)")
    new = f"worker {workers - 1}" if workers - saved == 1 else f"workers {saved} to {workers - 1}"
    return f"{new} {'joins' if workers - saved == 1 else 'join'} from the current weights"


def run_server(
    rt: Runtime,
    optimizer: torch.optim.Optimizer,
    layout: ModelLayout,
    compensation: Compensation,
    wire_dtype: torch.dtype,
    model: Optional[torch.nn.Module],
    device: torch.device,
    trace_path: Optional[str],
    checkpoint_dir: Optional[str] = None,
    slices: Optional[List[Tuple[int, int]]] = None,
    metrics_dir: Optional[str] = None,
    *,
    lr_scaling: str,
) -> None:
    """This server's whole lifecycle: start, serve the workers until they
    all leave, end, and exit: status 0, or 75 when the job was asked to
    stop.  With several servers this one serves ``slices[rt.shard]`` of the
    flat parameter vector.  ``lr_scaling`` says what a worker's learning
    rate means (:data:`.update.LR_SCALINGS`)."""
    slices = slices or [(0, layout.numel)]
    comm = rt.shard_comms[rt.shard]
    described = agree(rt, comm, layout, compensation, wire_dtype, lr_scaling=lr_scaling)
    untrained_state = _untrained_state_of(model, optimizer)
    params = trained_parameters(optimizer)
    coordination = coordination_for(rt.mpi, rt.servers_comm, rt.servers, None)
    served_layout, served_optimizer = coordination.served(layout, optimizer, [*params, *untrained_state.values()],
                                                          slices[rt.shard])
    opening = _ServerOpening(rt, coordination, served_optimizer, served_layout, compensation, wire_dtype, device,
                             untrained_state, described, trace_path, checkpoint_dir, slices[rt.shard], lr_scaling)
    start([comm], opening, rt.lifecycle)
    session = ServerSession(rt, comm, opening.server, [name for name, _ in described], coordination, params,
                            metrics_dir)
    session.serve()
    session.finish()
    sys.exit(session.exit_status)


class _WorkerOpening:
    """A worker's part in :func:`start`, with every server."""

    def __init__(self, rt: Runtime, served: List[Tuple[ModelLayout, List[Piece]]], wire_dtype: torch.dtype,
                 build: Callable[[List[Any]], Worker], untrained_state: Dict[str, torch.Tensor],
                 slices: List[Tuple[int, int]], split: ModelSplit):
        self.rt, self.served, self.wire_dtype, self.build = rt, served, wire_dtype, build
        self.untrained_state, self.slices, self.split = untrained_state, slices, split
        self.channels: List[Any] = []
        self.worker: Optional[Worker] = None

    def find_checkpoint(self) -> None:
        """Nothing: the server looks."""

    def open_windows(self, shard: int, comm: Any) -> None:
        self.channels.append(open_worker_channel(comm, self.served[shard][0], self.wire_dtype,
                                                 worker=self.rt.worker_rank, num_workers=self.rt.num_workers,
                                                 server=self.split.server_name(shard), lifecycle=self.rt.lifecycle))
        if len(self.channels) == len(self.served):
            self.worker = self.build(self.channels)

    def resume(self) -> Resumed:
        """Never called: the server resumes."""
        raise AssertionError("only the server resumes")

    def start_tensors(self, shard: int) -> List[torch.Tensor]:
        start, end = self.slices[shard]
        return [self.worker.weights[start:end], *self.untrained_state.values()]


def start_worker(
    rt: Runtime,
    optimizer: torch.optim.Optimizer,
    layout: ModelLayout,
    compensation: Compensation,
    wire_dtype: torch.dtype,
    model: Optional[torch.nn.Module],
    check_finite: bool,
    slices: Optional[List[Tuple[int, int]]] = None,
    *,
    lr_scaling: str,
) -> WorkerSession:
    """Join every server's session and load the servers' weights and
    buffers; in a resumed job, this worker's own backup (the weights it last
    received)."""
    slices = slices or [(0, layout.numel)]
    comms = rt.shard_comms
    for comm in comms:
        agree(rt, comm, layout, compensation, wire_dtype, check_finite, lr_scaling=lr_scaling)
    untrained_state = _untrained_state_of(model, optimizer)
    served = [shard_layout(layout, start, end) for start, end in slices]
    split = model_split_for(rt.servers, layout, [pieces for _, pieces in served])
    opening = _WorkerOpening(rt, served, wire_dtype,
                             lambda channels: Worker(optimizer, layout, channels, wire_dtype, check_finite, slices),
                             untrained_state, slices, split)
    resumed = start(comms, opening, rt.lifecycle)
    worker = opening.worker
    pushes_before = 0
    if resumed.update is not None:
        worker.read()
        pushes_before = resumed.pushes[rt.worker_rank]
    worker.load_weights()
    session = WorkerSession(rt, worker, untrained_state, comms, split, pushes_before)
    rt.session = session
    return session

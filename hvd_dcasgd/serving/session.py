"""Start and end of a training session, collective over every rank.

Each server runs the session with the workers over its own communicator
(``Runtime.shard_comms``: the server at rank 0, worker m at rank m+1), so
with S servers a worker takes part in S sessions at once, one per slice of
the parameters (:mod:`.shards`), and the one-server protocol runs unchanged
in each.

Start: every rank describes its model and settings; the server checks that
they agree (a mismatch is an error on every rank, never a hang), opens the
windows, resumes from the newest checkpoint if there is one, and broadcasts
its weights and the rest of the model's state (buffers, frozen parameters);
a resumed worker then takes its own backup, the weights it last received.
End: buffers that differ between workers (BatchNorm statistics) are combined
-- floating-point ones averaged, integer counters summed -- and shared with
the server, the server's final weights are broadcast, so a model saved on any
rank evaluates alike, and the server writes its last checkpoint.  If the
server dropped a silent worker, the end runs among the others only, and the
job then ends with status 69 naming it; if the job was asked to stop, it ends
with status 75 (preempted) once the checkpoint is written.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch

from ..algorithm.compensation import Compensation
from ..algorithm.endpoints import open_server, open_worker_channel
from ..algorithm.server import ParameterServer
from ..algorithm.shards import Piece, shard_layout, shard_tensors
from ..algorithm.update import lr_factor
from ..common.errors import HvdDcasgdError
from ..common.log import get_logger
from ..common.tags import SURVIVORS
from ..common.tensors import broadcast_, snapshot, to_cpu
from ..protocol.layout import ModelLayout, trained_parameters, untrained_state
from ..protocol.stall import StallWatch, stall_timeout_seconds, stall_warning_seconds
from ..protocol.worker import Worker
from ..runtime.exits import PREEMPTED, WORKER_DROPPED, abort, flush
from ..runtime.lifecycle import Lifecycle
from ..runtime.mpi import transport
from ..runtime.preemption import Preempted, signal_name, stop_grace_seconds
from ..runtime.roles import SERVER, Runtime
from .checkpoints import estimate_bytes
from .coordination import Coordination, Slices, coordination_for, slices_for
from .loop import save, serve
from .messages import ControlRequests, Description, LoadOptimizerState, OptimizerStateWithWeights, Resumed, SetState

log = get_logger("session")


def _disagreements(server: Description, workers: List[Description]) -> List[str]:
    problems = []
    for m, worker in enumerate(workers):
        theirs, mine = worker.compensation, server.compensation
        if theirs["mode"] != mine["mode"]:
            problems.append(
                f"hvd_dcasgd: the server runs compensation {mine['mode']!r} but worker {m} asks for "
                f"{theirs['mode']!r}; every rank must use the same mode (check HVD_DCASGD_COMPENSATION)."
            )
        elif theirs["schedule"] != mine["schedule"]:
            problems.append(
                f"hvd_dcasgd: the server runs the {mine['schedule']!r} schedule but worker {m} asks for "
                f"{theirs['schedule']!r}; every rank must use the same (check HVD_DCASGD_SCHEDULE)."
            )
        elif theirs != mine:
            problems.append(
                f"hvd_dcasgd: worker {m}'s compensation settings {theirs} differ from the server's {mine}; "
                f"every rank must use the same (check HVD_DCASGD_LAMBDA, HVD_DCASGD_BOUND and the other constants' "
                f"variables)."
            )
        elif worker.lr_scaling != server.lr_scaling:
            problems.append(
                f"hvd_dcasgd: the server applies lr_scaling {server.lr_scaling!r} but worker {m} asks for "
                f"{worker.lr_scaling!r}; every rank must use the same (check HVD_DCASGD_LR_SCALING)."
            )
        if worker.wire != server.wire:
            problems.append(
                f"hvd_dcasgd: worker {m} compresses gradients to {worker.wire}, the server expects "
                f"{server.wire}; every rank must use the same compression."
            )
        difference = server.layout.mismatch(worker.layout)
        if difference:
            problems.append(f"hvd_dcasgd: worker {m}'s model does not match the server's: {difference}.")
    return problems


def agree(rt: Runtime, comm: Any, layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype,
          check_finite: bool = False, *, lr_scaling: str) -> List[Tuple[str, Description]]:
    """Raise the same clear error on every rank of ``comm`` (a server's
    session) unless all its ranks agree.  Returns (on the server) each
    worker's name for messages (index, MPI rank, host) and description."""
    mine = Description.of(layout, compensation, wire_dtype, rt.mpi.Get_processor_name(), check_finite, lr_scaling)
    gathered = comm.gather(mine, root=0)
    problems = _disagreements(gathered[0], gathered[1:]) if rt.role == SERVER else None
    problems = comm.bcast(problems, root=0)
    if problems:
        raise HvdDcasgdError("\n".join(problems), collective=True)
    if rt.role != SERVER:
        return []
    return [(f"worker {m} (MPI rank {m + rt.servers}, host {d.host})", d) for m, d in enumerate(gathered[1:])]


def _untrained_state_of(model: Optional[torch.nn.Module],
                        optimizer: torch.optim.Optimizer) -> Dict[str, torch.Tensor]:
    if model is None:
        return {}
    return untrained_state(model, trained_parameters(optimizer))


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


# --- the transitions every rank of a session runs ---------------------------
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
        raise HvdDcasgdError(problem, collective=True)
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


def start(comms: Sequence[Any], side: Opening) -> Resumed:
    """The start of a session, run by every rank: the server (a list of its
    one session) and the worker (one session per server), each step with
    every server in turn, so that the servers' own exchanges between two
    steps (the checkpoint they agree on, the shared trace) never wait for a
    worker held by another server.  The same collectives in the same order
    on both sides: the server finds its checkpoint, everyone opens the
    windows, the server resumes and says where (:class:`.messages.Resumed`),
    then broadcasts its weights and buffers."""
    for comm in comms:
        _from_server(comm, side.find_checkpoint)
    for shard, comm in enumerate(comms):
        side.open_windows(shard, comm)
    resumed = [_from_server(comm, side.resume) for comm in comms][0]
    for shard, comm in enumerate(comms):
        broadcast_(comm, side.start_tensors(shard), root=0)
    return resumed


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


class ServerSession:
    """A server's side of a session: serve, end, report.

    Arguments:
        rt: the runtime (its lifecycle is this rank's).
        comm: this server's session with the workers.
        server: the algorithm.
        names: each worker's name for messages.
        coordination: one server's, or several servers'.
        model_params: the model's trained parameters, which take the whole
            model's final weights at the end.
        metrics_dir: ``DistributedOptimizer(metrics_dir=...)``, for the
            serving loop's monitor.
    """

    server_holds_weights = True

    def __init__(self, rt: Runtime, comm: Any, server: ParameterServer, names: List[str],
                 coordination: Coordination, model_params: List[torch.Tensor], metrics_dir: Optional[str] = None):
        self.rt, self.comm, self.server, self.names = rt, comm, server, names
        self.metrics_dir = metrics_dir
        self.coordination, self.model_params = coordination, model_params
        self.lifecycle: Lifecycle = rt.lifecycle
        self.last_checkpoint = None

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: the collectives take no part on the server."""

    def register_untrained_state(self, tensors: List[torch.Tensor]) -> None:
        """Nothing to do: the workers combine their buffers among themselves."""

    def serve(self) -> None:
        """Training: answer pushes until every worker has left."""
        serve(self.server, self.coordination, self.lifecycle, ControlRequests(self.rt.mpi, self.comm, self.server).answer,
              StallWatch(self.names, stall_warning_seconds()), self.metrics_dir)

    def finish(self) -> None:
        """Ending: the final exchange, the last checkpoint (the buffers
        combined, the windows still open: on the CPU the backups live in
        them), the windows freed, the summary; then end the job if a
        worker was dropped."""
        server, rt = self.server, self.rt
        self.lifecycle.end()
        dropped = [m for m, d in enumerate(server.channel.dropped) if d]
        comm = survivors(rt, self.comm, dropped)[0] if dropped else self.comm
        final_exchange(comm, list(server.untrained_state.values()), server.weights,
                       snapshot(server.optimizer.state_dict()))
        if self.coordination.checkpoints is not None:
            self.last_checkpoint = save(server, self.coordination.checkpoints,
                                        self.coordination.last_checkpoint_number())
        if not dropped:  # with a dropped worker the windows cannot be freed (that is collective with it)
            server.free()
        self.coordination.take_final_model(lambda: survivors(rt, rt.world, dropped, rt.servers)[0] if dropped
                                           else rt.world, self.model_params, server.weights.dtype, rt.servers)
        self.coordination.report(server.telemetry)
        if self.lifecycle.stopped:
            saved = f"checkpoint {self.last_checkpoint}" if self.last_checkpoint else \
                "nothing saved (no HVD_DCASGD_CHECKPOINT_DIR)" if self.coordination.checkpoints is None else \
                "its checkpoint could not be written (see the warning above; the previous ones are kept)"
            log.warning(f"{server.telemetry.name}: stopped at update {self.lifecycle.stopped_at}, asked by "
                        f"{signal_name(self.lifecycle.signal)}: {saved}; exit status {PREEMPTED} (preempted): "
                        "run the same command again to resume.")
            flush()
        self.lifecycle.finish()
        if dropped:
            names = ", ".join(self.names[m] for m in dropped)
            end_without_dropped(rt, comm, f"hvd_dcasgd: {names} stopped pushing and was dropped after "
                                          f"{stall_timeout_seconds():g} s (HVD_DCASGD_STALL_TIMEOUT); the other "
                                          f"workers finished; ending the job with status {WORKER_DROPPED}.")

    @property
    def exit_status(self) -> int:
        return PREEMPTED if self.lifecycle.stopped else 0


class WorkerSession:
    """A worker's side of a session: the exchange object, and how to finish.
    With several servers, one session per server, finished together."""

    server_holds_weights = True  # broadcasts while training also reach the server

    def __init__(self, rt: Runtime, worker: Worker, untrained_state: Dict[str, torch.Tensor], comms: List[Any],
                 slices: Slices, pushes_before: int = 0):
        """``comms[s]`` is server s's session, whose slice of the model is
        ``slices.pieces[s]``."""
        self.rt, self.worker, self.untrained_state = rt, worker, untrained_state
        self.comms, self.slices = comms, slices
        self.lifecycle: Lifecycle = rt.lifecycle
        self.untrained_tensors: List[torch.Tensor] = list(untrained_state.values())
        self.requests = [ControlRequests(rt.mpi, comm) for comm in comms]
        self.finished = False
        self.pushes_before = pushes_before  # applied before this job started (a resumed job)
        self._told_servers = False  # this worker has asked the servers to stop

    @property
    def pushes(self) -> int:
        """This worker's pushes the server has taken, this job and the ones it resumes."""
        return self.pushes_before + self.worker.pushes

    def register_untrained_state(self, tensors: List[torch.Tensor]) -> None:
        """Also combine these (the non-trained entries of a state dict the
        script broadcast) at the end."""
        known = {t.data_ptr() for t in self.untrained_tensors} | {p.data_ptr() for p in self.worker.params}
        self.untrained_tensors += [t for t in tensors if t.data_ptr() not in known and t.numel()]

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Send these state-dict entries to the servers: trained parameters by
        their index in the layout (so no names are needed; each server its
        slice of them), the rest of the model's state by name."""
        index = {p.data_ptr(): i for i, p in enumerate(self.worker.params)}
        params = {index[t.data_ptr()]: t.detach().cpu() for _, t in items if t.data_ptr() in index}
        untrained_state = {n: t.detach().cpu() for n, t in items
                           if n in self.untrained_state and t.data_ptr() not in index}
        for requests, pieces in zip(self.requests, self.slices.pieces):
            requests.ask(SetState(shard_tensors(params, pieces), untrained_state))

    def load_optimizer_state(self, state: Dict[str, Any]) -> None:
        """Load an optimizer state on the servers (each its slice of it)."""
        state = to_cpu(state)
        for shard, requests in enumerate(self.requests):
            requests.ask(LoadOptimizerState(self.slices.state_for(state, shard)))

    def optimizer_state_with_weights(self) -> Dict[str, Any]:
        """The servers' optimizer state, with the model brought to the weights
        of the same moment (this worker's backup from now on), per server."""
        states = [requests.ask(OptimizerStateWithWeights(self.worker.index)) for requests in self.requests]
        self.worker.read()
        return self.slices.whole_state(states)

    def exchange(self) -> None:
        """One step's exchange; then stop the script if the job was asked to
        (a signal here: tell the servers; or the servers' answer said so)."""
        self.worker.exchange()
        signal = self.lifecycle.signal
        if signal is not None and not self._told_servers:
            for channel in self.worker.channels:
                channel.ask_to_stop()
            self._told_servers = True
        if signal is not None or self.worker.stopping:
            self.lifecycle.stop()
            raise Preempted(
                f"hvd_dcasgd: worker {self.worker.index} stops after push {self.pushes - 1}: the job was "
                f"asked to stop ({signal_name(signal)}); the server saves a checkpoint.")

    def finish(self) -> None:
        """Ending: leave, wait for the servers to close, the final exchange
        with each, the windows freed, the final weights and optimizer state."""
        self.finished = True
        self.lifecycle.end()
        channels = self.worker.channels
        for channel in channels:
            channel.leave()
        for channel in channels:  # a signal while it waits (or since its last step) stops the others
            channel.wait_closed(lambda: self.lifecycle.signal is not None and not self._told_servers)
        dropped = sorted({m for channel in channels for m in channel.dropped_workers()})
        rt = self.rt
        if dropped:  # every server dropped the same workers: the end runs among the others
            ends = [survivors(rt, comm, dropped) for comm in self.comms]
            comms, workers = [comm for comm, _ in ends], ends[0][1]
        else:
            comms, workers = self.comms, rt.workers
        combine_untrained_state(rt.mpi, workers, self.untrained_tensors)
        states = []
        for comm, channel, (start, end) in zip(comms, channels, self.worker.slices):
            states.append(final_exchange(comm, list(self.untrained_state.values()), self.worker.weights[start:end],
                                         None))
            if not dropped:  # with a dropped worker the windows cannot be freed (that is collective with it)
                channel.free()
        self.slices.share_final_weights(lambda: survivors(rt, rt.world, dropped, rt.servers)[0] if dropped
                                        else rt.world, self.worker.weights, rt.servers)
        if dropped:
            rt.ending = lambda: end_without_dropped(rt, comms[0], "")
        self.worker.load_weights()
        if not dropped:
            self.worker.optimizer.load_state_dict(self.slices.whole_state(states))
        self.lifecycle.finish()


class HorovodSession:
    """Horovod's synchronous baseline on a worker: the workers allreduce among
    themselves; finishing only releases the idle server rank."""

    server_holds_weights = False

    def __init__(self, rt: Runtime):
        self.rt = rt
        rt.lifecycle.start_training(stops_on_signal=False)  # Horovod's own optimizer steps: signals stay as they were

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: the server rank holds no model."""

    def register_untrained_state(self, tensors: List[torch.Tensor]) -> None:
        """Nothing to do: Horovod's workers keep their own buffers."""

    def finish(self) -> None:
        self.rt.lifecycle.end()
        self.rt.world.Ibarrier().Wait()
        self.rt.lifecycle.finish()


def idle_server(rt: Runtime) -> None:
    """The server rank in Horovod's baseline: nothing to serve.  Wait, sleeping
    rather than spinning so the workers keep the CPU, until every worker has
    finished, then exit with status 0."""
    finished = rt.world.Ibarrier()
    while not finished.Test():
        time.sleep(0.05)
    sys.exit(0)


class _ServerOpening:
    """The server's part in :func:`start`."""

    def __init__(self, rt: Runtime, coordination: Coordination, optimizer: torch.optim.Optimizer,
                 layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype, device: torch.device,
                 untrained_state: Dict[str, torch.Tensor], workers: List[Tuple[str, Description]],
                 trace_path: Optional[str], checkpoint_dir: Optional[str], slice_: Tuple[int, int],
                 lr_scaling: str):
        self.rt, self.coordination = rt, coordination
        self.lr_factor = lr_factor(lr_scaling, compensation.schedule, rt.num_workers)
        self.optimizer, self.layout, self.compensation = optimizer, layout, compensation
        self.wire_dtype, self.device, self.untrained_state, self.workers = wire_dtype, device, untrained_state, workers
        self.trace_path, self.checkpoint_dir, self.slice = trace_path, checkpoint_dir, slice_
        self.found: Optional[Tuple[Any, Dict[str, Any]]] = None
        self.server: Optional[ParameterServer] = None

    def find_checkpoint(self) -> None:
        """This server's checkpoint folder and the checkpoint to resume from
        (with several servers, the newest cut every server holds)."""
        needs = estimate_bytes(self.layout.numel, self.layout.dtype, self.rt.num_workers, self.untrained_state)
        self.found = self.coordination.open_checkpoints(self.checkpoint_dir, self.rt.shard, needs)

    def open_windows(self, shard: int, comm: Any) -> None:
        telemetry = self.coordination.open_trace(self.rt.num_workers, self.trace_path, self.slice,
                                                 int(self.found[1]["updates"]) if self.found else None)
        telemetry.note_transport(transport(self.rt.mpi), self.rt.mpi.Get_processor_name(),
                                 [description.host for _, description in self.workers])
        self.server = open_server(comm, self.optimizer, self.layout, self.compensation,
                                  num_workers=self.rt.num_workers, wire_dtype=self.wire_dtype, device=self.device,
                                  telemetry=telemetry, untrained_state=self.untrained_state,
                                  checked_by_workers=[d.check_finite for _, d in self.workers],
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
        return Resumed(server.updates, str(path),
                       tuple(a + r for a, r in zip(server.telemetry.pushes, server.telemetry.refused)))

    def start_tensors(self, shard: int) -> List[torch.Tensor]:
        return [self.server.weights, *self.untrained_state.values()]


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
    workers = agree(rt, comm, layout, compensation, wire_dtype, lr_scaling=lr_scaling)
    untrained_state = _untrained_state_of(model, optimizer)
    params = trained_parameters(optimizer)
    coordination = coordination_for(rt.mpi, rt.servers_comm, rt.servers, None)
    served_layout, served_optimizer = coordination.served(layout, optimizer, [*params, *untrained_state.values()],
                                                          slices[rt.shard])
    opening = _ServerOpening(rt, coordination, served_optimizer, served_layout, compensation, wire_dtype, device,
                             untrained_state, workers, trace_path, checkpoint_dir, slices[rt.shard], lr_scaling)
    start([comm], opening)
    session = ServerSession(rt, comm, opening.server, [name for name, _ in workers], coordination, params,
                            metrics_dir)
    rt.lifecycle.start_training(stops_on_signal=True, grace=stop_grace_seconds())
    session.serve()
    session.finish()
    sys.exit(session.exit_status)


class _WorkerOpening:
    """A worker's part in :func:`start`, with every server."""

    def __init__(self, rt: Runtime, served: List[Tuple[ModelLayout, List[Piece]]], wire_dtype: torch.dtype,
                 build: Callable[[List[Any]], Worker], untrained_state: Dict[str, torch.Tensor],
                 slices: List[Tuple[int, int]], names: Slices):
        self.rt, self.served, self.wire_dtype, self.build = rt, served, wire_dtype, build
        self.untrained_state, self.slices, self.names = untrained_state, slices, names
        self.channels: List[Any] = []
        self.worker: Optional[Worker] = None

    def find_checkpoint(self) -> None:
        """Nothing: the server looks."""

    def open_windows(self, shard: int, comm: Any) -> None:
        self.channels.append(open_worker_channel(comm, self.served[shard][0], self.wire_dtype,
                                                 worker=self.rt.worker_rank, num_workers=self.rt.num_workers,
                                                 server=self.names.server_name(shard)))
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
    servers = slices_for(rt.servers, layout, [pieces for _, pieces in served])
    opening = _WorkerOpening(rt, served, wire_dtype,
                             lambda channels: Worker(optimizer, layout, channels, wire_dtype, check_finite, slices),
                             untrained_state, slices, servers)
    resumed = start(comms, opening)
    worker = opening.worker
    pushes_before = 0
    if resumed.update is not None:
        worker.read()
        pushes_before = resumed.pushes[rt.worker_rank]
    worker.load_weights()
    session = WorkerSession(rt, worker, untrained_state, comms, servers, pushes_before)
    rt.session = session
    rt.lifecycle.start_training(stops_on_signal=True, grace=stop_grace_seconds())
    return session

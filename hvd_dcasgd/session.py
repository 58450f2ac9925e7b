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

import os
import sys
import time
from dataclasses import asdict
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from . import preemption
from .checkpoints import Checkpoints
from .cuts import Cuts
from .compensation import Compensation
from .config import setting
from .endpoints import open_server, open_worker_channel
from .errors import HvdDcasgdError, HvdDcasgdValueError
from .exits import PREEMPTED, WORKER_DROPPED, abort, flush
from .mpi import transport
from .layout import ModelLayout, trained_parameters, untrained_state
from .runtime import SERVER, Runtime
from .server import ParameterServer
from .shards import Piece, merge_states, shard_layout, shard_optimizer, shard_state, shard_tensors
from .stall import StallWatch, stall_timeout_seconds, stall_warning_seconds
from .telemetry import Telemetry, cut_trace
from .tensors import broadcast_, snapshot, to_cpu
from .worker import Worker


def _describe(rt: Runtime, layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype,
              check_finite: bool) -> Dict[str, Any]:
    return {"layout": layout, "compensation": asdict(compensation), "wire": str(wire_dtype).replace("torch.", ""),
            "host": rt.mpi.Get_processor_name(), "check_finite": check_finite}


def _disagreements(server: Dict[str, Any], workers: List[Dict[str, Any]]) -> List[str]:
    problems = []
    for m, worker in enumerate(workers):
        theirs, mine = worker["compensation"], server["compensation"]
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
                f"every rank must use the same (check HVD_DCASGD_LAMBDA)."
            )
        if worker["wire"] != server["wire"]:
            problems.append(
                f"hvd_dcasgd: worker {m} compresses gradients to {worker['wire']}, the server expects "
                f"{server['wire']}; every rank must use the same compression."
            )
        difference = server["layout"].mismatch(worker["layout"])
        if difference:
            problems.append(f"hvd_dcasgd: worker {m}'s model does not match the server's: {difference}.")
    return problems


def agree(rt: Runtime, comm: Any, layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype,
          check_finite: bool = False) -> List[Dict[str, Any]]:
    """Raise the same clear error on every rank of ``comm`` (a server's
    session) unless all its ranks agree.  Returns (on the server) each
    worker's description: its ``name`` for messages (index, MPI rank, host)
    and whether it checks its gradients."""
    gathered = comm.gather(_describe(rt, layout, compensation, wire_dtype, check_finite), root=0)
    problems = _disagreements(gathered[0], gathered[1:]) if rt.role == SERVER else None
    problems = comm.bcast(problems, root=0)
    if problems:
        raise HvdDcasgdError("\n".join(problems), collective=True)
    if rt.role != SERVER:
        return []
    return [{**d, "name": f"worker {m} (MPI rank {m + rt.servers}, host {d['host']})"}
            for m, d in enumerate(gathered[1:])]


def _extras(model: Optional[torch.nn.Module], optimizer: torch.optim.Optimizer) -> Dict[str, torch.Tensor]:
    if model is None:
        return {}
    return untrained_state(model, trained_parameters(optimizer))


def combine_buffers(mpi: Any, workers: Any, buffers: List[torch.Tensor]) -> None:
    """Among ``workers`` (a communicator of workers): where a buffer differs
    between them, average it (floating point: BatchNorm statistics) or sum it
    (integers: counters); where it is the same everywhere (frozen
    parameters), leave it alone."""
    for buffer in buffers:
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


CONTROL_TAG = 7301


class ControlRequests:
    """Requests a worker makes of the server outside the push protocol -- the
    server's optimizer state, Horovod's checkpoint-restore idiom -- as
    point-to-point messages the server answers between polls."""

    def __init__(self, rt: Runtime, comm: Any, server: Optional[ParameterServer] = None):
        """Over ``comm``, a server's session (the server at rank 0)."""
        self.rt, self.comm, self.server = rt, comm, server

    def ask(self, request: Dict[str, Any]) -> Any:
        """Worker side: send ``request``, wait for the answer, return its result."""
        self.comm.send(request, dest=0, tag=CONTROL_TAG)
        problem, result = self.comm.recv(source=0, tag=CONTROL_TAG)
        if problem:
            raise HvdDcasgdError(problem)
        return result

    def _handle(self, request: Dict[str, Any]) -> Any:
        kind = request["kind"]
        if kind == "set_state":
            return self.server.set_state(request["params"], request["extras"])
        if kind == "load_optimizer_state":
            return self.server.load_optimizer_state(request["state"])
        if kind == "optimizer_state":
            return to_cpu(self.server.optimizer.state_dict())
        if kind == "snapshot":
            return self.server.snapshot_for(int(request["worker"]))
        raise HvdDcasgdValueError(f"unknown request {kind!r}")

    def answer(self) -> None:
        """Server side: handle every pending request; a failure goes back to
        the worker that asked, as its error, and leaves the server as it was."""
        status = self.rt.mpi.Status()
        while self.comm.Iprobe(source=self.rt.mpi.ANY_SOURCE, tag=CONTROL_TAG, status=status):
            source = status.Get_source()
            request = self.comm.recv(source=source, tag=CONTROL_TAG)
            try:
                reply = (None, self._handle(request))
            except Exception as exc:  # reported to the worker, which raises it
                reply = (f"hvd_dcasgd: the server could not {request.get('kind')}: {exc}", None)
            self.comm.send(reply, dest=source, tag=CONTROL_TAG)


def final_exchange(comm: Any, extras: List[torch.Tensor], weights: torch.Tensor,
                   optimizer_state: Optional[Dict[str, Any]], free: Callable[[], None]) -> Dict[str, Any]:
    """The end of a session, run by every rank of ``comm`` (the server at
    rank 0, then the workers): the same collectives in the same order on both
    sides, so they cannot drift apart.  The workers' combined buffers come
    from the first worker (rank 1), the server's final weights and optimizer
    state from rank 0; then ``free`` releases the windows."""
    broadcast_(comm, extras, root=1)
    broadcast_(comm, [weights], root=0)
    optimizer_state = comm.bcast(optimizer_state, root=0)
    free()
    return optimizer_state


def survivors(rt: Runtime, session: Any, dropped: List[int], servers: int = 1) -> Tuple[Any, Any]:
    """The communicator of the ``servers`` server(s) and the workers not
    ``dropped`` (of ``session``: a server's session, or the world), and the
    workers' part of it (``COMM_NULL`` on a server); collective over those
    ranks only, so a dropped worker need not take part."""
    ranks = list(range(servers)) + [m + servers for m in range(rt.num_workers) if m not in dropped]
    group = session.Get_group().Incl(ranks)
    comm = session.Create_group(group, tag=CONTROL_TAG)
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
    """A server's side of a session: serve, finish, report."""

    server_holds_weights = True
    stops_on_signal = True

    def __init__(self, rt: Runtime, comm: Any, server: ParameterServer, names: List[str],
                 checkpoints: Optional[Checkpoints] = None, model_params: Optional[List[torch.Tensor]] = None,
                 cuts: Optional[Cuts] = None):
        """``comm`` is this server's session with the workers; with several
        servers, ``model_params`` are the model's trained parameters, which
        take every server's final weights at the end, and ``cuts`` makes
        their checkpoints consistent."""
        self.rt, self.comm, self.server, self.names, self.checkpoints = rt, comm, server, names, checkpoints
        self.model_params, self.cuts = model_params, cuts
        self.last_checkpoint = None

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: the collectives take no part on the server."""

    def register_buffers(self, tensors: List[torch.Tensor]) -> None:
        """Nothing to do: the workers combine their buffers among themselves."""

    def serve(self) -> None:
        self.server.serve(ControlRequests(self.rt, self.comm, self.server).answer,
                          StallWatch(self.names, stall_warning_seconds()), self.checkpoints,
                          stop=lambda: preemption.requested() is not None, cuts=self.cuts)

    def _write_last_checkpoint(self) -> None:
        """The last checkpoint: the buffers are combined, and the windows
        still open (on the CPU the backups live in them)."""
        if self.checkpoints is not None:  # with several servers, one more cut: everything applied everywhere
            number = None if self.cuts is None else self.cuts.number + 1
            self.last_checkpoint = self.server.checkpoint(self.checkpoints, number)

    def _free(self) -> None:
        """The last checkpoint, then free the windows."""
        self._write_last_checkpoint()
        self.server.free()

    def finish(self) -> None:
        server, rt = self.server, self.rt
        dropped = [m for m, d in enumerate(server.channel.dropped) if d]
        comm = survivors(rt, self.comm, dropped)[0] if dropped else self.comm
        final_exchange(comm, list(server.extras.values()), server.weights, snapshot(server.optimizer.state_dict()),
                       # with a dropped worker the windows cannot be freed (that is collective with it)
                       self._free if not dropped else self._write_last_checkpoint)
        if self.model_params is not None:
            self._take_every_slice(survivors(rt, rt.world, dropped, rt.servers)[0] if dropped else rt.world)
        self._report()
        if server.stopped_at is not None:
            saved = f"checkpoint {self.last_checkpoint}" if self.last_checkpoint else \
                "nothing saved (no HVD_DCASGD_CHECKPOINT_DIR)"
            print(f"{server.telemetry.name}: stopped at update {server.stopped_at}, asked by "
                  f"{preemption.signal_name(preemption.requested())}: {saved}; exit status {PREEMPTED} (preempted): "
                  "run the same command again to resume.", file=sys.stderr)
            flush()
        if dropped:
            names = ", ".join(self.names[m] for m in dropped)
            end_without_dropped(rt, comm, f"hvd_dcasgd: {names} stopped pushing and was dropped after "
                                          f"{stall_timeout_seconds():g} s (HVD_DCASGD_STALL_TIMEOUT); the other "
                                          f"workers finished; ending the job with status {WORKER_DROPPED}.")

    def _take_every_slice(self, world: Any) -> None:
        """With several servers: the whole model's final weights, from the
        first worker still there (which put every server's slice together),
        into this server's model; over ``world``, every rank still there."""
        full = torch.empty(sum(p.numel() for p in self.model_params), dtype=self.server.weights.dtype)
        broadcast_(world, [full], root=self.rt.servers)
        offset = 0
        with torch.no_grad():
            for p in self.model_params:
                p.data = full[offset:offset + p.numel()].view(p.shape).to(p.device)
                offset += p.numel()

    def _report(self) -> None:
        """Print this server's summary; write ``HVD_DCASGD_SUMMARY`` (with
        several servers, the first writes every server's and the merged one)."""
        telemetry = self.server.telemetry
        print(telemetry.summary(), file=sys.stderr, flush=True)
        path = setting("HVD_DCASGD_SUMMARY")
        if self.rt.servers == 1:
            if path:
                telemetry.write_summary(path)
            return
        shards = self.rt.workers.gather(telemetry.summary_dict(), root=0)  # the servers
        if self.rt.shard == 0:
            merged = Telemetry.merge(shards)
            print(Telemetry.describe(merged, f"hvd_dcasgd servers (all {self.rt.servers})"), file=sys.stderr,
                  flush=True)
            if path:
                Telemetry.write(path, merged)

    @property
    def exit_status(self) -> int:
        return PREEMPTED if self.server.stopped_at is not None else 0


class WorkerSession:
    """A worker's side of a session: the exchange object, and how to finish.
    With several servers, one session per server, finished together."""

    server_holds_weights = True  # broadcasts while training also reach the server
    stops_on_signal = True

    def __init__(self, rt: Runtime, worker: Worker, extras: Dict[str, torch.Tensor], comms: List[Any],
                 layout: ModelLayout, pieces: List[List[Piece]], pushes_before: int = 0):
        """``comms[s]`` is server s's session, whose slice of ``layout`` is
        ``pieces[s]``."""
        self.rt, self.worker, self.extras = rt, worker, extras
        self.comms, self.layout, self.pieces = comms, layout, pieces
        self.buffers: List[torch.Tensor] = list(extras.values())
        self.requests = [ControlRequests(rt, comm) for comm in comms]
        self.finished = False
        self.pushes_before = pushes_before  # applied before this job started (a resumed job)
        self._asked_to_stop = False

    @property
    def pushes(self) -> int:
        """This worker's pushes the server has taken, this job and the ones it resumes."""
        return self.pushes_before + self.worker.pushes

    def register_buffers(self, tensors: List[torch.Tensor]) -> None:
        """Also combine these (the non-trained entries of a state dict the
        script broadcast) at the end."""
        known = {t.data_ptr() for t in self.buffers} | {p.data_ptr() for p in self.worker.params}
        self.buffers += [t for t in tensors if t.data_ptr() not in known and t.numel()]

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Send these state-dict entries to the servers: trained parameters by
        their index in the layout (so no names are needed; each server its
        slice of them), the rest of the model's state by name."""
        index = {p.data_ptr(): i for i, p in enumerate(self.worker.params)}
        params = {index[t.data_ptr()]: t.detach().cpu() for _, t in items if t.data_ptr() in index}
        extras = {n: t.detach().cpu() for n, t in items if n in self.extras and t.data_ptr() not in index}
        for requests, pieces in zip(self.requests, self.pieces):
            requests.ask({"kind": "set_state", "params": shard_tensors(params, pieces), "extras": extras})

    def load_optimizer_state(self, state: Dict[str, Any]) -> None:
        """Load an optimizer state on the servers (each its slice of it)."""
        state = to_cpu(state)
        for requests, pieces in zip(self.requests, self.pieces):
            requests.ask({"kind": "load_optimizer_state",
                          "state": state if len(self.pieces) == 1 else shard_state(state, self.layout, pieces)})

    def snapshot(self) -> Dict[str, Any]:
        """The servers' optimizer state, with the model brought to the weights
        of the same moment (this worker's backup from now on), per server."""
        states = [requests.ask({"kind": "snapshot", "worker": self.worker.index}) for requests in self.requests]
        self.worker.read()
        return states[0] if len(states) == 1 else merge_states(states, self.layout, self.pieces)

    def exchange(self) -> None:
        """One step's exchange; then stop the script if the job was asked to."""
        self.worker.exchange()
        signal = preemption.requested()
        if signal is not None and not self._asked_to_stop:
            for channel in self.worker.channels:
                channel.ask_to_stop()
            self._asked_to_stop = True
        if signal is not None or self.worker.stopping:
            raise preemption.Preempted(
                f"hvd_dcasgd: worker {self.worker.index} stops after push {self.pushes - 1}: the job was "
                f"asked to stop ({preemption.signal_name(signal)}); the server saves a checkpoint.")

    def finish(self) -> None:
        self.finished = True
        channels = self.worker.channels
        for channel in channels:
            channel.leave()
        for channel in channels:
            channel.wait_closed()
        dropped = sorted({m for channel in channels for m in channel.dropped_workers()})
        if dropped:  # every server dropped the same workers
            ends = [survivors(self.rt, comm, dropped) for comm in self.comms]
            combine_buffers(self.rt.mpi, ends[0][1], self.buffers)
            for (comm, _), (start, end) in zip(ends, self.worker.slices):
                final_exchange(comm, list(self.extras.values()), self.worker.weights[start:end], None, lambda: None)
            if len(ends) > 1:
                world = survivors(self.rt, self.rt.world, dropped, self.rt.servers)[0]
                broadcast_(world, [self.worker.weights], root=self.rt.servers)
            self.rt.ending = lambda: end_without_dropped(self.rt, ends[0][0], "")
            state = None
        else:
            combine_buffers(self.rt.mpi, self.rt.workers, self.buffers)
            states = [final_exchange(comm, list(self.extras.values()), self.worker.weights[start:end], None,
                                     channel.free)
                      for comm, channel, (start, end) in zip(self.comms, channels, self.worker.slices)]
            if len(states) > 1:
                broadcast_(self.rt.world, [self.worker.weights], root=self.rt.servers)  # to every server
            state = states[0] if len(states) == 1 else merge_states(states, self.layout, self.pieces)
        self.worker.load_weights()
        if state is not None:
            self.worker.optimizer.load_state_dict(state)


class HorovodSession:
    """Horovod's synchronous baseline on a worker: the workers allreduce among
    themselves; finishing only releases the idle server rank."""

    server_holds_weights = False
    stops_on_signal = False  # Horovod's own optimizer steps: a signal does what it always did

    def __init__(self, rt: Runtime):
        self.rt = rt

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: the server rank holds no model."""

    def register_buffers(self, tensors: List[torch.Tensor]) -> None:
        """Nothing to do: Horovod's workers keep their own buffers."""

    def finish(self) -> None:
        self.rt.world.Ibarrier().Wait()


def idle_server(rt: Runtime) -> None:
    """The server rank in Horovod's baseline: nothing to serve.  Wait, sleeping
    rather than spinning so the workers keep the CPU, until every worker has
    finished, then exit with status 0."""
    finished = rt.world.Ibarrier()
    while not finished.Test():
        time.sleep(0.05)
    sys.exit(0)


def _resume(server: ParameterServer, found: Optional[Tuple[Any, Dict[str, Any]]]) -> Dict[str, Any]:
    """Load the newest checkpoint into ``server``; what the workers need to know."""
    if found is None:
        return {"from": None}
    path, state = found
    try:
        server.load_state_dict(state)
    except HvdDcasgdError as exc:
        raise HvdDcasgdError(f"{exc} (checkpoint {path}; another HVD_DCASGD_CHECKPOINT_DIR starts afresh)") from None
    server.channel.mailboxes.sync()  # every backup is in its outbox, for the workers to read
    print(f"{server.telemetry.name}: resuming from update {server.updates} ({path})", file=sys.stderr, flush=True)
    return {"from": server.updates, "path": str(path),
            "pushes": [a + r for a, r in zip(server.telemetry.pushes, server.telemetry.refused)]}


def _on_server(rt: Runtime, comm: Any, attempt: Callable[[], Any]) -> Any:
    """Run ``attempt`` on the server of ``comm`` (its result there, ``None``
    elsewhere); a failure is raised on every rank alike, never a hang."""
    result, problem = None, None
    if rt.role == SERVER:
        try:
            result = attempt()
        except HvdDcasgdError as exc:
            problem = str(exc)
    problem = comm.bcast(problem, root=0)
    if problem:
        raise HvdDcasgdError(problem, collective=True)
    return result


def _server_name(rt: Runtime, shard: int) -> Optional[str]:
    """How messages name server ``shard`` (the default with one server)."""
    return None if rt.servers == 1 else f"server {shard} (MPI rank {shard})"


def _open_trace(rt: Runtime, path: Optional[str], slice_: Tuple[int, int],
                resume_from: Optional[int]) -> Telemetry:
    """The server's telemetry.  With several servers they all append to one
    trace, which the first empties (or, resuming, cuts each server's lines
    at its checkpoint) before any writes (a barrier among them)."""
    if rt.servers == 1:
        return Telemetry(rt.num_workers, path, resume_from=resume_from)
    resumed = rt.workers.gather(resume_from, root=0)  # the servers
    if path and rt.shard == 0:
        if resume_from is None:
            open(path, "w").close()
        elif os.path.exists(path):
            cut_trace(path, dict(enumerate(resumed)))
    rt.workers.Barrier()
    start, end = slice_
    return Telemetry(rt.num_workers, path, resume_from=resume_from, shard=(rt.shard, start, end - start))


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
) -> None:
    """Serve the workers until they all leave, finish, and exit: status 0,
    or 75 when the job was asked to stop.  With several servers this one
    serves ``slices[rt.shard]`` of the flat parameter vector."""
    slices = slices or [(0, layout.numel)]
    comm = rt.shard_comms[rt.shard]
    workers = agree(rt, comm, layout, compensation, wire_dtype)
    extras = _extras(model, optimizer)
    params = trained_parameters(optimizer)
    served_layout, served_optimizer = layout, optimizer
    if rt.servers > 1:  # every server starts from the first one's model
        broadcast_(rt.workers, [*params, *extras.values()], root=0)
        served_layout, pieces = shard_layout(layout, *slices[rt.shard])
        served_optimizer = shard_optimizer(optimizer, layout, pieces)
    checkpoints, found, number = _on_server(rt, comm, lambda: _open_checkpoints(rt, checkpoint_dir))
    telemetry = _open_trace(rt, trace_path, slices[rt.shard], int(found[1]["updates"]) if found else None)
    telemetry.note_transport(transport(rt.mpi), rt.mpi.Get_processor_name(), [w["host"] for w in workers])
    server = open_server(comm, served_optimizer, served_layout, compensation, num_workers=rt.num_workers,
                         wire_dtype=wire_dtype, device=device, telemetry=telemetry,
                         extras=extras, checked_by_workers=[w["check_finite"] for w in workers])
    comm.bcast(_on_server(rt, comm, lambda: _resume(server, found)), root=0)
    broadcast_(comm, [server.weights, *extras.values()], root=0)
    cuts = Cuts(rt.mpi, rt.workers, number or 0) if rt.servers > 1 else None
    session = ServerSession(rt, comm, server, [w["name"] for w in workers], checkpoints,
                            params if rt.servers > 1 else None, cuts)
    rt.session = session
    session.serve()
    rt.session = None
    session.finish()
    sys.exit(session.exit_status)


def _open_checkpoints(rt: Runtime, folder: Optional[str]) -> Tuple[Optional[Checkpoints], Any, Optional[int]]:
    """This server's checkpoint folder, the checkpoint to resume from (path,
    content) and, with several servers, its cut's number: the newest cut
    every server holds (the servers agree on it, collective among them)."""
    problem, checkpoints = None, None
    try:
        checkpoints = Checkpoints.from_settings(folder, rt.shard, rt.servers)
    except HvdDcasgdError as exc:
        problem = exc
    if rt.servers == 1:
        if problem is not None:
            raise problem
        return checkpoints, (checkpoints.newest() if checkpoints is not None else None), None
    held = rt.workers.allgather(None if checkpoints is None else [n for n, _ in checkpoints.paths()])
    if problem is not None:
        raise problem
    if checkpoints is None:
        return None, None, None
    if any(numbers is None for numbers in held):
        raise HvdDcasgdError(f"hvd_dcasgd: server {held.index(None)} could not open its checkpoint folder")
    common = set.intersection(*(set(numbers) for numbers in held))
    if not common and any(held):
        raise HvdDcasgdError(f"hvd_dcasgd: the servers' checkpoints in {checkpoints.top} ({held}) share no cut; "
                             "they cannot be resumed together (another HVD_DCASGD_CHECKPOINT_DIR starts afresh)")
    number = max(common) if common else None
    return checkpoints, (checkpoints.newest(number) if number is not None else None), number


def start_worker(
    rt: Runtime,
    optimizer: torch.optim.Optimizer,
    layout: ModelLayout,
    compensation: Compensation,
    wire_dtype: torch.dtype,
    model: Optional[torch.nn.Module],
    check_finite: bool,
    slices: Optional[List[Tuple[int, int]]] = None,
) -> WorkerSession:
    """Join every server's session and load the servers' weights and
    buffers; in a resumed job, this worker's own backup (the weights it last
    received).  Each step of the start runs with every server in turn."""
    slices = slices or [(0, layout.numel)]
    comms = rt.shard_comms
    for comm in comms:
        agree(rt, comm, layout, compensation, wire_dtype, check_finite)
    extras = _extras(model, optimizer)
    for comm in comms:
        _on_server(rt, comm, lambda: None)  # the server opens its checkpoint folder
    served = [shard_layout(layout, start, end) for start, end in slices]
    channels = [open_worker_channel(comm, served_layout, wire_dtype, worker=rt.worker_rank,
                                    num_workers=rt.num_workers, server=_server_name(rt, s))
                for s, (comm, (served_layout, _)) in enumerate(zip(comms, served))]
    worker = Worker(optimizer, layout, channels, wire_dtype, check_finite, slices)
    for comm in comms:
        _on_server(rt, comm, lambda: None)  # the server resumes
    resume = [comm.bcast(None, root=0) for comm in comms][0]
    for comm, (start, end) in zip(comms, slices):
        broadcast_(comm, [worker.weights[start:end], *extras.values()], root=0)
    pushes_before = 0
    if resume["from"] is not None:
        worker.read()
        pushes_before = resume["pushes"][rt.worker_rank]
    worker.load_weights()
    session = WorkerSession(rt, worker, extras, comms, layout, [pieces for _, pieces in served], pushes_before)
    rt.session = session
    return session

"""Start and end of a training session, collective over every rank.

Start: every rank describes its model and settings; the server checks that
they agree (a mismatch is an error on every rank, never a hang), opens the
windows and broadcasts its initial weights and the rest of the model's state
(buffers, frozen parameters).  End: buffers that differ between workers
(BatchNorm statistics) are combined -- floating-point ones averaged, integer
counters summed -- and shared with the server, and the server's final weights
are broadcast, so a model saved on any rank evaluates alike.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Tuple

import torch

from .channel import ServerChannel, WorkerChannel, control_words
from .compensation import Compensation
from .errors import HvdDcasgdError
from .collectives import broadcast_
from .layout import ModelLayout, PushMessage, trained_parameters, untrained_state
from .runtime import SERVER, Runtime
from .server import ParameterServer
from .telemetry import Telemetry
from .transport import ControlWords, Mailboxes
from .worker import Worker


def _describe(layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype) -> Dict[str, Any]:
    return {"layout": layout, "compensation": asdict(compensation), "wire": str(wire_dtype).replace("torch.", "")}


def _disagreements(server: Dict[str, Any], workers: List[Dict[str, Any]]) -> List[str]:
    problems = []
    for m, worker in enumerate(workers):
        theirs, mine = worker["compensation"], server["compensation"]
        if theirs["mode"] != mine["mode"]:
            problems.append(
                f"hvd_dcasgd: the server runs compensation {mine['mode']!r} but worker {m} asks for "
                f"{theirs['mode']!r}; every rank must use the same mode (check HVD_DCASGD_COMPENSATION)."
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


def agree(rt: Runtime, layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype) -> None:
    """Raise the same clear error on every rank unless all ranks agree."""
    gathered = rt.world.gather(_describe(layout, compensation, wire_dtype), root=0)
    problems = _disagreements(gathered[0], gathered[1:]) if rt.role == SERVER else None
    problems = rt.world.bcast(problems, root=0)
    if problems:
        raise HvdDcasgdError("\n".join(problems), collective=True)


def _open_windows(rt: Runtime, layout: ModelLayout, wire_dtype: torch.dtype):
    inbox_bytes = PushMessage.size(layout, wire_dtype)
    outbox_bytes = layout.numel * layout.dtype.itemsize
    try:
        control = ControlWords(rt.mpi, rt.world, control_words(rt.num_workers))
        mailboxes = Mailboxes(rt.mpi, rt.world, rt.num_workers, inbox_bytes, outbox_bytes)
    except rt.mpi.Exception as exc:
        hint = ""
        if rt.mpi.Query_thread() == rt.mpi.THREAD_MULTIPLE:
            hint = (
                " MPI runs at thread level MULTIPLE, which Open MPI's one-sided component over TCP (osc/pt2pt) "
                "refuses: import hvd_dcasgd before mpi4py.MPI, or set mpi4py.rc.thread_level = 'serialized' first."
            )
        raise HvdDcasgdError(
            f"hvd_dcasgd: MPI could not create the parameter server's windows ({exc.Get_error_string()}).{hint}",
            collective=True,
        ) from exc
    return control, mailboxes


def _extras(model: Optional[torch.nn.Module], optimizer: torch.optim.Optimizer) -> Dict[str, torch.Tensor]:
    if model is None:
        return {}
    return untrained_state(model, trained_parameters(optimizer))


def combine_buffers(rt: Runtime, buffers: List[torch.Tensor]) -> None:
    """Among the workers: where a buffer differs between workers, average it
    (floating point: BatchNorm statistics) or sum it (integers: counters);
    where it is the same everywhere (frozen parameters), leave it alone."""
    mpi = rt.mpi
    for buffer in buffers:
        wide = torch.float64 if buffer.is_floating_point() else torch.int64
        host = buffer.detach().to("cpu", dtype=wide, copy=True).contiguous()
        low, high = host.clone(), host.clone()
        rt.workers.Allreduce(mpi.IN_PLACE, low.numpy(), op=mpi.MIN)
        rt.workers.Allreduce(mpi.IN_PLACE, high.numpy(), op=mpi.MAX)
        if torch.equal(low, high):
            continue
        rt.workers.Allreduce(mpi.IN_PLACE, host.numpy(), op=mpi.SUM)
        if buffer.is_floating_point():
            host.div_(rt.num_workers)
        with torch.no_grad():
            buffer.copy_(host)


CONTROL_TAG = 7301


def to_cpu(value: Any) -> Any:
    """``value`` (a state dict) with every tensor moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


class ControlRequests:
    """Requests a worker makes of the server outside the push protocol -- the
    server's optimizer state, Horovod's checkpoint-restore idiom -- as
    point-to-point messages the server answers between polls."""

    def __init__(self, rt: Runtime, server: Optional[ParameterServer] = None):
        self.rt, self.server = rt, server

    def ask(self, request: Dict[str, Any]) -> Any:
        """Worker side: send ``request``, wait for the answer, return its result."""
        self.rt.world.send(request, dest=0, tag=CONTROL_TAG)
        problem, result = self.rt.world.recv(source=0, tag=CONTROL_TAG)
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
        raise ValueError(f"unknown request {kind!r}")

    def answer(self) -> None:
        """Server side: handle every pending request; a failure goes back to
        the worker that asked, as its error, and leaves the server as it was."""
        status = self.rt.mpi.Status()
        while self.rt.world.Iprobe(source=self.rt.mpi.ANY_SOURCE, tag=CONTROL_TAG, status=status):
            source = status.Get_source()
            request = self.rt.world.recv(source=source, tag=CONTROL_TAG)
            try:
                reply = (None, self._handle(request))
            except Exception as exc:  # reported to the worker, which raises it
                reply = (f"hvd_dcasgd: the server could not {request.get('kind')}: {exc}", None)
            self.rt.world.send(reply, dest=source, tag=CONTROL_TAG)


class ServerSession:
    """The server's side of a session: serve, finish, report."""

    def __init__(self, rt: Runtime, server: ParameterServer, control: ControlWords, mailboxes: Mailboxes,
                 extras: Dict[str, torch.Tensor]):
        self.rt, self.server, self.control, self.mailboxes, self.extras = rt, server, control, mailboxes, extras

    def finish(self) -> None:
        broadcast_(self.rt.world, list(self.extras.values()), root=1)
        broadcast_(self.rt.world, [self.server.weights], root=0)
        self.rt.world.bcast(to_cpu(self.server.optimizer.state_dict()), root=0)
        self.control.free()
        self.mailboxes.free()
        self.server.telemetry.close()
        print(self.server.telemetry.summary(), file=sys.stderr, flush=True)


class WorkerSession:
    """A worker's side of a session: the exchange object, and how to finish."""

    server_holds_weights = True  # broadcasts while training also reach the server

    def __init__(self, rt: Runtime, worker: Worker, control: ControlWords, mailboxes: Mailboxes,
                 extras: Dict[str, torch.Tensor]):
        self.rt, self.worker, self.control, self.mailboxes, self.extras = rt, worker, control, mailboxes, extras
        self.buffers: List[torch.Tensor] = list(extras.values())
        self.requests = ControlRequests(rt)
        self.finished = False

    def register_buffers(self, tensors: List[torch.Tensor]) -> None:
        """Also combine these (the non-trained entries of a state dict the
        script broadcast) at the end."""
        known = {t.data_ptr() for t in self.buffers} | {p.data_ptr() for p in self.worker.params}
        self.buffers += [t for t in tensors if t.data_ptr() not in known and t.numel()]

    def state_for_server(self, items: List[Tuple[str, torch.Tensor]]) -> Dict[str, Any]:
        """A restore request for these state-dict entries: trained parameters
        by their index in the layout (so no names are needed), the rest of the
        model's state by name."""
        index = {p.data_ptr(): i for i, p in enumerate(self.worker.params)}
        params = {index[t.data_ptr()]: t.detach().cpu() for _, t in items if t.data_ptr() in index}
        extras = {n: t.detach().cpu() for n, t in items if n in self.extras and t.data_ptr() not in index}
        return {"kind": "set_state", "params": params, "extras": extras}

    def finish(self) -> None:
        self.finished = True
        self.worker.channel.leave()
        self.worker.channel.wait_closed()
        combine_buffers(self.rt, self.buffers)
        broadcast_(self.rt.world, list(self.extras.values()), root=1)
        broadcast_(self.rt.world, [self.worker.weights], root=0)
        self.worker.load_weights()
        self.worker.optimizer.load_state_dict(self.rt.world.bcast(None, root=0))
        self.control.free()
        self.mailboxes.free()


class HorovodSession:
    """Horovod's synchronous baseline on a worker: the workers allreduce among
    themselves; finishing only releases the idle server rank."""

    server_holds_weights = False

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.finished = False

    def finish(self) -> None:
        self.finished = True
        self.rt.world.Ibarrier().Wait()


def idle_server(rt: Runtime) -> None:
    """The server rank in Horovod's baseline: nothing to serve.  Wait, sleeping
    rather than spinning so the workers keep the CPU, until every worker has
    finished, then exit with status 0."""
    finished = rt.world.Ibarrier()
    while not finished.Test():
        time.sleep(0.05)
    sys.exit(0)


def run_server(
    rt: Runtime,
    optimizer: torch.optim.Optimizer,
    layout: ModelLayout,
    compensation: Compensation,
    wire_dtype: torch.dtype,
    model: Optional[torch.nn.Module],
    device: torch.device,
    trace_path: Optional[str],
) -> None:
    """Serve the workers until they all leave, finish, and exit with status 0."""
    agree(rt, layout, compensation, wire_dtype)
    control, mailboxes = _open_windows(rt, layout, wire_dtype)
    channel = ServerChannel(control, mailboxes, rt.num_workers)
    telemetry = Telemetry(rt.num_workers, trace_path)
    extras = _extras(model, optimizer)
    server = ParameterServer(optimizer, layout, compensation, mailboxes, channel, wire_dtype, device, telemetry,
                             extras=extras)
    broadcast_(rt.world, [server.weights, *extras.values()], root=0)
    rt.session = ServerSession(rt, server, control, mailboxes, extras)
    server.serve(ControlRequests(rt, server).answer)
    session, rt.session = rt.session, None
    session.finish()
    sys.exit(0)


def start_worker(
    rt: Runtime,
    optimizer: torch.optim.Optimizer,
    layout: ModelLayout,
    compensation: Compensation,
    wire_dtype: torch.dtype,
    model: Optional[torch.nn.Module],
    check_finite: bool,
) -> WorkerSession:
    """Join the session and load the server's initial weights and buffers."""
    agree(rt, layout, compensation, wire_dtype)
    control, mailboxes = _open_windows(rt, layout, wire_dtype)
    channel = WorkerChannel(control, mailboxes, rt.worker_rank)
    worker = Worker(optimizer, layout, channel, wire_dtype, check_finite)
    extras = _extras(model, optimizer)
    broadcast_(rt.world, [worker.weights, *extras.values()], root=0)
    worker.load_weights()
    session = WorkerSession(rt, worker, control, mailboxes, extras)
    rt.session = session
    return session

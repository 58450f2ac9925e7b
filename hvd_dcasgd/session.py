"""Start and end of a training session, collective over every rank.

Start: every rank describes its model and settings; the server checks that
they agree (a mismatch is an error on every rank, never a hang), opens the
windows and broadcasts its initial weights and buffers.  End: buffers
(BatchNorm statistics) are combined over the workers -- floating-point ones
averaged, integer counters summed -- and the server's final weights are
broadcast, so a model saved on any rank evaluates alike.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any, Dict, List, Optional

import torch

from .channel import ServerChannel, WorkerChannel, control_words
from .compensation import Compensation
from .errors import HvdDcasgdError
from .layout import ModelLayout, PushMessage, byte_view
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
    control = ControlWords(rt.mpi, rt.world, control_words(rt.num_workers))
    inbox_bytes = PushMessage(layout, wire_dtype, storage=torch.empty(0, dtype=torch.uint8)).nbytes
    outbox_bytes = layout.numel * layout.dtype.itemsize
    mailboxes = Mailboxes(rt.mpi, rt.world, rt.num_workers, inbox_bytes, outbox_bytes)
    return control, mailboxes


def _buffers(model: Optional[torch.nn.Module]) -> List[torch.Tensor]:
    return [b for _, b in model.named_buffers()] if model is not None else []


def _broadcast(rt: Runtime, host: torch.Tensor) -> None:
    """Broadcast a contiguous CPU tensor from the server, in place."""
    rt.world.Bcast(byte_view(host), root=0)


def _broadcast_buffers(rt: Runtime, buffers: List[torch.Tensor]) -> None:
    for buffer in buffers:
        host = buffer.detach().to("cpu", copy=True).contiguous()
        _broadcast(rt, host)
        buffer.data.copy_(host)


def _combine_buffers(rt: Runtime, buffers: List[torch.Tensor]) -> None:
    """Average floating-point buffers over the workers, sum integer ones."""
    for buffer in buffers:
        host = buffer.detach().to("cpu", copy=True).contiguous()
        if rt.role == SERVER:
            host.zero_()
        rt.world.Allreduce(rt.mpi.IN_PLACE, host.numpy(), op=rt.mpi.SUM)
        if host.dtype.is_floating_point:
            host.div_(rt.num_workers)
        buffer.data.copy_(host)


class ServerSession:
    """The server's side of a session: serve, finish, report."""

    def __init__(self, rt: Runtime, server: ParameterServer, control: ControlWords, mailboxes: Mailboxes, buffers):
        self.rt, self.server, self.control, self.mailboxes, self.buffers = rt, server, control, mailboxes, buffers

    def finish(self) -> None:
        _combine_buffers(self.rt, self.buffers)
        _broadcast(self.rt, self.server.weights.detach().cpu())
        self.control.free()
        self.mailboxes.free()
        self.server.telemetry.close()
        print(self.server.telemetry.summary(), file=sys.stderr, flush=True)


class WorkerSession:
    """A worker's side of a session: the exchange object, and how to finish."""

    def __init__(self, rt: Runtime, worker: Worker, control: ControlWords, mailboxes: Mailboxes, buffers):
        self.rt, self.worker, self.control, self.mailboxes, self.buffers = rt, worker, control, mailboxes, buffers

    def finish(self) -> None:
        self.worker.channel.leave()
        self.worker.channel.wait_closed()
        _combine_buffers(self.rt, self.buffers)
        _broadcast(self.rt, self.worker.weights)
        self.worker.load_weights()
        self.control.free()
        self.mailboxes.free()


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
    server = ParameterServer(optimizer, layout, compensation, mailboxes, channel, wire_dtype, device, telemetry)
    buffers = _buffers(model)
    _broadcast(rt, server.weights.detach().cpu())
    _broadcast_buffers(rt, buffers)
    rt.session = ServerSession(rt, server, control, mailboxes, buffers)
    server.serve()
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
    buffers = _buffers(model)
    _broadcast(rt, worker.weights)
    worker.load_weights()
    _broadcast_buffers(rt, buffers)
    session = WorkerSession(rt, worker, control, mailboxes, buffers)
    rt.session = session
    return session

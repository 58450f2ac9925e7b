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
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .compensation import Compensation
from .config import setting
from .endpoints import open_server, open_worker
from .errors import HvdDcasgdError, HvdDcasgdValueError
from .layout import ModelLayout, trained_parameters, untrained_state
from .runtime import SERVER, Runtime
from .server import ParameterServer
from .stall import StallWatch, stall_warning_seconds
from .telemetry import Telemetry
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


def agree(rt: Runtime, layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype,
          check_finite: bool = False) -> List[Dict[str, Any]]:
    """Raise the same clear error on every rank unless all ranks agree.
    Returns (on the server) each worker's description: its ``name`` for
    messages (index, MPI rank, host) and whether it checks its gradients."""
    gathered = rt.world.gather(_describe(rt, layout, compensation, wire_dtype, check_finite), root=0)
    problems = _disagreements(gathered[0], gathered[1:]) if rt.role == SERVER else None
    problems = rt.world.bcast(problems, root=0)
    if problems:
        raise HvdDcasgdError("\n".join(problems), collective=True)
    if rt.role != SERVER:
        return []
    return [{**d, "name": f"worker {m} (MPI rank {m + 1}, host {d['host']})"} for m, d in enumerate(gathered[1:])]


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
        raise HvdDcasgdValueError(f"unknown request {kind!r}")

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


def final_exchange(rt: Runtime, extras: List[torch.Tensor], weights: torch.Tensor,
                   optimizer_state: Optional[Dict[str, Any]], free: Callable[[], None]) -> Dict[str, Any]:
    """The end of a session, run by every rank: the same collectives in the
    same order on both sides, so they cannot drift apart.  The workers'
    combined buffers come from worker 0 (world rank 1), the server's final
    weights and optimizer state from rank 0; then the windows are freed."""
    broadcast_(rt.world, extras, root=1)
    broadcast_(rt.world, [weights], root=0)
    optimizer_state = rt.world.bcast(optimizer_state, root=0)
    free()
    return optimizer_state


class ServerSession:
    """The server's side of a session: serve, finish, report."""

    server_holds_weights = True

    def __init__(self, rt: Runtime, server: ParameterServer):
        self.rt, self.server = rt, server

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: the collectives take no part on the server."""

    def register_buffers(self, tensors: List[torch.Tensor]) -> None:
        """Nothing to do: the workers combine their buffers among themselves."""

    def finish(self) -> None:
        server = self.server
        final_exchange(self.rt, list(server.extras.values()), server.weights, snapshot(server.optimizer.state_dict()),
                       server.free)
        print(server.telemetry.summary(), file=sys.stderr, flush=True)
        summary = setting("HVD_DCASGD_SUMMARY")
        if summary:
            server.telemetry.write_summary(summary)


class WorkerSession:
    """A worker's side of a session: the exchange object, and how to finish."""

    server_holds_weights = True  # broadcasts while training also reach the server

    def __init__(self, rt: Runtime, worker: Worker, extras: Dict[str, torch.Tensor]):
        self.rt, self.worker, self.extras = rt, worker, extras
        self.buffers: List[torch.Tensor] = list(extras.values())
        self.requests = ControlRequests(rt)
        self.finished = False

    def register_buffers(self, tensors: List[torch.Tensor]) -> None:
        """Also combine these (the non-trained entries of a state dict the
        script broadcast) at the end."""
        known = {t.data_ptr() for t in self.buffers} | {p.data_ptr() for p in self.worker.params}
        self.buffers += [t for t in tensors if t.data_ptr() not in known and t.numel()]

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Send these state-dict entries to the server: trained parameters by
        their index in the layout (so no names are needed), the rest of the
        model's state by name."""
        index = {p.data_ptr(): i for i, p in enumerate(self.worker.params)}
        params = {index[t.data_ptr()]: t.detach().cpu() for _, t in items if t.data_ptr() in index}
        extras = {n: t.detach().cpu() for n, t in items if n in self.extras and t.data_ptr() not in index}
        self.requests.ask({"kind": "set_state", "params": params, "extras": extras})

    def finish(self) -> None:
        self.finished = True
        self.worker.channel.leave()
        self.worker.channel.wait_closed()
        combine_buffers(self.rt, self.buffers)
        state = final_exchange(self.rt, list(self.extras.values()), self.worker.weights, None, self.worker.channel.free)
        self.worker.load_weights()
        self.worker.optimizer.load_state_dict(state)


class HorovodSession:
    """Horovod's synchronous baseline on a worker: the workers allreduce among
    themselves; finishing only releases the idle server rank."""

    server_holds_weights = False

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
    workers = agree(rt, layout, compensation, wire_dtype)
    extras = _extras(model, optimizer)
    server = open_server(rt.world, optimizer, layout, compensation, num_workers=rt.num_workers,
                         wire_dtype=wire_dtype, device=device, telemetry=Telemetry(rt.num_workers, trace_path),
                         extras=extras, checked_by_workers=[w["check_finite"] for w in workers])
    broadcast_(rt.world, [server.weights, *extras.values()], root=0)
    rt.session = ServerSession(rt, server)
    server.serve(ControlRequests(rt, server).answer, StallWatch([w["name"] for w in workers], stall_warning_seconds()))
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
    agree(rt, layout, compensation, wire_dtype, check_finite)
    extras = _extras(model, optimizer)
    worker = open_worker(rt.world, optimizer, layout, worker=rt.worker_rank, num_workers=rt.num_workers,
                         wire_dtype=wire_dtype, check_finite=check_finite)
    broadcast_(rt.world, [worker.weights, *extras.values()], root=0)
    worker.load_weights()
    session = WorkerSession(rt, worker, extras)
    rt.session = session
    return session

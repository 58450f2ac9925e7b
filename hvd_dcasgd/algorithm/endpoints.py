"""The one way to build a parameter server or a worker over a communicator.

Both ends open the same two windows (collective over ``comm``, owned by rank
``owner``): the control words and the mailboxes.  The server and the worker
then own their channel and its windows, and free them with ``free()``.  The
session (over every rank), the simulator, the benchmarks and the tests (over
``COMM_SELF``, one rank playing every part) all build them here.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from ..common.errors import HvdDcasgdError
from ..observability.telemetry import Telemetry
from ..protocol.channel import ServerChannel, WorkerChannel, control_words
from ..protocol.layout import ModelLayout, PushMessage
from ..protocol.transport import ControlWords, Mailboxes
from ..protocol.worker import Worker
from ..runtime.lifecycle import Lifecycle
from ..runtime.mpi import load_mpi
from .compensation import Compensation
from .server import ParameterServer

__all__ = ["open_server", "open_windows", "open_worker", "open_worker_channel"]

def _thread_level_hint() -> str:
    """Why MPI runs at thread level MULTIPLE, which Open MPI's one-sided
    component over TCP (osc/pt2pt) refuses, and what changes it."""
    from ..runtime.mpi import MPI_LOADED_FIRST

    if MPI_LOADED_FIRST:
        return (" MPI runs at thread level MULTIPLE, which Open MPI's one-sided component over TCP (osc/pt2pt) "
                "refuses: the script imported mpi4py.MPI before hvd_dcasgd, at mpi4py's default level; import "
                "hvd_dcasgd first (it chooses the level), or set mpi4py.rc.thread_level = 'serialized' before "
                "importing mpi4py.MPI.")
    return (" MPI runs at thread level MULTIPLE (HVD_DCASGD_THREAD_LEVEL, or Horovod's need of it), which Open "
            "MPI's one-sided component over TCP (osc/pt2pt) refuses: set HVD_DCASGD_HOROVOD=0 and leave "
            "HVD_DCASGD_THREAD_LEVEL unset, or launch with hvd-dcasgd-run, which does so under osc/pt2pt.")


def open_windows(comm: Any, layout: ModelLayout, wire_dtype: torch.dtype, num_workers: int,
                 owner: int = 0) -> Tuple[ControlWords, Mailboxes]:
    """The control words and the mailboxes for ``num_workers`` workers,
    allocated on ``owner`` (collective over ``comm``); a clear error, the same
    on every rank, where MPI cannot create them."""
    mpi = load_mpi()
    try:
        control = ControlWords(mpi, comm, control_words(num_workers), owner=owner)
        mailboxes = Mailboxes(mpi, comm, num_workers, PushMessage.size(layout, wire_dtype),
                              layout.numel * layout.dtype.itemsize, owner=owner)
    except mpi.Exception as exc:
        hint = _thread_level_hint() if mpi.Query_thread() == mpi.THREAD_MULTIPLE else ""
        raise HvdDcasgdError(
            f"hvd_dcasgd: MPI could not create the parameter server's windows ({exc.Get_error_string()}).{hint}",
            collective=True, speaks=comm.Get_rank() == 0,
        ) from exc
    return control, mailboxes


def open_server(
    comm: Any,
    optimizer: torch.optim.Optimizer,
    layout: ModelLayout,
    compensation: Compensation,
    *,
    num_workers: int,
    wire_dtype: Optional[torch.dtype] = None,
    device: torch.device = torch.device("cpu"),
    telemetry: Optional[Telemetry] = None,
    staged: Optional[bool] = None,
    untrained_state: Optional[Dict[str, torch.Tensor]] = None,
    update_path: Optional[str] = None,
    checked_by_workers: Optional[Sequence[bool]] = None,
    lr_factor: float = 1.0,
    owner: int = 0,
) -> ParameterServer:
    """A :class:`ParameterServer` for ``num_workers`` workers on rank
    ``owner`` of ``comm`` (collective: every rank of ``comm`` opens its end).
    ``wire_dtype`` defaults to the model's; the other arguments are the
    server's (see :class:`ParameterServer`)."""
    wire_dtype = layout.dtype if wire_dtype is None else wire_dtype
    control, mailboxes = open_windows(comm, layout, wire_dtype, num_workers, owner)
    channel = ServerChannel(control, mailboxes, num_workers)
    telemetry = Telemetry(num_workers) if telemetry is None else telemetry
    return ParameterServer(optimizer, layout, compensation, channel, wire_dtype, device, telemetry, staged=staged,
                           untrained_state=untrained_state, update_path=update_path,
                           checked_by_workers=checked_by_workers, lr_factor=lr_factor)


def open_worker(
    comm: Any,
    optimizer: torch.optim.Optimizer,
    layout: ModelLayout,
    *,
    worker: int,
    num_workers: int,
    wire_dtype: Optional[torch.dtype] = None,
    check_finite: bool = True,
    owner: int = 0,
) -> Worker:
    """Worker ``worker``'s end (0-based) of the server on rank ``owner`` of
    ``comm`` (collective, with :func:`open_server` on the owner)."""
    wire_dtype = layout.dtype if wire_dtype is None else wire_dtype
    channel = open_worker_channel(comm, layout, wire_dtype, worker=worker, num_workers=num_workers, owner=owner)
    return Worker(optimizer, layout, [channel], wire_dtype, check_finite)


def open_worker_channel(comm: Any, layout: ModelLayout, wire_dtype: torch.dtype, *, worker: int, num_workers: int,
                        owner: int = 0, server: Optional[str] = None,
                        lifecycle: Optional[Lifecycle] = None) -> WorkerChannel:
    """Worker ``worker``'s channel to the server on rank ``owner`` of
    ``comm``, which serves ``layout`` (collective, with :func:`open_server`
    on the owner); ``server`` names it in messages; ``lifecycle`` (this
    rank's) is told when that server stays silent too long."""
    control, mailboxes = open_windows(comm, layout, wire_dtype, num_workers, owner)
    return WorkerChannel(control, mailboxes, worker, server, lifecycle)

"""What a serving loop asks between polls, answered for one server or for several.

The serving loop (:mod:`.serving`) polls, applies and answers; everything it
must *decide* it asks a :class:`Coordination`:

* :meth:`~Coordination.dropped_elsewhere` / :attr:`~Coordination.stall_timeout`
  / :meth:`~Coordination.dropped`: whom to drop (a silent worker);
* :meth:`~Coordination.stops_now`: whether a stop takes effect at this poll;
* :meth:`~Coordination.limits`: which pushes to hold back for a checkpoint
  or a stop under way;
* :meth:`~Coordination.due`: whether a checkpoint (and a stop with it) is
  to be made now;
* :meth:`~Coordination.may_end` / :meth:`~Coordination.end`: whether the loop
  may end once every worker has left, and what ending tells the others.

:class:`OneServer` decides alone.  :class:`SeveralServers` makes every
server's checkpoints and stop consistent -- a *cut*, see :mod:`.cuts` -- with
the first server deciding and the others following its orders.  Another
policy (elastic membership, say) is one more class.  The start and the end
of a session differ with the number of servers too (which checkpoint to
resume, the shared trace, the summary, the final weights): those are
methods here as well.  A worker's side of the same question -- how the
servers' slices make one model -- is :class:`ModelSplit` (:class:`WholeModel`,
:class:`SplitModel`).  So the session has no branch on the number of
servers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, List, Optional, Sequence, Tuple

import torch

from ..algorithm.server import ParameterServer
from ..algorithm.shards import Piece, merge_states, shard_layout, shard_optimizer, shard_state
from ..common.config import setting
from ..common.log import get_logger
from ..common.tensors import broadcast_
from ..observability.telemetry import Telemetry, truncate_trace
from ..protocol.layout import ModelLayout
from ..protocol.stall import stall_timeout_seconds
from ..runtime.place import OneOfServers, OnlyServer, ServerPlace
from .checkpoints import Checkpoints, open_checkpoints
from .cuts import Cuts
from .membership import Membership

__all__ = ["Checkpoint", "Coordination", "ModelSplit", "OneServer", "SeveralServers", "SplitModel", "WholeModel",
           "coordination_for", "model_split_for"]

log = get_logger("coordination")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint to write now: its number (``None``: the update
    counter's) and whether the server stops with it."""

    number: Optional[int] = None
    stop: bool = False


class Coordination:
    """The interface the serving loop and the session ask (one server's defaults)."""

    #: Seconds after which this server drops a silent worker itself (``None``: never).
    stall_timeout: Optional[float] = None
    #: This server's place among the job's servers.
    place: ServerPlace

    def __init__(self, checkpoints: Optional[Checkpoints] = None):
        self.checkpoints = checkpoints
        #: The workers present and every change (:mod:`.membership`), from :meth:`open_trace` on.
        self.membership: Optional[Membership] = None

    # --- serving: asked between polls -------------------------------------
    def dropped_elsewhere(self) -> List[int]:
        """Workers another rank dropped since the last poll, to drop here too."""
        return []

    def dropped(self, worker: int) -> None:
        """This server dropped ``worker`` (silent past :attr:`stall_timeout`)."""

    def stops_now(self, asked: bool) -> bool:
        """Whether a stop takes effect at this poll: the pushes ready now are
        applied and answered "stop", the later ones answered without applying.
        ``asked``: this server, not stopped yet, was asked to stop."""
        raise NotImplementedError

    def limits(self, server: ParameterServer, asked: bool, stopped: bool) -> Optional[Sequence[int]]:
        """Per worker, how many of its pushes may be taken before what is due
        (a checkpoint or a stop under way); ``None``: no limit."""
        return None

    def due(self, server: ParameterServer, stopped: bool) -> Optional[Checkpoint]:
        """The checkpoint to write now (between two updates), if one is due."""
        raise NotImplementedError

    def may_end(self) -> bool:
        """Whether the loop may end once every worker has left."""
        return True

    def end(self) -> None:
        """The loop ends."""

    # --- the session's start and end ----------------------------------------
    def served(self, layout: ModelLayout, optimizer: torch.optim.Optimizer, model: List[torch.Tensor],
               slice_: Tuple[int, int]) -> Tuple[ModelLayout, torch.optim.Optimizer]:
        """The layout and the optimizer this server serves (``model``: the
        trained parameters and the rest of the model's state)."""
        return layout, optimizer

    def open_checkpoints(self, folder: Optional[str], needs: int) -> Optional[Tuple[Any, Any]]:
        """Open this server's checkpoint folder (kept as :attr:`checkpoints`)
        and return the checkpoint to resume from (path, content), or ``None``
        (:func:`.checkpoints.open_checkpoints`: the newest whole one; with
        several servers, the newest whole cut of one run that every server
        holds).  ``needs``: the bytes of one checkpoint, by estimate."""
        raise NotImplementedError

    def open_trace(self, num_workers: int, path: Optional[str], slice_: Tuple[int, int],
                   resume_from: Optional[int]) -> Telemetry:
        """This server's telemetry, appending to the trace at ``path``, and
        the :attr:`membership` that tells it who is present."""
        raise NotImplementedError

    def _members(self, telemetry: Telemetry) -> Telemetry:
        self.membership = Membership(telemetry)
        return telemetry

    def last_checkpoint_number(self) -> Optional[int]:
        """The number of the checkpoint written at the end (``None``: the update counter's)."""
        return None

    def report(self, telemetry: Telemetry) -> None:
        """Log this server's summary (INFO); write ``HVD_DCASGD_SUMMARY``."""
        for line in telemetry.summary().splitlines():
            log.info(line)

    def whole_model_buffer(self, model_params: List[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
        """Where each server holds a slice: a buffer for the whole model's
        final weights (:func:`.transitions.end` fills it); ``None`` where this
        server holds the whole model already."""
        return None


class OneServer(Coordination):
    """One server decides alone: it drops a worker silent past
    ``HVD_DCASGD_STALL_TIMEOUT``, stops at the poll that sees the stop,
    checkpoints every ``HVD_DCASGD_CHECKPOINT_INTERVAL``."""

    def __init__(self, checkpoints: Optional[Checkpoints] = None):
        super().__init__(checkpoints)
        self.place = OnlyServer()
        self.stall_timeout = stall_timeout_seconds()

    def stops_now(self, asked: bool) -> bool:
        return asked

    def due(self, server: ParameterServer, stopped: bool) -> Optional[Checkpoint]:
        if self.checkpoints is not None and not stopped and self.checkpoints.is_due():
            return Checkpoint()
        return None

    def open_checkpoints(self, folder: Optional[str], needs: int) -> Optional[Tuple[Any, Any]]:
        self.checkpoints, found, _ = open_checkpoints(folder, self.place, needs=needs)
        return found

    def open_trace(self, num_workers: int, path: Optional[str], slice_: Tuple[int, int],
                   resume_from: Optional[int]) -> Telemetry:
        return self._members(Telemetry(num_workers, path, resume_from=resume_from, place=self.place))

    def report(self, telemetry: Telemetry) -> None:
        super().report(telemetry)
        path = setting("HVD_DCASGD_SUMMARY")
        if path:
            telemetry.write_summary(path)


class SeveralServers(Coordination):
    """Server ``shard`` of several: the first one decides when to cut
    (checkpoint, stop) and whom to drop, and orders the others (:mod:`.cuts`);
    a cut holds back, on every server, the pushes beyond its target.

    Arguments:
        mpi: mpi4py's ``MPI``.
        servers_comm: the servers' communicator (server s at rank s).
        checkpoints: this server's checkpoint folder, if any.
    """

    def __init__(self, mpi: Any, servers_comm: Any, checkpoints: Optional[Checkpoints] = None):
        super().__init__(checkpoints)
        self.servers_comm = servers_comm
        self.place = OneOfServers(servers_comm.Get_rank(), servers_comm.Get_size())
        self.cuts = Cuts(mpi, servers_comm)
        self.first = self.cuts.first
        self.stall_timeout = stall_timeout_seconds() if self.first else None  # the first drops, for every server
        self._cut: Optional[Tuple[int, bool, Any]] = None  # (number, stop, target) of a cut under way

    def dropped_elsewhere(self) -> List[int]:
        return [] if self.first else self.cuts.dropped()

    def dropped(self, worker: int) -> None:
        if self.first:
            self.cuts.drop(worker)

    def stops_now(self, asked: bool) -> bool:
        return False  # a stop is a cut

    def limits(self, server: ParameterServer, asked: bool, stopped: bool) -> Optional[Sequence[int]]:
        if self._cut is None:
            self._cut = self._next_cut(server, asked, stopped)
        return None if self._cut is None else self._cut[2]

    def _next_cut(self, server: ParameterServer, asked: bool, stopped: bool) -> Optional[Tuple[int, bool, Any]]:
        """The cut to make now, if one is due or ordered: (number, stop, target)."""
        if self.first:
            if stopped:
                return None
            stopping = asked or self.cuts.stop_wanted()
            if not (stopping or (self.checkpoints is not None and self.checkpoints.is_due())):
                return None
            order = self.cuts.order(stopping)
        else:
            if asked:
                self.cuts.want_stop()
            order = self.cuts.ordered()
            if order is None:
                return None
        target, stopping = self.cuts.targets([server.applied(m) for m in range(server.channel.num_workers)],
                                             order.stop)
        return order.number, stopping, target

    def due(self, server: ParameterServer, stopped: bool) -> Optional[Checkpoint]:
        cut = self._cut
        if cut is None or any(server.applied(m) < cut[2][m] for m in range(server.channel.num_workers)):
            return None
        self._cut = None
        return Checkpoint(cut[0], cut[1])

    def may_end(self) -> bool:
        return self._cut is None and (self.first or self.cuts.ended)

    def end(self) -> None:
        if self.first:
            self.cuts.stop_wanted()  # nothing is left unread
            self.cuts.end()

    def served(self, layout: ModelLayout, optimizer: torch.optim.Optimizer, model: List[torch.Tensor],
               slice_: Tuple[int, int]) -> Tuple[ModelLayout, torch.optim.Optimizer]:
        """Every server starts from the first one's model, and serves its slice of it."""
        broadcast_(self.servers_comm, model, root=0)
        served_layout, pieces = shard_layout(layout, *slice_)
        return served_layout, shard_optimizer(optimizer, layout, pieces)

    def open_checkpoints(self, folder: Optional[str], needs: int) -> Optional[Tuple[Any, Any]]:
        """Collective among the servers: they agree on the cut before any
        loads; :attr:`.cuts.Cuts.number` counts on from it."""
        self.checkpoints, found, number = open_checkpoints(folder, self.place, self.servers_comm.allgather, needs)
        if number is not None:
            self.cuts.number = number
        return found

    def open_trace(self, num_workers: int, path: Optional[str], slice_: Tuple[int, int],
                   resume_from: Optional[int]) -> Telemetry:
        """All servers append to one trace, which the first empties (or,
        resuming, truncates each server's lines at its checkpoint) before any
        writes (a barrier among them)."""
        resumed = self.servers_comm.gather(resume_from, root=0)
        if path and self.first:
            if resume_from is None:
                open(path, "w").close()
            elif os.path.exists(path):
                truncate_trace(path, dict(enumerate(resumed)))
        self.servers_comm.Barrier()
        start, end = slice_
        return self._members(Telemetry(num_workers, path, resume_from=resume_from,
                                       place=replace(self.place, offset=start, numel=end - start)))

    def last_checkpoint_number(self) -> Optional[int]:
        return self.cuts.number + 1  # one more cut: everything applied everywhere

    def report(self, telemetry: Telemetry) -> None:
        """The first server also logs and writes the merged summary of all."""
        super().report(telemetry)
        path = setting("HVD_DCASGD_SUMMARY")
        shards = self.servers_comm.gather(telemetry.summary_dict(), root=0)
        if self.first:
            merged = Telemetry.merge(shards)
            name = f"hvd_dcasgd servers (all {self.servers_comm.Get_size()})"
            for line in Telemetry.describe(merged, name).splitlines():
                log.info(line)
            if path:
                Telemetry.write(path, merged)

    def whole_model_buffer(self, model_params: List[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
        return torch.empty(sum(p.numel() for p in model_params), dtype=dtype)


def coordination_for(mpi: Any, servers_comm: Any, count: int, checkpoints: Optional[Checkpoints]) -> Coordination:
    """The coordination of a job with ``count`` servers (``servers_comm``: their communicator)."""
    return OneServer(checkpoints) if count == 1 else SeveralServers(mpi, servers_comm, checkpoints)


class ModelSplit:
    """A worker's view of how the servers' slices make one model: here, with
    one server, the slice is the whole model (:class:`WholeModel`).

    Arguments:
        layout: the whole model's layout.
        pieces: each server's pieces (:func:`.shards.shard_layout`).
    """

    def __init__(self, layout: ModelLayout, pieces: List[List[Piece]]):
        self.layout, self.pieces = layout, pieces

    def state_for(self, state: Any, shard: int) -> Any:
        """Server ``shard``'s part of the whole model's optimizer state."""
        return state

    def whole_state(self, states: List[Any]) -> Any:
        """The whole model's optimizer state from every server's."""
        return states[0]

    def whole_model(self, weights: torch.Tensor) -> Optional[torch.Tensor]:
        """After the final exchanges: the whole model's weights to give every
        server (``None``: the one server holds them)."""
        return None

    def server_name(self, shard: int) -> Optional[str]:
        """How messages name server ``shard`` (``None``: by its rank, the default)."""
        return None


class WholeModel(ModelSplit):
    """One server holds the whole model."""


class SplitModel(ModelSplit):
    """With several servers, each holds a slice: states are split and put
    together (:mod:`.shards`), and the first worker broadcasts the whole
    model's final weights to every server."""

    def state_for(self, state: Any, shard: int) -> Any:
        return shard_state(state, self.layout, self.pieces[shard])

    def whole_state(self, states: List[Any]) -> Any:
        return merge_states(states, self.layout, self.pieces)

    def whole_model(self, weights: torch.Tensor) -> Optional[torch.Tensor]:
        return weights

    def server_name(self, shard: int) -> Optional[str]:
        return f"server {shard} (MPI rank {shard})"


def model_split_for(count: int, layout: ModelLayout, pieces: List[List[Piece]]) -> ModelSplit:
    """A worker's view of ``count`` servers' slices."""
    return WholeModel(layout, pieces) if count == 1 else SplitModel(layout, pieces)

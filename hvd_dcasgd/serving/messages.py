"""The typed messages a session's ranks exchange outside the push protocol.

* :class:`Description` -- what every rank says about itself at the start
  (:func:`.agreement.agree`);
* :class:`Resumed` -- what the server tells every worker once it has loaded
  (or not) a checkpoint (:func:`.transitions.start`);
* the requests a worker makes of the server while training --
  :class:`SetState`, :class:`LoadOptimizerState`,
  :class:`OptimizerStateWithWeights` -- which :class:`ControlRequests`
  carries and the server answers between polls;
* the orders and requests several servers exchange (:mod:`.cuts`) --
  :class:`CutOrder`, :class:`DropOrder`, :class:`StopRequest`,
  :class:`EndOfCuts` -- each under its own tag, received with
  :func:`expect`, which makes a message of another type a sentence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Dict, Optional, Tuple, Type, TypeVar

import torch

from ..algorithm.compensation import Compensation
from ..algorithm.server import ParameterServer
from ..common.errors import HvdDcasgdError
from ..common.tags import CONTROL
from ..protocol.layout import ModelLayout

__all__ = ["ControlRequests", "CutOrder", "Description", "DropOrder", "EndOfCuts", "LoadOptimizerState",
           "OptimizerStateWithWeights", "Resumed", "SetState", "StopRequest", "expect"]

M = TypeVar("M")


@dataclass(frozen=True)
class Description:
    """One rank's model and settings, which every rank of a session must share."""

    layout: ModelLayout
    compensation: Dict[str, Any]
    wire: str
    host: str
    check_finite: bool
    lr_scaling: str

    @classmethod
    def of(cls, layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype, host: str,
           check_finite: bool, lr_scaling: str) -> "Description":
        return cls(layout, asdict(compensation), str(wire_dtype).replace("torch.", ""), host, check_finite,
                   lr_scaling)


@dataclass(frozen=True)
class Resumed:
    """Where the session starts: ``update`` is the checkpoint's update counter
    (``None``: a fresh start), ``pushes[m]`` worker m's data position, the
    batches of its shard the jobs before this one took (its own pushes, or,
    after a change of the number of workers, the even share of everyone's:
    :mod:`hvd_dcasgd.algorithm.membership`)."""

    update: Optional[int] = None
    path: Optional[str] = None
    pushes: Tuple[int, ...] = ()


@dataclass(frozen=True)
class SetState:
    """Overwrite trained parameters (by index in the server's layout) and the
    rest of the model's state (by name): a checkpoint restored on a worker."""

    kind: ClassVar[str] = "set_state"
    params: Dict[int, torch.Tensor] = field(default_factory=dict)
    untrained_state: Dict[str, torch.Tensor] = field(default_factory=dict)

    def run(self, server: ParameterServer) -> None:
        server.set_state(self.params, self.untrained_state)


@dataclass(frozen=True)
class LoadOptimizerState:
    """Load an optimizer state (the server's slice of it) into the optimizer that steps."""

    kind: ClassVar[str] = "load_optimizer_state"
    state: Dict[str, Any] = field(default_factory=dict)

    def run(self, server: ParameterServer) -> None:
        server.update.load_optimizer_state(self.state)


@dataclass(frozen=True)
class OptimizerStateWithWeights:
    """The optimizer's state, and the weights of the same moment into ``worker``'s outbox."""

    kind: ClassVar[str] = "read_optimizer_state"
    worker: int = 0

    def run(self, server: ParameterServer) -> Dict[str, Any]:
        return server.optimizer_state_sent_with_weights(self.worker)


@dataclass(frozen=True)
class CutOrder:
    """The first server orders cut ``number`` to the others; with ``stop``,
    every server stops with it."""

    number: int
    stop: bool


@dataclass(frozen=True)
class DropOrder:
    """The first server dropped ``worker`` (silent too long): every server drops it."""

    worker: int


@dataclass(frozen=True)
class StopRequest:
    """Another server was asked to stop: it asks the first to order a cut that stops."""


@dataclass(frozen=True)
class EndOfCuts:
    """The first server will order no more cuts: the others may end once their workers have left."""


def expect(message: Any, kind: Type[M], receiver: str, sender: str) -> M:
    """``message``, received by ``receiver`` from ``sender``, if it is a
    ``kind``; any other type is an internal error, said in a sentence."""
    if not isinstance(message, kind):
        raise HvdDcasgdError(f"hvd_dcasgd: internal error: {receiver} received {message!r} "
                             f"({type(message).__name__}) from {sender} where a {kind.__name__} was expected")
    return message


class ControlRequests:
    """Requests a worker makes of the server outside the push protocol -- the
    server's optimizer state, Horovod's checkpoint-restore idiom -- as
    point-to-point messages the server answers between polls.

    Arguments:
        mpi: mpi4py's ``MPI``.
        comm: a server's session (the server at rank 0).
        server: on the server, the one that answers.
    """

    def __init__(self, mpi: Any, comm: Any, server: Optional[ParameterServer] = None):
        self.mpi, self.comm, self.server = mpi, comm, server

    def ask(self, request: Any) -> Any:
        """Worker side: send ``request``, wait for the answer, return its result."""
        self.comm.send(request, dest=0, tag=CONTROL)
        problem, result = self.comm.recv(source=0, tag=CONTROL)
        if problem:
            raise HvdDcasgdError(problem)
        return result

    def answer(self) -> None:
        """Server side: run every pending request; a failure goes back to
        the worker that asked, as its error, and leaves the server as it was."""
        status = self.mpi.Status()
        while self.comm.Iprobe(source=self.mpi.ANY_SOURCE, tag=CONTROL, status=status):
            source = status.Get_source()
            request = self.comm.recv(source=source, tag=CONTROL)
            try:
                reply = (None, request.run(self.server))
            except Exception as exc:  # reported to the worker, which raises it
                reply = (f"hvd_dcasgd: the server could not {getattr(request, 'kind', request)}: {exc}", None)
            self.comm.send(reply, dest=source, tag=CONTROL)

"""Horovod's elastic API (``hvd.elastic``), with the meaning it has for an
asynchronous job, so that a Horovod elastic script runs with only its import
changed.

Elastic Horovod keeps a synchronous ring going as workers come and go: at
every change each worker stops, the ring is formed again, every worker's
state is synced from rank 0, and the training function starts over.  An
asynchronous parameter server has no ring to form again: a worker that
leaves, is dropped or resumes never interrupts the others, and the model and
the optimizer's state live on the server, which checkpoints them.  So here:

* :func:`run` syncs the state once, then runs the function; it never starts
  it over (Horovod does after a ``HorovodInternalError`` or a
  ``HostsUpdatedInterrupt``, which no change of an asynchronous job raises).
* :meth:`State.commit` saves the state and checks for host updates, as
  Horovod's does; :meth:`State.check_host_updates` finds none.
* :class:`ObjectState` and :class:`TorchState` keep the attributes given as
  keywords (``epoch``, ``batch``, ...): :meth:`~ObjectState.save` copies
  them, :meth:`~ObjectState.restore` puts back the last copy, and a
  :class:`TorchState` also brings its model to the server's current weights
  (the server never goes back: the other workers' pushes since stay
  applied).  :meth:`~TorchState.sync` brings the model to the server's
  current weights; the attributes stay this worker's own, where Horovod
  broadcasts rank 0's (asynchronous workers are at different points of
  their data).  Nothing copies the model or the optimizer's state at a
  commit: the server holds them.
* Reset callbacks are kept; no reset happens, so none is called.

Anything else of ``horovod.torch.elastic`` (``ElasticSampler``) raises,
saying why.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable, Dict, Iterable, List, Optional

from ..common.errors import HvdDcasgdError

__all__ = ["ObjectState", "State", "TorchState", "run"]


class State:
    """A worker's state that Horovod's elastic mode would keep across
    changes of the job (see the module)."""

    def __init__(self, bcast_object: Optional[Callable] = None, get_rank: Optional[Callable] = None):
        # Horovod's arguments (its broadcast and its rank), taken for its signature: nothing is broadcast here
        self._reset_callbacks: List[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Keep ``callbacks`` for after a reset (a change of the job that
        starts the training function over); an asynchronous job has none, so
        they are never called."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run the reset callbacks (Horovod's own hook; nothing here calls it)."""
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state (:meth:`save`), then check for host updates."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod raises ``HostsUpdatedInterrupt`` here when hosts were added
        or removed, to form its ring again; no change of an asynchronous job
        interrupts a worker, so there is nothing to raise."""

    def save(self) -> None:
        """Keep a copy of the state in memory."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the last saved state."""
        raise NotImplementedError

    def sync(self) -> None:
        """Bring the state to the job's (at the start of :func:`run`)."""
        raise NotImplementedError


class ObjectState(State):
    """Python values given as keywords, each an attribute of the state.

    Arguments:
        bcast_object, get_rank: Horovod's broadcast and rank functions, taken
            for its signature (nothing is broadcast: :meth:`sync` keeps this
            worker's values).
        kwargs: the values, e.g. ``epoch=1, batch=0``.
    """

    def __init__(self, bcast_object: Optional[Callable] = None, get_rank: Optional[Callable] = None, **kwargs: Any):
        super().__init__(bcast_object, get_rank)
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        """Nothing: each asynchronous worker keeps its own values."""

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


class TorchState(ObjectState):
    """A model, its optimizer (a ``DistributedOptimizer``) and Python values
    given as keywords.

    Arguments:
        model: the worker's model (``state.model``).
        optimizer: the ``hvd.DistributedOptimizer`` that trains it
            (``state.optimizer``).
        kwargs: the values, e.g. ``epoch=1, batch=0``.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any):
        self.model, self.optimizer = model, optimizer
        super().__init__(**kwargs)

    def restore(self) -> None:
        """The values of the last commit, and the model at the server's current weights."""
        super().restore()
        self._pull()

    def sync(self) -> None:
        """The model at the server's current weights; the values stay this worker's."""
        self._pull()

    def _pull(self) -> None:
        # a DistributedOptimizer's state_dict() brings the model to the server's weights of the same moment
        # (locally, in one process, the model is the only copy)
        if self.optimizer is not None and hasattr(self.optimizer, "pushes"):
            self.optimizer.state_dict()


def run(func: Callable) -> Callable:
    """Decorator for the training function ``func(state, ...)``: syncs
    ``state`` (:meth:`State.sync`), then runs ``func`` once.  Horovod runs it
    again after a change of the job; no change interrupts an asynchronous
    worker, so it runs once, and its result is returned."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "ElasticSampler":
        raise HvdDcasgdError("hvd_dcasgd: hvd.elastic.ElasticSampler is not offered: it splits the samples not "
                             "yet taken among the workers again at every change of a synchronous ring, and an "
                             "asynchronous job has no such change; use DistributedSampler and skip "
                             "optimizer.pushes batches when a job resumes (docs/RELIABILITY.md)")
    raise AttributeError(f"module 'hvd_dcasgd.elastic' has no attribute {name!r}")

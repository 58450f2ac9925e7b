"""The optimizer a worker's script holds: a dynamic subclass of the user's
optimizer class (Horovod's shape), with gradient hooks that count backward
passes, ``synchronize()`` / ``skip_synchronize()``, and a ``step()`` that is
one push and one pull through the worker's session."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from ..common.errors import HvdDcasgdError

__all__ = ["wrap"]


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, backward_passes_per_step: int = 1):
        super(self.__class__, self).__init__(params)
        self.backward_passes_per_step = backward_passes_per_step
        self._session = None
        self._local_steps = 0
        self._passes = {}
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._count_pass)
            for group in self.param_groups
            for p in group["params"]
            if p.requires_grad
        ]

    def _count_pass(self, p: torch.Tensor) -> None:
        count = self._passes.get(p, 0) + 1
        if count > self.backward_passes_per_step:
            raise HvdDcasgdError(
                "hvd_dcasgd: gradients were computed more than backward_passes_per_step="
                f"{self.backward_passes_per_step} times before step(); increase backward_passes_per_step "
                "to accumulate gradients locally, or call step() after each backward()."
            )
        self._passes[p] = count
        if count == self.backward_passes_per_step and self._session is not None and not self._session.finished:
            self._session.worker.gradient_final(p)  # its bucket may go now, during backward

    def synchronize(self) -> None:
        """Close the gradient-accumulation window.

        In Horovod this waits for the allreduce so that gradients can be
        clipped or unscaled before ``step()``.  Here gradients stay on the
        worker until ``step()`` pushes them, so there is nothing to wait for:
        whatever ``p.grad`` holds when ``step()`` runs is what the server gets
        (buckets sent during backward are sent again by ``step()``, in case
        the gradients are clipped or unscaled in between).
        """
        self._passes.clear()
        self._restart_buckets()

    def _restart_buckets(self) -> None:
        if self._session is not None and not self._session.finished:
            self._session.worker.restart()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients and start a new accumulation window (a step a
        GradScaler skipped after an overflow leaves none open)."""
        self._passes.clear()
        self._restart_buckets()
        super(self.__class__, self).zero_grad(set_to_none)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Horovod's idiom ``synchronize(); clip; with skip_synchronize():
        step()`` works unchanged: ``step()`` always pushes the current
        gradients exactly once."""
        yield

    def step(self, closure=None):
        """Push the gradients and load the server's new weights (the server
        steps); when training locally, a plain step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._passes.clear()
        if self._session is None:
            super(self.__class__, self).step()
            self._local_steps += 1
        elif self._session.finished:
            raise HvdDcasgdError("hvd_dcasgd: training has ended (hvd.shutdown() ran); this optimizer can no longer step")
        else:
            self._session.exchange()
        return loss

    @property
    def pushes(self) -> int:
        """How many of this worker's gradients the server has taken, counting
        the jobs this one resumes (0 on a fresh start): a resumed script skips
        that many steps of its data.  A job resumed with another number of
        workers than its checkpoint's counts, for every worker, the even
        share of all the pushes taken before, so that ``DistributedSampler``
        shards re-split at the same place of the epoch
        (:mod:`hvd_dcasgd.algorithm.membership`).  Counts steps when training
        locally."""
        if self._session is not None:
            return self._session.pushes
        return self._local_steps

    def state_dict(self):
        """While training, the server's optimizer state (its optimizer is the
        one that steps), so that a checkpoint saved on a worker is complete;
        the model is brought to the server's weights of the same moment (a
        pull), so ``model.state_dict()`` and this belong together."""
        if self._session is not None and not self._session.finished:
            return self._session.optimizer_state_with_weights()
        return super(self.__class__, self).state_dict()

    def load_state_dict(self, state_dict) -> None:
        """Load on the server while training (its optimizer is the one that
        steps), then here.  A state the server cannot take raises here and
        changes nothing, on either side."""
        if self._session is not None and not self._session.finished:
            self._session.load_optimizer_state(state_dict)
        super(self.__class__, self).load_state_dict(state_dict)


def wrap(optimizer: torch.optim.Optimizer, backward_passes_per_step: int) -> torch.optim.Optimizer:
    """A new optimizer of ``optimizer``'s class, over its param groups, with the methods above."""
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, backward_passes_per_step)

"""A server's state saved by a job of M workers, taken on by a job of M'.

:func:`resized_state` is the whole rule, on a
:meth:`.server.ParameterServer.state_dict`; the server applies it when it
loads a state of another number of workers.  Worker m is the m-th worker of
either job (MPI rank m + 1 of each server's session).

* **What is the server's carries over unchanged**: the weights and the rest
  of the model's state, the optimizer's state, the update counter, and the
  compensation state that every worker shares (DC-ASGD-a's MeanSquare by
  default, Gap-Aware's averages).
* **A worker of both jobs (m < min(M, M')) keeps its backup** (the weights
  it was last sent) and the update that sent them: its next push is
  compensated against the weights it was computed on, exactly as if the
  job had not stopped.  Its own compensation state (a per-worker
  MeanSquare) stays its own.
* **A worker that left (m >= M') leaves nothing pending.**  Between two
  updates no push of it is half applied: the server holds only its backup,
  which is needed for nothing but compensating its next push, and that push
  never comes; and its own MeanSquare, an average of its own gradients that
  no other worker's pushes update.  Both are dropped.
* **A new worker (m >= M) starts from the current weights**: its backup is
  the weights now, sent at the current update, so a push computed on them
  right away is 0 stale.  Its own MeanSquare starts at the mean of the saved
  workers' (every worker draws its batches from the same data, so each
  estimates the same mean square; zero, as at a job's start, would make its
  first corrections the largest the bound allows).
* **The counts stay exact.**  ``pushes[m]`` and ``refused[m]`` count worker
  m's pushes taken since the last change of the number of workers (or the
  job's start); ``before`` holds the applied and refused pushes of every
  worker before it.  So every push the server ever took is counted once:
  ``before["applied"] + sum(pushes)`` applied, ``before["refused"] +
  sum(refused)`` refused.
* **The data position is re-split evenly.**  Every worker of the new job
  resumes at the even share of all the pushes taken before,
  ``base = (before["applied"] + before["refused"]) // M'``, plus its own
  pushes since (:meth:`.server.ParameterServer.position`).  With
  ``DistributedSampler`` shards of the same shuffled order, M workers that
  took b batches each covered the order's first M * b batches, and M'
  workers that skip ``base`` batches each cover its first M' * base: these
  differ by fewer than M' batches, which the new job takes again.  Workers that ran at different speeds covered more of some shards
  than of others; the even share keeps the count of samples taken in the
  epoch, not which ones.

A state of the same number of workers is returned as it is.  The learning
rate's factor (:func:`.update.lr_factor`) depends on M under Horovod's
scaling of an asynchronous job: a state saved at 1/M resumes at 1/M'.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

import torch

__all__ = ["resized_state"]


def resized_state(state: Dict[str, Any], num_workers: int, lr_factor: float,
                  per_worker: Dict[str, bool]) -> Dict[str, Any]:
    """``state`` (a server's state dict of M workers) as a job of
    ``num_workers`` workers takes it on (the module's rule); ``state``
    itself is not changed.  ``lr_factor``: the new job's factor, which
    replaces a saved 1/M by 1/M' where Horovod's scaling made it.
    ``per_worker``: which compensation state tensors are one per worker."""
    saved = int(state["settings"]["num_workers"])
    if saved == num_workers:
        return state
    kept = min(saved, num_workers)
    state = dict(state)
    settings = state["settings"] = dict(state["settings"])
    settings["num_workers"] = num_workers
    factor = float(settings.get("lr_factor", 1.0))
    if math.isclose(factor, 1.0 / saved) and math.isclose(lr_factor, 1.0 / num_workers):
        settings["lr_factor"] = lr_factor  # Horovod's scaling of the rate, at the new number of workers
    weights, updates = state["weights"], int(state["updates"])
    state["backups"] = [*state["backups"][:kept], *(weights.clone() for _ in range(num_workers - kept))]
    state["sent_at"] = [*state["sent_at"][:kept], *([updates] * (num_workers - kept))]
    state["compensation_state"] = {
        name: (_resized_per_worker(tensors, num_workers) if per_worker.get(name) else tensors)
        for name, tensors in state["compensation_state"].items()}
    before = dict(state.get("before") or {"applied": 0, "refused": 0})
    before["applied"] = int(before["applied"]) + sum(int(n) for n in state["pushes"])
    before["refused"] = int(before["refused"]) + sum(int(n) for n in state["refused"])
    state["before"] = before
    state["base"] = (before["applied"] + before["refused"]) // num_workers
    state["pushes"], state["refused"] = [0] * num_workers, [0] * num_workers
    return state


def _resized_per_worker(tensors: List[torch.Tensor], num_workers: int) -> List[torch.Tensor]:
    """One tensor per worker of the new job: the saved workers' own, then, for
    each new worker, their mean."""
    kept = min(len(tensors), num_workers)
    mean = torch.stack(list(tensors)).mean(dim=0) if num_workers > kept else None
    return [*tensors[:kept], *(mean.clone() for _ in range(num_workers - kept))]

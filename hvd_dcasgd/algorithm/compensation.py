"""The compensation a job runs, as settings: :class:`Compensation` (the rule
by name, its constants checked against what the rule uses, and the schedule)
and :class:`CompensationState`, the tensors the rule keeps for the workers
(DC-ASGD-a's MeanSquare, Gap-Aware's running average).  The rules themselves
and their registry are :mod:`hvd_dcasgd.algorithm.rules`; DC-ASGD's formula is
:mod:`hvd_dcasgd.algorithm.dcasgd`.  What the server does with the compensated
gradient -- the optimizer's step -- is :mod:`hvd_dcasgd.algorithm.update`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import Tensor

from ..common.errors import HvdDcasgdValueError
from .rules import COMPENSATIONS, GLOBAL, PER_GROUP, PER_WORKER, CompensationRule, compensation_rule

__all__ = ["CONSTANTS", "Compensation", "CompensationState", "SCHEDULES"]

#: How the server takes pushes: each on its own as it arrives (``async``:
#: ASGD and DC-ASGD), or one averaged update per round of one push from every
#: worker (``sync``: the paper's SSGD baseline).
SCHEDULES = ("async", "sync")


#: The constants a compensation may use (its rule's :meth:`~CompensationRule.constants`), each with what it
#: must be.  ``bound`` may be ``math.inf``: the paper's unbounded correction.
CONSTANTS: Dict[str, str] = {
    "lambda_0": "a finite number >= 0",
    "bound": "a number > 0, or inf (the paper's unbounded correction)",
    "mean_square_momentum": "a number in [0, 1)",
    "eps": "a finite number > 0",
    "gamma": "a number in [0, 1)",
    "gap_eps": "a finite number > 0",
}


def _valid(name: str, value: float) -> bool:
    if name == "bound":
        return value > 0 and not math.isnan(value)
    if name in ("mean_square_momentum", "gamma"):
        return 0.0 <= value < 1.0
    if name == "lambda_0":
        return math.isfinite(value) and value >= 0
    return math.isfinite(value) and value > 0


@dataclass(frozen=True)
class Compensation:
    """What the server does to a stale gradient, and when it applies one.

    Arguments:
        mode: a registered compensation (``none``, ``constant``, ``adaptive``,
            ``staleness``, ``gap_aware``, ...); ``"sync"`` is the shorthand
            for ``mode="none", schedule="sync"``.
        lambda_0: DC-ASGD's lambda_0 (``constant`` 0.04, ``adaptive`` 8.0 by
            default).
        bound: DC-ASGD's bound on its correction, element by element, as a
            multiple of the gradient's size (default 1.0: the correction is
            never larger than the gradient, so it never reverses it);
            ``math.inf`` is the paper's rule, unbounded.
        mean_square_momentum, eps: DC-ASGD-a's MeanSquare momentum (0.95) and
            epsilon (1e-7).
        per_worker_mean_square: one MeanSquare per worker (the authors' code)
            instead of the paper's global one (DC-ASGD-a).
        gamma, gap_eps: Gap-Aware's momentum of its running average of g * g
            (0.999) and the epsilon added to its square root (1e-8).
        schedule: ``async`` or ``sync`` (see :data:`SCHEDULES`).

    A constant left ``None`` takes the rule's default; a constant the rule
    does not use is refused with a sentence naming those it uses.  What a
    worker's learning rate means is not the compensation's: it is
    ``DistributedOptimizer``'s ``lr_scaling``
    (:data:`hvd_dcasgd.algorithm.update.LR_SCALINGS`).
    """

    mode: str = "adaptive"
    lambda_0: Optional[float] = None
    mean_square_momentum: Optional[float] = None
    eps: Optional[float] = None
    per_worker_mean_square: bool = False
    schedule: str = "async"
    bound: Optional[float] = None
    gamma: Optional[float] = None
    gap_eps: Optional[float] = None

    def __post_init__(self) -> None:
        if self.mode == "sync":
            object.__setattr__(self, "mode", "none")
            object.__setattr__(self, "schedule", "sync")
        if self.schedule not in SCHEDULES:
            raise HvdDcasgdValueError(
                f"hvd_dcasgd: unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}"
            )
        rule = compensation_rule(self.mode)
        used = rule.constants()
        uses = f"it uses {', '.join(used)}" if used else "it uses no constant"
        for name in CONSTANTS:
            value = getattr(self, name)
            if value is None:
                if name in used:
                    object.__setattr__(self, name, float(used[name]))
                continue
            if name not in used:
                raise HvdDcasgdValueError(
                    f"hvd_dcasgd: the {self.mode!r} compensation does not use {name} (set to {value!r}); {uses}. "
                    f"Leave {name} unset, or choose a compensation that uses it.")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _valid(name, float(value)):
                raise HvdDcasgdValueError(f"hvd_dcasgd: {name} must be {CONSTANTS[name]}, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.per_worker_mean_square and "mean_square_momentum" not in used:
            raise HvdDcasgdValueError(f"hvd_dcasgd: the {self.mode!r} compensation keeps no MeanSquare, so "
                                      f"per_worker_mean_square does not apply; {uses}.")

    @property
    def rule(self) -> CompensationRule:
        return COMPENSATIONS[self.mode]

    def constants(self) -> Dict[str, float]:
        """The constants the rule uses, by name, with their values."""
        return {name: getattr(self, name) for name in self.rule.constants()}

    def divergence_advice(self) -> str:
        """What to try when the weights diverge under these settings, naming
        the constants this rule uses and their values now."""
        constants = self.constants()
        advice = ["lower the learning rate"]
        if "bound" in constants and math.isinf(constants["bound"]):
            advice.append("bound the correction (HVD_DCASGD_BOUND=1: it is unbounded now, the paper's rule)")
        if "lambda_0" in constants:
            advice.append(f"lower lambda_0 (HVD_DCASGD_LAMBDA, now {constants['lambda_0']:g})")
        return "; ".join(advice) + " (docs/USAGE.md, \"Choosing the constants\")"


class CompensationState:
    """The state tensors a compensation keeps (MeanSquare), zero at the start:
    flat like the model, one per worker or one shared, or one number per
    param group (shared), as the rule says."""

    def __init__(self, settings: Compensation, like: Tensor, num_workers: int, num_groups: int = 1):
        self.scopes = settings.rule.state(settings)
        for name, scope in self.scopes.items():
            if scope not in (GLOBAL, PER_WORKER, PER_GROUP):
                raise HvdDcasgdValueError(f"hvd_dcasgd: compensation state {name!r} has the scope {scope!r}; "
                                          f"choose one of {GLOBAL}, {PER_WORKER}, {PER_GROUP}")
        per_group = dict(dtype=torch.promote_types(like.dtype, torch.float32), device=like.device)
        self.tensors: Dict[str, List[Tensor]] = {
            name: [torch.zeros(num_groups, **per_group)] if scope == PER_GROUP else
            [torch.zeros_like(like) for _ in range(num_workers if scope == PER_WORKER else 1)]
            for name, scope in self.scopes.items()
        }

    def of(self, worker: int) -> Dict[str, Tensor]:
        """Worker ``worker``'s state: its own tensors, or the shared ones."""
        return {name: tensors[worker if self.scopes[name] == PER_WORKER else 0]
                for name, tensors in self.tensors.items()}

    def state_dict(self) -> Dict[str, List[Tensor]]:
        return {name: [t.detach().to("cpu", copy=True) for t in tensors] for name, tensors in self.tensors.items()}

    def check(self, state: Dict[str, List[Tensor]]) -> None:
        """Raise unless ``state`` has exactly these tensors, shaped alike."""
        if sorted(state) != sorted(self.tensors):
            raise HvdDcasgdValueError(f"hvd_dcasgd: compensation state {sorted(state)}, expected {sorted(self.tensors)}")
        for name, tensors in self.tensors.items():
            shapes = [tuple(t.shape) for t in state[name]]
            if shapes != [tuple(t.shape) for t in tensors]:
                raise HvdDcasgdValueError(f"hvd_dcasgd: compensation state {name!r} has shapes {shapes}, expected "
                                          f"{len(tensors)} of {tuple(tensors[0].shape)}")

    def load_state_dict(self, state: Dict[str, List[Tensor]]) -> None:
        self.check(state)
        for name, tensors in self.tensors.items():
            for target, value in zip(tensors, state[name]):
                target.copy_(value)

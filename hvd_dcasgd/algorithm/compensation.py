"""Delay compensation for stale gradients (DC-ASGD, Zheng et al., ICML 2017).

A *compensation* turns the gradient ``g`` that worker m computed on the
weights ``w_bak(m)`` into the gradient applied to the current weights ``w``.
Each is one small class in :data:`COMPENSATIONS`, registered with
:func:`register_compensation`: it declares the state it keeps
(:meth:`CompensationRule.state`), transforms a gradient
(:meth:`CompensationRule.compensate_`, told about the push by a :class:`Push`)
and, when the fused C kernel computes it, says how
(:meth:`CompensationRule.kernel`).  The built-in ones:

* ``none`` (ASGD): ``g``;
* ``constant`` (DC-ASGD-c): ``g + clamp(lambda_0 * g * g * (w - w_bak(m)), -bound * |g|, bound * |g|)``;
* ``adaptive`` (DC-ASGD-a): ``MeanSquare = m * MeanSquare + (1 - m) * g * g``,
  then ``g + clamp(lambda_0 / sqrt(MeanSquare + eps) * g * g * (w - w_bak(m)), -bound * |g|, bound * |g|)``;
* ``staleness`` (staleness-aware learning rate, Zhang et al., IJCAI 2016):
  ``g / max(1, tau)``, tau the push's staleness;
* ``gap_aware`` (Gap-Aware, Barkai et al., ICLR 2020):
  ``g / (1 + |w - w_bak(m)| / C)``, C the typical size of one step.

The clamp keeps the Taylor term a correction: element by element it is never
larger than ``bound`` times the gradient it corrects, so with ``bound <= 1``
it never reverses the gradient's sign (``docs/DESIGN.md``, "The bounded
correction").  ``bound=math.inf`` is the paper's rule exactly.

The formula is :func:`dcasgd_`, shaped like ``torch.optim.sgd``: a
single-tensor reference that reads like Eq. 10, a multi-tensor (``foreach``)
implementation, and a fused one (the C kernel of :mod:`hvd_dcasgd.common.native`, or torch ops on
cache-sized chunks where it cannot be built) that reads and writes each
element once.  What the server does with the compensated gradient -- the
optimizer's step -- is :mod:`hvd_dcasgd.algorithm.update`.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Type

import torch
from torch import Tensor

from ..common.config import VARIABLES
from ..common.errors import HvdDcasgdValueError
from ..common import native

__all__ = [
    "COMPENSATIONS", "CONSTANTS", "Compensation", "CompensationRule", "CompensationState", "GLOBAL", "KernelCall",
    "MODES",
    "PER_GROUP", "PER_WORKER", "Push", "SCHEDULES", "compensation_rule", "dcasgd_", "register_compensation",
]

#: Where a compensation's state lives: one tensor shaped like the model,
#: shared by every worker (the paper's MeanSquare) or one per worker (the
#: authors' code); or ``PER_GROUP``, one number per param group, shared.
GLOBAL, PER_WORKER, PER_GROUP = "global", "per_worker", "per_group"

#: How the server takes pushes: each on its own as it arrives (``async``:
#: ASGD and DC-ASGD), or one averaged update per round of one push from every
#: worker (``sync``: the paper's SSGD baseline).
SCHEDULES = ("async", "sync")

#: Elements per chunk of the fused implementation: four such float32 chunks
#: (w, w_bak, g and one temporary) stay inside a core's L2/L3 cache.
FUSED_CHUNK = 262144


def _default(variable: str) -> float:
    """A constant's one default: its variable's in the settings table."""
    return VARIABLES[variable].default


# --- the registry -----------------------------------------------------------
class Push(NamedTuple):
    """What a compensation may know of the push it compensates.

    ``staleness``: the updates the server applied since the weights the
    gradient was computed on, ``w_bak(m)``, were sent to the worker (0: the
    gradient is fresh, as on the ``sync`` schedule, where every worker of a
    round holds the current weights).  ``lrs``: the learning rate of each
    param group, as the optimizer applies it (times the update's
    ``lr_factor``, see :data:`hvd_dcasgd.algorithm.update.LR_SCALINGS`).
    ``group_ranges``: each param group's ``[start, end)`` in the flat
    gradient; with several tensors, in their concatenation (the server passes
    one flat tensor)."""

    staleness: int
    lrs: Sequence[float]
    group_ranges: Sequence[Tuple[int, int]]


class KernelCall(NamedTuple):
    """How the C kernel computes a compensation: its ``lambda_0``, the name
    of the state tensor it uses as MeanSquare (``None``: a constant lambda)
    with that average's momentum and epsilon, and the bound on the
    correction, as a multiple of |g| (``math.inf``: none)."""

    lambda_0: float
    mean_square: Optional[str] = None
    mean_square_momentum: float = 0.0
    eps: float = 0.0
    bound: float = math.inf


class CompensationRule:
    """A way to correct a stale gradient.  Subclass, set ``name`` (and
    ``defaults``, the constants it uses), implement :meth:`compensate_`, and
    decorate with :func:`register_compensation`; every rank, the server's
    update, the checkpoints and the ``compensation=`` option then know it."""

    name: ClassVar[str]
    #: The constants of :class:`Compensation` this rule uses, with their
    #: defaults (any of :data:`CONSTANTS`); a constant it does not list is
    #: refused with a sentence when set.
    defaults: ClassVar[Dict[str, float]] = {}
    #: Before ``defaults``: a rule that sets this uses ``lambda_0`` with this default.
    default_lambda_0: ClassVar[Optional[float]] = None

    def constants(self) -> Dict[str, float]:
        """The constants this rule uses, with their defaults."""
        found = dict(self.defaults)
        if self.default_lambda_0 is not None:
            found.setdefault("lambda_0", self.default_lambda_0)
        return found

    def state(self, settings: "Compensation") -> Dict[str, str]:
        """The tensors this rule keeps, zero at the start, by name: each
        :data:`GLOBAL` or :data:`PER_WORKER` (per element, like the model)
        or :data:`PER_GROUP` (one number per param group)."""
        return {}

    def compensate_(self, grads: List[Tensor], weights: List[Tensor], backups: List[Tensor],
                    state: Dict[str, List[Tensor]], settings: "Compensation", *, impl: str,
                    push: Optional[Push] = None) -> None:
        """Replace each of ``grads`` by its compensated value, in place.
        ``state`` holds this worker's state tensors, one list entry per
        gradient (a :data:`PER_GROUP` one: its first entry); ``impl`` is
        ``"reference"``, ``"foreach"`` or ``"fused"`` (a rule with one
        implementation may ignore it); ``push`` tells about the push
        (:class:`Push`).  A rule whose ``compensate_`` has no ``push``
        parameter is called without it."""
        raise NotImplementedError

    def run_(self, grads: List[Tensor], weights: List[Tensor], backups: List[Tensor],
             state: Dict[str, List[Tensor]], settings: "Compensation", *, impl: str, push: Push) -> None:
        """What the server's update calls: :meth:`compensate_`, given ``push``
        where it takes one."""
        if _takes_push(type(self).compensate_):
            self.compensate_(grads, weights, backups, state, settings, impl=impl, push=push)
        else:
            self.compensate_(grads, weights, backups, state, settings, impl=impl)

    def kernel(self, settings: "Compensation") -> Optional[KernelCall]:
        """How the fused C kernel computes this rule together with SGD's
        step, or ``None`` when it cannot (the update then compensates with
        :meth:`compensate_` and lets the optimizer step)."""
        return None


#: Every compensation by name, in registration order.
COMPENSATIONS: Dict[str, CompensationRule] = {}


def register_compensation(cls: Type[CompensationRule]) -> Type[CompensationRule]:
    """Class decorator: make ``cls`` available as ``compensation=cls.name``."""
    if cls.name in COMPENSATIONS or cls.name in ("sync", "horovod"):
        raise HvdDcasgdValueError(f"hvd_dcasgd: a compensation named {cls.name!r} exists already")
    COMPENSATIONS[cls.name] = cls()
    return cls


def compensation_rule(name: str) -> CompensationRule:
    """The registered rule called ``name``, or a clear error naming them all."""
    try:
        return COMPENSATIONS[name]
    except KeyError:
        raise HvdDcasgdValueError(
            f"hvd_dcasgd: unknown compensation {name!r}; choose one of {', '.join(MODES)}"
        ) from None


@functools.lru_cache(maxsize=None)
def _takes_push(compensate: Callable) -> bool:
    parameters = inspect.signature(compensate).parameters.values()
    return any(p.name == "push" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _impl_flags(impl: str) -> Dict[str, bool]:
    return {"foreach": impl == "foreach", "fused": impl == "fused"}


def _the_push(rule: CompensationRule, push: Optional[Push]) -> Push:
    if push is None:
        raise HvdDcasgdValueError(f"hvd_dcasgd: the {rule.name!r} compensation needs the push (push=Push(...))")
    return push


def _group_slices(sizes: Sequence[int],
                  group_ranges: Sequence[Tuple[int, int]]) -> Iterator[Tuple[int, int, int, int]]:
    """``(tensor, start, end, group)`` for each piece of a param group in one
    of the tensors, ``group_ranges`` indexing their concatenation."""
    offset = 0
    for i, size in enumerate(sizes):
        for group, (start, end) in enumerate(group_ranges):
            lo, hi = max(start, offset), min(end, offset + size)
            if lo < hi:
                yield i, lo - offset, hi - offset, group
        offset += size


@register_compensation
class NoCompensation(CompensationRule):
    """ASGD: the stale gradient as it came."""

    name = "none"

    def compensate_(self, grads, weights, backups, state, settings, *, impl, push=None):
        pass

    def kernel(self, settings):
        return KernelCall(0.0)


@register_compensation
class ConstantCompensation(CompensationRule):
    """DC-ASGD-c: ``g + lambda_0 * g * g * (w - w_bak)``, the correction
    bounded by ``bound * |g|``; the paper's CIFAR-10 lambda_0."""

    name = "constant"
    defaults = {"lambda_0": 0.04, "bound": _default("HVD_DCASGD_BOUND")}

    def compensate_(self, grads, weights, backups, state, settings, *, impl, push=None):
        if settings.lambda_0 > 0:
            dcasgd_(grads, weights, backups, None, lambda_0=settings.lambda_0, bound=settings.bound,
                    **_impl_flags(impl))

    def kernel(self, settings):
        return KernelCall(settings.lambda_0, bound=settings.bound)


@register_compensation
class AdaptiveCompensation(CompensationRule):
    """DC-ASGD-a: lambda scaled element-wise by ``1 / sqrt(MeanSquare + eps)``,
    the correction bounded by ``bound * |g|``."""

    name = "adaptive"
    defaults = {"lambda_0": 2.0, "bound": _default("HVD_DCASGD_BOUND"),
                "mean_square_momentum": _default("HVD_DCASGD_MEAN_SQUARE_MOMENTUM"),
                "eps": _default("HVD_DCASGD_EPS")}

    def state(self, settings):
        return {"mean_square": PER_WORKER if settings.per_worker_mean_square else GLOBAL}

    def compensate_(self, grads, weights, backups, state, settings, *, impl, push=None):
        if settings.lambda_0 > 0:
            dcasgd_(grads, weights, backups, state["mean_square"], lambda_0=settings.lambda_0,
                    mean_square_momentum=settings.mean_square_momentum, eps=settings.eps, bound=settings.bound,
                    **_impl_flags(impl))

    def kernel(self, settings):
        return KernelCall(settings.lambda_0, "mean_square", settings.mean_square_momentum, settings.eps,
                          settings.bound)


@register_compensation
class StalenessCompensation(CompensationRule):
    """Staleness-aware learning rate: Zhang, Gupta, Lian, Liu, "Staleness-aware
    Async-SGD for Distributed Deep Learning", IJCAI 2016, which applies a
    gradient of staleness tau at the rate ``alpha / tau``.

    Implemented as ``g / max(1, tau)`` before the optimizer's step, tau being
    :attr:`Push.staleness`, the updates the server applied since ``w_bak(m)``
    was sent (M - 1 for M workers in round-robin).  The paper takes tau >= 1;
    a fresh gradient (tau = 0, one worker, the ``sync`` schedule) is applied
    as it came.  For plain SGD this is exactly the rate divided by tau; with
    momentum, Adam or weight decay it is the gradient fed to the optimizer
    that is scaled, not the step (the weight decay term is not scaled, and
    Adam's normalisation largely undoes the scaling)."""

    name = "staleness"

    def compensate_(self, grads, weights, backups, state, settings, *, impl, push=None):
        tau = _the_push(self, push).staleness
        if tau > 1:
            for g in grads:
                g.div_(tau)


@register_compensation
class GapAwareCompensation(CompensationRule):
    """Gap-Aware: Barkai, Hakimi, Schuster, "Gap-Aware Mitigation of Gradient
    Staleness", ICLR 2020 (arXiv 1909.10802): a stale gradient is divided,
    element by element, by one plus its Gap, the distance between the weights
    it was computed on and the current ones, in units of C, the typical
    distance a parameter moves in one update:

    * ``v = gamma * v + (1 - gamma) * g * g``, element-wise, over every push
      (the raw gradient, before the penalty);
    * ``C = eta_max * (sqrt(v / (1 - gamma^t)) + eps)``, with Adam's bias
      correction after t updates, and eta_max the largest learning rate the
      parameter's group has been applied with so far;
    * ``g = g / (1 + |w - w_bak(m)| / C)``.

    A fresh gradient (``w = w_bak(m)``) is applied as it came.  These are
    the formulas of the Gap-Aware code of the authors' group for PyTorch
    (``saareliad/FTPipe``, ``pipe/pipeline/gap_aware/sgd_gap_aware.py``,
    ``GapAware.apply_on_theta``), defaults ``gamma = 0.999``, ``eps =
    1e-8``.  Choices made here:

    * ``v`` averages the squared pushed gradient, so C is the step of plain
      SGD; that code averages the squared momentum buffer when SGD has
      momentum, which the compensation, ahead of the user's optimizer, does
      not see (with momentum the steps, so the Gap, are larger and the
      penalty heavier);
    * the weight decay term is not penalised (the optimizer computes it on
      the current weights, which are not stale), where that code divides it
      too;
    * ``v``, its bias correction and eta_max are shared by all workers
      (:data:`GLOBAL`, :data:`PER_GROUP`), as DC-ASGD-a's MeanSquare, and
      updated once per server update;
    * its constants are the settings ``gamma`` and ``gap_eps``;
    * a group never applied at a rate above 0 is not penalised.
    """

    name = "gap_aware"
    #: gamma: the momentum of the running average of g * g; gap_eps: added to its square root.
    defaults = {"gamma": _default("HVD_DCASGD_GAMMA"), "gap_eps": _default("HVD_DCASGD_GAP_EPS")}

    def state(self, settings):
        return {"square_average": GLOBAL, "average_weight": PER_GROUP, "max_lr": PER_GROUP}

    def compensate_(self, grads, weights, backups, state, settings, *, impl, push=None):
        push = _the_push(self, push)
        gamma = settings.gamma
        weight, max_lr = state["average_weight"][0], state["max_lr"][0]
        weight.mul_(gamma).add_(1 - gamma)  # 1 - gamma^t after t updates
        torch.maximum(max_lr, torch.tensor(push.lrs, dtype=max_lr.dtype, device=max_lr.device), out=max_lr)
        rate = max_lr.clamp(min=torch.finfo(max_lr.dtype).tiny)  # 0 / C = 0 where the group never moved
        for i, start, end, group in _group_slices([g.numel() for g in grads], push.group_ranges):
            g = grads[i].view(-1)[start:end]
            v = state["square_average"][i].view(-1)[start:end]
            v.mul_(gamma).addcmul_(g, g, value=1 - gamma)
            c = torch.div(v, weight[group]).sqrt_().add_(settings.gap_eps).mul_(rate[group])
            gap = torch.sub(weights[i].view(-1)[start:end], backups[i].view(-1)[start:end]).abs_()
            g.div_(gap.div_(c).add_(1))


#: The training modes a server understands by name: every built-in
#: compensation, and ``sync``, the shorthand for ``none`` on the ``sync``
#: schedule.  A registered compensation is a mode too.
MODES = (*COMPENSATIONS, "sync")


# --- the settings -----------------------------------------------------------
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
        lambda_0: DC-ASGD's lambda_0 (``constant`` 0.04, ``adaptive`` 2.0 by
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


# --- the formula -----------------------------------------------------------
def dcasgd_(
    grads: Sequence[Tensor],
    weights: Sequence[Tensor],
    backups: Sequence[Tensor],
    mean_squares: Optional[Sequence[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float = _default("HVD_DCASGD_MEAN_SQUARE_MOMENTUM"),
    eps: float = _default("HVD_DCASGD_EPS"),
    bound: float = math.inf,
    foreach: Optional[bool] = None,
    fused: Optional[bool] = None,
) -> None:
    """Delay-compensate ``grads`` against ``weights - backups``, in place:
    each gradient is replaced by its compensated value, ready for any
    optimizer.  ``mean_squares`` (adaptive) are updated in place; pass
    ``None`` for a constant lambda.  ``bound`` limits the correction, element
    by element, to ``bound * |g|`` (``math.inf``, the default here: the
    paper's formula).  ``foreach``/``fused`` pick the implementation; by
    default the fused one is used for contiguous CPU tensors (one pass over
    memory), ``foreach`` elsewhere (a GPU).
    """
    if not (len(grads) == len(weights) == len(backups)):
        raise HvdDcasgdValueError("hvd_dcasgd: grads, weights and backups must have the same length")
    if mean_squares is not None and len(mean_squares) != len(grads):
        raise HvdDcasgdValueError("hvd_dcasgd: one mean_square tensor per gradient is needed")
    if not (bound > 0):
        raise HvdDcasgdValueError(f"hvd_dcasgd: bound must be a number > 0, or inf, got {bound!r}")
    if fused is None and foreach is None:
        fused = all(t.device.type == "cpu" and t.is_contiguous() for t in (*grads, *weights, *backups))
        foreach = not fused
    if fused:
        impl = _fused_dcasgd
    elif foreach:
        impl = _multi_tensor_dcasgd
    else:
        impl = _single_tensor_dcasgd
    impl(
        list(grads),
        list(weights),
        list(backups),
        None if mean_squares is None else list(mean_squares),
        lambda_0=lambda_0,
        mean_square_momentum=mean_square_momentum,
        eps=eps,
        bound=bound,
    )


def clamp_correction_(correction: Tensor, g: Tensor, bound: float) -> Tensor:
    """``correction`` limited to ``[-bound * |g|, bound * |g|]``, in place;
    nothing with ``bound`` infinite.  The C kernel's arithmetic, bit for bit:
    ``lim = bound * |g|``, then ``c > lim ? lim : c < -lim ? -lim : c`` (NaN
    stays NaN, a zero keeps its sign)."""
    if math.isinf(bound):
        return correction
    lim = torch.abs(g).mul_(bound)
    low = torch.neg(lim)
    return correction.copy_(torch.where(correction > lim, lim, torch.where(correction < low, low, correction)))


def _single_tensor_dcasgd(
    grads: List[Tensor],
    weights: List[Tensor],
    backups: List[Tensor],
    mean_squares: Optional[List[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float,
    eps: float,
    bound: float,
) -> None:
    """Reference implementation: the paper's formulas, one tensor at a time,
    the correction then bounded."""
    for i, (g, w, w_bak) in enumerate(zip(grads, weights, backups)):
        g = g.to(w.dtype)
        if mean_squares is None:
            lambda_t = lambda_0
        else:
            mean_square = mean_squares[i]
            mean_square.mul_(mean_square_momentum).add_((1 - mean_square_momentum) * g * g)
            lambda_t = lambda_0 / torch.sqrt(mean_square + eps)
        correction = lambda_t * g * g * (w - w_bak)
        grads[i].copy_(g + clamp_correction_(correction, g, bound))


def _multi_tensor_dcasgd(
    grads: List[Tensor],
    weights: List[Tensor],
    backups: List[Tensor],
    mean_squares: Optional[List[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float,
    eps: float,
    bound: float,
) -> None:
    """The same arithmetic with ``torch._foreach`` ops over the whole list."""
    if not grads:
        return
    g = [t.to(w.dtype) for t, w in zip(grads, weights)]
    gap = torch._foreach_sub(weights, backups)
    correction = torch._foreach_mul(g, g)
    torch._foreach_mul_(correction, gap)
    if mean_squares is None:
        torch._foreach_mul_(correction, lambda_0)
    else:
        torch._foreach_mul_(mean_squares, mean_square_momentum)
        torch._foreach_addcmul_(mean_squares, g, g, value=1 - mean_square_momentum)
        denom = torch._foreach_add(mean_squares, eps)
        torch._foreach_sqrt_(denom)
        torch._foreach_div_(correction, denom)
        torch._foreach_mul_(correction, lambda_0)
    for c, gradient in zip(correction, g):
        clamp_correction_(c, gradient, bound)
    torch._foreach_add_(correction, g)
    for dst, src in zip(grads, correction):
        dst.copy_(src)


def _fused_dcasgd(
    grads: List[Tensor],
    weights: List[Tensor],
    backups: List[Tensor],
    mean_squares: Optional[List[Tensor]],
    *,
    lambda_0: float,
    mean_square_momentum: float,
    eps: float,
    bound: float,
) -> None:
    """One pass over memory (read g, w, w_bak; write g): the C kernel of
    :mod:`hvd_dcasgd.common.native` for float32, else torch ops on
    cache-sized chunks, so that each chunk's temporaries never leave the
    cache."""
    for i, (grad, weight, backup) in enumerate(zip(grads, weights, backups)):
        g_all, w_all, b_all = grad.view(-1), weight.view(-1), backup.view(-1)
        ms_all = None if mean_squares is None else mean_squares[i].view(-1)
        if native.dcasgd_f32(g_all, w_all, b_all, ms_all, lambda_0, mean_square_momentum, eps, lr=None,
                             bound=bound):
            continue
        numel = w_all.numel()
        if numel == 0:
            continue
        chunk = min(FUSED_CHUNK, numel)
        scratch = torch.empty(3 * chunk, dtype=w_all.dtype, device=w_all.device)
        for start in range(0, numel, chunk):
            end = min(start + chunk, numel)
            n = end - start
            w, w_bak = w_all[start:end], b_all[start:end]
            g = g_all[start:end]
            cast = g.dtype != w.dtype
            if cast:
                g = scratch[2 * chunk : 2 * chunk + n].copy_(g)
            if ms_all is None:
                lambda_t = lambda_0
            else:  # lambda_t = lambda_0 / sqrt(MeanSquare + eps), the reference's rounding
                ms = ms_all[start:end]
                ms.mul_(mean_square_momentum).add_(torch.mul(g, 1 - mean_square_momentum, out=scratch[:n]).mul_(g))
                lambda_t = torch.add(ms, eps, out=scratch[chunk : chunk + n]).sqrt_().reciprocal_().mul_(lambda_0)
            correction = torch.mul(g, lambda_t, out=scratch[:n]).mul_(g)  # lambda_t * g * g * (w - w_bak)
            correction.mul_(torch.sub(w, w_bak, out=scratch[chunk : chunk + n]))
            g.add_(clamp_correction_(correction, g, bound))
            if cast:
                g_all[start:end].copy_(g)

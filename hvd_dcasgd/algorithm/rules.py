"""The compensation rules and their registry: ways to correct a stale
gradient (DC-ASGD, Zheng et al., ICML 2017, and others).

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

DC-ASGD's formula itself is :func:`hvd_dcasgd.algorithm.dcasgd.dcasgd_`; the
settings a job chooses a rule and its constants with are
:class:`hvd_dcasgd.algorithm.compensation.Compensation`.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import TYPE_CHECKING, Callable, ClassVar, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Type

import torch
from torch import Tensor

from ..common.config import VARIABLES
from ..common.errors import HvdDcasgdValueError
from .dcasgd import dcasgd_

if TYPE_CHECKING:
    from .compensation import Compensation

__all__ = [
    "COMPENSATIONS", "CompensationRule", "GLOBAL", "KernelCall", "MODES", "PER_GROUP", "PER_WORKER", "Push",
    "compensation_rule", "register_compensation",
]

#: Where a compensation's state lives: one tensor shaped like the model,
#: shared by every worker (the paper's MeanSquare) or one per worker (the
#: authors' code); or ``PER_GROUP``, one number per param group, shared.
GLOBAL, PER_WORKER, PER_GROUP = "global", "per_worker", "per_group"


def _default(variable: str) -> float:
    """A constant's one default: its variable's in the settings table."""
    return VARIABLES[variable].default


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
    #: defaults (any of :data:`~hvd_dcasgd.algorithm.compensation.CONSTANTS`); a constant it does not list is
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
    # lambda_0 8: tuned with the bound at 2 of the 4 values of M, 4 and 8 (docs/RESULTS.md, third design)
    defaults = {"lambda_0": 8.0, "bound": _default("HVD_DCASGD_BOUND"),
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

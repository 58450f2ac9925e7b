"""The bounded DC-ASGD correction against an oracle written here in numpy,
sharing no code with the package: every implementation (reference, foreach,
the fused C kernel and its torch fallback, the server's update paths, the
staged server's pipelined slices) computes

    c   = lambda_t * g * g * (w - w_bak)
    g_c = g + clamp(c, -bound * |g|, bound * |g|)

and ``bound = inf`` is the paper's formula."""

import math

import numpy as np
import pytest
import torch

from hvd_dcasgd import Compensation, dcasgd_
from hvd_dcasgd.algorithm.pipelined import sgd_slice_
from hvd_dcasgd.algorithm.server import _constants_read
from hvd_dcasgd.algorithm.update import PATHS, _update
from hvd_dcasgd.common import native
from hvd_dcasgd.common.config import setting
from hvd_dcasgd.common.errors import HvdDcasgdValueError

F32 = np.float32
MOMENTUM, EPS = 0.95, 1e-7


def oracle(g, w, w_bak, lambda_0, bound, mean_square=None):
    """numpy, float32 at every step, in the paper's order; returns (g_c, the new MeanSquare)."""
    g, w, w_bak = (np.asarray(a, dtype=F32) for a in (g, w, w_bak))
    if mean_square is None:
        lambda_t, ms = F32(lambda_0), None
    else:
        ms = np.asarray(mean_square, dtype=F32) * F32(MOMENTUM) + (F32(1 - MOMENTUM) * g) * g
        lambda_t = (F32(1) / np.sqrt(ms + F32(EPS))) * F32(lambda_0)
    c = lambda_t * g * g * (w - w_bak)
    if not math.isinf(bound):
        lim = F32(bound) * np.abs(g)
        c = np.where(c > lim, lim, np.where(c < -lim, -lim, c))
    return g + c, ms


def case(n=20_011, seed=0, spread=3.0):
    """Gradients, weights and backups far enough apart that the correction often exceeds the gradient."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen)
    w = torch.randn(n, generator=gen)
    w_bak = w + spread * torch.randn(n, generator=gen)
    ms = torch.rand(n, generator=gen)
    return g, w, w_bak, ms


IMPLS = {"reference": dict(foreach=False, fused=False), "foreach": dict(foreach=True, fused=False),
         "fused": dict(fused=True)}


@pytest.mark.parametrize("bound", [0.5, 1.0, math.inf])
@pytest.mark.parametrize("adaptive", [False, True], ids=["constant", "adaptive"])
@pytest.mark.parametrize("impl", IMPLS)
def test_every_implementation_is_the_oracle(fused_kernel, impl, adaptive, bound):
    g, w, w_bak, ms = case()
    lambda_0 = 2.0 if adaptive else 0.5
    expected, expected_ms = oracle(g.numpy(), w.numpy(), w_bak.numpy(), lambda_0, bound, ms.numpy() if adaptive else None)
    mine, my_ms = g.clone(), ms.clone()
    dcasgd_([mine], [w], [w_bak], [my_ms] if adaptive else None, lambda_0=lambda_0, bound=bound, **IMPLS[impl])
    clamped = ~np.isclose(expected - g.numpy(), oracle(g.numpy(), w.numpy(), w_bak.numpy(), lambda_0, math.inf,
                                                       ms.numpy() if adaptive else None)[0] - g.numpy())
    if not math.isinf(bound):
        assert clamped.mean() > 0.2, "the case exercises the bound"
    if adaptive and impl != "foreach":  # foreach's addcmul rounds once where the others round twice
        assert np.array_equal(my_ms.numpy(), expected_ms), "MeanSquare, bit for bit"
    elif adaptive:
        np.testing.assert_allclose(my_ms.numpy(), expected_ms, rtol=1e-6)
    if impl == "foreach" or adaptive:
        # foreach multiplies in another order, and torch's vectorised 1/sqrt may differ in the last bit
        np.testing.assert_allclose(mine.numpy(), expected, rtol=1e-5, atol=1e-6)
    else:
        assert np.array_equal(mine.numpy(), expected), f"{impl} ({fused_kernel}) is the oracle bit for bit"


@pytest.mark.parametrize("bound", [0.25, 1.0])
@pytest.mark.parametrize("impl", IMPLS)
def test_the_correction_never_exceeds_the_bound_nor_reverses_the_gradient(fused_kernel, impl, bound):
    g, w, w_bak, ms = case(seed=1, spread=30.0)
    mine = g.clone()
    dcasgd_([mine], [w], [w_bak], [ms.clone()], lambda_0=8.0, bound=bound, **IMPLS[impl])
    assert bool(((mine - g).abs() <= bound * g.abs() * (1 + 1e-6)).all()), "g_c - g rounds once more than c"
    assert bool((torch.sign(mine) * torch.sign(g) >= 0).all()), "a bound <= 1 keeps each gradient's sign"
    paper = g.clone()
    dcasgd_([paper], [w], [w_bak], [ms.clone()], lambda_0=8.0, bound=math.inf, **IMPLS[impl])
    assert (torch.sign(paper) * torch.sign(g) < 0).float().mean() > 0.2, "the paper's formula reverses many here"


def test_the_kernels_sgd_step_and_the_staged_slices_are_the_oracle_then_sgd():
    """fused_sgd (the C kernel's compensation and step in one pass) and a staged server's pipelined slice
    (torch operations in the kernel's order) both step with the oracle's bounded gradient."""
    g, w, w_bak, ms = case(seed=2)
    lr, bound = 0.1, 0.5
    expected_g, _ = oracle(g.numpy(), w.numpy(), w_bak.numpy(), 0.5, bound)
    expected_w = w.numpy() - F32(lr) * expected_g
    kernel_w, kernel_bak = w.clone(), w_bak.clone()
    assert native.dcasgd_f32(g.clone(), kernel_w, kernel_bak, None, 0.5, MOMENTUM, EPS, lr, bound=bound)
    slice_w, slice_bak = w.clone(), w_bak.clone()
    sgd_slice_(g.clone(), slice_w, slice_bak, None, None, lambda_0=0.5, keep=MOMENTUM, blend=1 - MOMENTUM, eps=EPS,
               bound=bound, lr=lr, weight_decay=0.0, momentum=0.0, carry=0.0, undamped=1.0, nesterov=False)
    for weights, backup in ((kernel_w, kernel_bak), (slice_w, slice_bak)):
        assert np.array_equal(weights.numpy(), expected_w) and torch.equal(backup, weights)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bound", [0.5, math.inf])
def test_each_update_path_steps_with_the_oracles_gradient(path, bound):
    """The server's update, compensate then step, on every path: plain SGD from the oracle's gradient."""
    g, w, w_bak, _ = case(n=3001, seed=3)
    weights, grad, backup, ms = w.clone(), g.clone(), w_bak.clone(), torch.zeros(3001)
    p = torch.nn.Parameter(weights)
    p.grad = grad
    optimizer = torch.optim.SGD([p], lr=0.1)
    _update(weights, grad, backup, {"mean_square": ms}, compensation=Compensation("adaptive", lambda_0=2.0, bound=bound),
            optimizer=optimizer, lrs=[0.1], group_ranges=[(0, 3001)], path=path)
    expected_g, expected_ms = oracle(g.numpy(), w.numpy(), w_bak.numpy(), 2.0, bound, np.zeros(3001, F32))
    np.testing.assert_allclose(weights.numpy(), w.numpy() - F32(0.1) * expected_g, rtol=1e-5, atol=1e-6)
    assert torch.equal(backup, weights), "w_bak is the new weights"
    assert np.array_equal(ms.numpy(), expected_ms)


def test_the_constants_are_settings_each_refused_where_its_compensation_ignores_it():
    assert Compensation("adaptive").constants() == {"lambda_0": 8.0, "bound": 1.0, "mean_square_momentum": 0.95,
                                                    "eps": 1e-7}
    assert Compensation("gap_aware", gamma=0.9999).gamma == 0.9999
    for mode, name, value in [("gap_aware", "lambda_0", 2.0), ("adaptive", "gamma", 0.99), ("none", "bound", 1.0),
                              ("constant", "mean_square_momentum", 0.9), ("sync", "lambda_0", 0.5)]:
        with pytest.raises(HvdDcasgdValueError, match=f"does not use {name} .*it uses"):
            Compensation(mode, **{name: value})
    with pytest.raises(HvdDcasgdValueError, match="per_worker_mean_square does not apply"):
        Compensation("constant", per_worker_mean_square=True)
    for name, value in [("bound", 0.0), ("bound", -1.0), ("bound", math.nan), ("mean_square_momentum", 1.0),
                        ("eps", 0.0), ("lambda_0", math.inf)]:
        with pytest.raises(HvdDcasgdValueError, match=f"{name} must be"):
            Compensation("adaptive", **{name: value})
    with pytest.raises(HvdDcasgdValueError, match="gamma must be"):
        Compensation("gap_aware", gamma=1.0)


def test_each_constant_has_a_variable_whose_value_is_checked():
    assert setting("HVD_DCASGD_BOUND", {"HVD_DCASGD_BOUND": "inf"}) == math.inf
    assert setting("HVD_DCASGD_BOUND", {"HVD_DCASGD_BOUND": "0.5"}) == 0.5
    assert setting("HVD_DCASGD_GAMMA", {"HVD_DCASGD_GAMMA": "0.9999"}) == 0.9999
    for name, bad in [("HVD_DCASGD_BOUND", "0"), ("HVD_DCASGD_GAMMA", "1"), ("HVD_DCASGD_EPS", "-1"),
                      ("HVD_DCASGD_MEAN_SQUARE_MOMENTUM", "x"), ("HVD_DCASGD_GAP_EPS", "0")]:
        with pytest.raises(HvdDcasgdValueError, match=f"{name}='{bad}' is not valid"):
            setting(name, {name: bad})


def test_a_checkpoint_from_before_the_bound_reads_as_the_rule_it_ran():
    """Written before the constants were settings: DC-ASGD ran the paper's formula, Gap-Aware its class
    constants, and every rule carried lambda_0, MeanSquare's momentum and eps."""
    old = dict(lambda_0=2.0, mean_square_momentum=0.95, eps=1e-7, per_worker_mean_square=False, schedule="async")
    from dataclasses import asdict

    assert _constants_read({"mode": "adaptive", **old}) == asdict(Compensation("adaptive", lambda_0=2.0, bound=math.inf))
    assert _constants_read({"mode": "gap_aware", **old, "lambda_0": 0.0}) == asdict(Compensation("gap_aware"))
    assert _constants_read({"mode": "none", **old, "lambda_0": 0.0}) == asdict(Compensation("none"))


def test_the_divergence_advice_names_the_constants_the_rule_uses():
    assert Compensation("adaptive").divergence_advice().startswith(
        "lower the learning rate; lower lambda_0 (HVD_DCASGD_LAMBDA, now 8)")
    paper = Compensation("constant", bound=math.inf).divergence_advice()
    assert "bound the correction (HVD_DCASGD_BOUND=1: it is unbounded now" in paper and "now 0.04" in paper
    assert Compensation("none").divergence_advice().startswith("lower the learning rate (docs/USAGE.md")


@pytest.mark.parametrize("adaptive", [False, True], ids=["constant", "adaptive"])
@pytest.mark.parametrize("step", ["compensate", "sgd", "momentum", "nesterov"])
def test_the_kernel_without_the_clamp_is_the_bounded_one_that_never_clamps(adaptive, step):
    """bound = inf runs the C kernel's variants without the clamp's arithmetic: bit for bit what the clamped
    variants give at a finite bound too large to clamp anything (float32's largest), for every variant, zero
    gradients included (where bound * |g| is NaN at inf); a bound that clamps (0.5) gives another result."""
    if native.library() is None:
        pytest.fail("the C kernel must build here (cc and OpenMP are installed)")
    g, w, w_bak, ms = case(n=200_003, seed=4)  # past the kernel's threading threshold
    g[::97] = 0.0
    results = []
    for bound in (math.inf, float(np.finfo(F32).max), 0.5):
        tensors = [t.clone() for t in (g, w, w_bak, ms)] + [torch.full_like(g, 0.25)]
        grad, weight, backup, mean_square, buffer = tensors
        assert native.dcasgd_f32(grad, weight, backup, mean_square if adaptive else None, 0.5, MOMENTUM, EPS,
                                 None if step == "compensate" else 0.1, weight_decay=0.01,
                                 momentum=0.0 if step in ("compensate", "sgd") else 0.9, nesterov=step == "nesterov",
                                 momentum_buffer=buffer if step in ("momentum", "nesterov") else None, bound=bound)
        results.append(tensors)
    unbounded, never_clamps, clamps = results
    for unclamped, clamped in zip(unbounded, never_clamps):
        assert torch.equal(unclamped, clamped)
    changed = 0 if step == "compensate" else 1  # the gradient, or the weights
    assert not torch.equal(clamps[changed], unbounded[changed]), "the bound of 0.5 clamped nothing"

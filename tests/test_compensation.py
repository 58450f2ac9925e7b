"""The compensation math: hand-computed cases, and fast implementations
against the reference that reads like the paper's formula."""

import math
import sys

import pytest
import torch

from hvd_dcasgd import Compensation, dcasgd_
from hvd_dcasgd.algorithm import dcasgd as dcasgd_module
from hvd_dcasgd.common import native
from hvd_dcasgd.common.errors import HvdDcasgdError, HvdDcasgdValueError
from hvd_dcasgd.protocol.layout import ModelLayout
from hvd_dcasgd.algorithm.update import FUSED, FUSED_SGD, PATHS, ServerUpdate, _update

IMPLEMENTATIONS = [dict(foreach=False, fused=False), dict(foreach=True, fused=False), dict(fused=True)]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_constant_hand_computed(impl, fused_kernel):
    g = torch.tensor([1.0, 2.0, -3.0])
    w = torch.tensor([1.0, 1.0, 2.0])
    w_bak = torch.tensor([0.0, 0.5, 2.5])
    dcasgd_([g], [w], [w_bak], None, lambda_0=0.04, **impl)
    # g + 0.04 * g^2 * (w - w_bak)
    assert torch.allclose(g, torch.tensor([1.04, 2.08, -3.18]))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_adaptive_hand_computed(impl, fused_kernel):
    g = torch.tensor([2.0, -1.0])
    w = torch.tensor([1.0, 0.0])
    w_bak = torch.tensor([0.5, 1.0])
    ms = torch.tensor([0.0, 4.0])
    dcasgd_([g], [w], [w_bak], [ms], lambda_0=2.0, mean_square_momentum=0.95, eps=1e-7, **impl)
    ms_expected = [0.05 * 4.0, 0.95 * 4.0 + 0.05 * 1.0]  # 0.2, 3.85
    assert torch.allclose(ms, torch.tensor(ms_expected))
    lam = [2.0 / math.sqrt(m + 1e-7) for m in ms_expected]
    expected = [2.0 + lam[0] * 4.0 * 0.5, -1.0 + lam[1] * 1.0 * -1.0]
    assert torch.allclose(g, torch.tensor(expected), rtol=1e-6)


@pytest.mark.parametrize("path", PATHS)
def test_update_compensates_then_steps_and_records_the_backup(path, fused_kernel):
    """Every path of the update: compensated gradient, SGD's step, w_bak = w."""
    w, w_bak = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.5])
    grad = torch.tensor([1.0, 2.0])
    optimizer, group_ranges = _flat_sgd(w, grad, lr=0.5)
    path = FUSED if path == FUSED_SGD and fused_kernel != "native" else path
    _update(w, grad, w_bak, {}, compensation=Compensation("constant"), optimizer=optimizer, lrs=[0.5],
            group_ranges=group_ranges, path=path)
    assert torch.allclose(w, torch.tensor([1.0 - 0.5 * 1.04, 1.0 - 0.5 * 2.08]))
    assert torch.equal(w_bak, w)


@pytest.mark.parametrize("path", PATHS)
def test_zero_lambda_is_plain_sgd(path, fused_kernel):
    g, w, w_bak = torch.randn(100), torch.randn(100), torch.randn(100)
    expected = w - 0.1 * g
    optimizer, group_ranges = _flat_sgd(w, g, lr=0.1)
    path = FUSED if path == FUSED_SGD and fused_kernel != "native" else path
    _update(w, g, w_bak, {}, compensation=Compensation("constant", lambda_0=0.0), optimizer=optimizer, lrs=[0.1],
            group_ranges=group_ranges, path=path)
    assert torch.allclose(w, expected)
    assert torch.equal(w_bak, w)


def test_a_forced_path_that_cannot_run_is_refused_with_a_sentence():
    """fused_sgd on float64 tensors: refused when the path is chosen, and
    the update itself raises rather than silently doing nothing."""
    w, w_bak, grad = torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    optimizer, group_ranges = _flat_sgd(w, grad, lr=0.5)
    layout = ModelLayout.of(optimizer)
    with pytest.raises(HvdDcasgdValueError, match="cannot take the 'fused_sgd' path: the C kernel takes contiguous "
                                                  "float32 CPU tensors"):
        ServerUpdate(optimizer, layout, Compensation("constant"), w, grad, 1, staged=False, path=FUSED_SGD)
    with pytest.raises(HvdDcasgdValueError, match="unknown update path 'fastest'"):
        ServerUpdate(optimizer, layout, Compensation("constant"), w, grad, 1, staged=False, path="fastest")
    before = w.clone()
    with pytest.raises(HvdDcasgdError, match="'fused_sgd' update did not run on param group 0"):
        _update(w, grad, w_bak, {}, compensation=Compensation("constant"), optimizer=optimizer, lrs=[0.5],
                group_ranges=group_ranges, path=FUSED_SGD)
    assert torch.equal(w, before)


def _flat_sgd(weights, grad, lr):
    """torch.optim.SGD over one parameter that is ``weights``, with gradient ``grad``."""
    p = torch.nn.Parameter(weights)
    p.grad = grad
    return torch.optim.SGD([p], lr=lr), [(0, weights.numel())]


def _random_case(sizes, seed, grad_dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    make = lambda: [torch.randn(n, generator=gen) for n in sizes]  # noqa: E731
    g = [t.to(grad_dtype) for t in make()]
    w = make()
    w_bak = [x + 0.1 * y for x, y in zip(w, make())]
    ms = [t.abs() for t in make()]
    return g, w, w_bak, ms


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS[1:])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.float16])
def test_fast_implementations_match_reference(fused_kernel, adaptive, impl, grad_dtype):
    sizes = [4567, 1, 1000, 2500]
    ref = _random_case(sizes, 0, grad_dtype)
    fast = _random_case(sizes, 0, grad_dtype)
    kwargs = dict(lambda_0=2.0 if adaptive else 0.04, mean_square_momentum=0.9, eps=1e-7)
    dcasgd_(ref[0], ref[1], ref[2], ref[3] if adaptive else None, foreach=False, fused=False, **kwargs)
    dcasgd_(fast[0], fast[1], fast[2], fast[3] if adaptive else None, **impl, **kwargs)
    tol = 1e-3 if grad_dtype == torch.float16 else 1e-5
    for a, b in zip(ref[0] + ref[1] + ref[2] + ref[3], fast[0] + fast[1] + fast[2] + fast[3]):
        assert torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def test_default_is_fused_for_contiguous_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(dcasgd_module, "_fused_dcasgd", lambda *a, **k: calls.append("fused"))
    dcasgd_([torch.ones(3)], [torch.ones(3)], [torch.ones(3)], None, lambda_0=0.04)
    assert calls == ["fused"]


def test_compensation_defaults_and_validation():
    assert Compensation("constant").lambda_0 == 0.04
    assert Compensation("adaptive").lambda_0 == 8.0
    assert Compensation("adaptive").bound == 1.0 and Compensation("constant").bound == 1.0
    assert Compensation("gap_aware").constants() == {"gamma": 0.999, "gap_eps": 1e-8}
    assert Compensation("none").lambda_0 is None and Compensation("none").constants() == {}, "ASGD has no constant"
    assert Compensation("adaptive", bound=math.inf).bound == math.inf, "the paper's rule"
    assert Compensation("sync") == Compensation("none", schedule="sync"), "sync is a shorthand"
    with pytest.raises(ValueError, match="unknown schedule 'later'"):
        Compensation("none", schedule="later")
    with pytest.raises(ValueError, match="unknown compensation 'fast'"):
        Compensation("fast")
    with pytest.raises(ValueError, match="lambda_0"):
        Compensation("constant", lambda_0=float("nan"))


def test_native_kernel_is_used_for_float32_and_can_be_switched_off(tmp_path):
    from helpers import run

    probe = ("import torch, hvd_dcasgd.common.native as n; t = torch.ones(4); "
             "print(n.dcasgd_f32(t, t.clone(), t.clone(), None, 0.04, 0.95, 1e-7, 0.1), "
             "n.dcasgd_f32(t.half(), t.half(), t.half(), None, 0.04, 0.95, 1e-7, 0.1))")
    env = {"HVD_DCASGD_CACHE": str(tmp_path)}
    assert run([sys.executable, "-c", probe], env=env).stdout.split() == ["True", "False"]
    assert list(tmp_path.glob("dcasgd_kernel_*.so")), "the library is cached"
    off = run([sys.executable, "-c", probe], env={**env, "HVD_DCASGD_NATIVE": "0"})
    assert off.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("adaptive", [False, True])
def test_native_kernel_rounds_like_the_reference(adaptive):
    """Bit-identical where torch rounds exactly; torch's vectorised sqrt is not
    correctly rounded, so lambda_t (adaptive) may differ in the last bit."""
    assert native.library() is not None
    ref = _random_case([100_003], 3)
    fast = _random_case([100_003], 3)
    kwargs = dict(lambda_0=2.0 if adaptive else 0.04, mean_square_momentum=0.95, eps=1e-7)
    dcasgd_(ref[0], ref[1], ref[2], ref[3] if adaptive else None, foreach=False, fused=False, **kwargs)
    assert native.dcasgd_f32(fast[0][0], fast[1][0], fast[2][0], fast[3][0] if adaptive else None, lr=None, **kwargs)
    assert torch.equal(ref[3][0], fast[3][0]), "MeanSquare is bit-identical"
    if adaptive:
        assert torch.allclose(ref[0][0], fast[0][0], rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(ref[0][0], fast[0][0])

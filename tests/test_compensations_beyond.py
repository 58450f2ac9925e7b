"""The compensations beyond DC-ASGD: the staleness-aware learning rate
(``staleness``) and Gap-Aware (``gap_aware``), by hand on tiny tensors, on
the server against a naive reference, in the simulator, and through a
checkpoint."""

from collections import Counter

import pytest
import torch

from hvd_dcasgd.algorithm.compensation import Compensation, CompensationState
from hvd_dcasgd.algorithm.rules import COMPENSATIONS, GLOBAL, PER_GROUP, CompensationRule, Push, register_compensation
from hvd_dcasgd.common.errors import HvdDcasgdValueError
from hvd_dcasgd.algorithm.simulator import RoundRobin, simulate
from hvd_dcasgd.algorithm.update import FOREACH, FUSED, REFERENCE, default_update_path, lr_factor

from helpers import (
    BATCH, SELF_WORKERS, apply_pushes, assert_same, digits_data, digits_model, fresh_server, lr_of_epoch, push_gradient,
    reference_step, server_and_reference,
)

GAMMA, EPS = 0.999, 1e-8
STALENESS = COMPENSATIONS["staleness"]
GAP_AWARE = COMPENSATIONS["gap_aware"]


def _push_of(staleness=0, lrs=(0.1,), group_ranges=((0, 3),)):
    return Push(staleness, list(lrs), list(group_ranges))


def _gap_state(numel, groups=1, dtype=torch.float64):
    settings = Compensation("gap_aware")
    return CompensationState(settings, torch.zeros(numel, dtype=dtype), num_workers=1, num_groups=groups).tensors


# --- staleness: g / max(1, tau) -----------------------------------------------
@pytest.mark.parametrize("tau,factor", [(0, 1.0), (1, 1.0), (3, 1 / 3), (8, 1 / 8)])
def test_staleness_divides_the_gradient_by_tau(tau, factor):
    g = torch.tensor([3.0, -6.0, 1.5])
    grads = [g.clone(), torch.tensor([[9.0]])]
    STALENESS.compensate_(grads, [None, None], [None, None], {}, Compensation("staleness"), impl="reference",
                          push=_push_of(tau))
    # tau = 3: [3, -6, 1.5] / 3 = [1, -2, 0.5] and 9 / 3 = 3, exactly; tau 0 and 1 leave g as it came
    assert torch.equal(grads[0], g / max(1, tau))
    assert torch.equal(grads[1], torch.tensor([[9.0 / max(1, tau)]]))
    assert torch.allclose(grads[0], g * factor, rtol=1e-7, atol=0)
    if tau == 3:
        assert grads[0].tolist() == [1.0, -2.0, 0.5]


def test_a_rule_that_reads_the_push_says_so_without_one():
    for rule in (STALENESS, GAP_AWARE):
        with pytest.raises(HvdDcasgdValueError, match=f"the '{rule.name}' compensation needs the push"):
            rule.compensate_([torch.ones(3)], [torch.ones(3)], [torch.ones(3)], _gap_state(3, dtype=torch.float32),
                             Compensation(rule.name), impl="reference")


# --- gap_aware: g / (1 + |w - w_bak| / C) ---------------------------------------
def test_gap_aware_by_hand_one_push():
    """First push, one group at lr 0.1: v = (1 - gamma) g^2, bias correction
    1 - gamma, so v_hat = g^2 and C = 0.1 * (|g| + eps).  With gaps of 0,
    C / 2, C and 3 C the gradient is divided by 1, 1.5, 2 and 4: the penalty
    is one plus the Gap in units of C (a gap below C is penalised too)."""
    g = torch.tensor([2.0, -4.0, 0.5, 1.0], dtype=torch.float64)
    c = 0.1 * (g.abs() + EPS)  # [0.2, 0.4, 0.05, 0.1] (+ 1e-9)
    w = torch.tensor([1.0, 1.0, -1.0, 0.0], dtype=torch.float64)
    w_bak = w - torch.tensor([0.0, 0.5, -1.0, 3.0], dtype=torch.float64) * c  # gaps 0, C/2, C, 3C
    state = _gap_state(4)
    grads = [g.clone()]
    GAP_AWARE.compensate_(grads, [w], [w_bak], state, Compensation("gap_aware"), impl="fused",
                          push=_push_of(3, lrs=[0.1], group_ranges=[(0, 4)]))
    expected = torch.tensor([2.0 / 1, -4.0 / 1.5, 0.5 / 2, 1.0 / 4], dtype=torch.float64)
    assert torch.allclose(grads[0], expected, rtol=1e-12, atol=0)
    assert grads[0][0] == 2.0, "no gap, no penalty"
    assert torch.allclose(state["square_average"][0], (1 - GAMMA) * g * g, rtol=1e-15, atol=0)
    assert torch.allclose(state["average_weight"][0], torch.tensor([1 - GAMMA], dtype=torch.float64), rtol=1e-15)
    assert state["max_lr"][0].tolist() == [0.1]


def test_gap_aware_state_over_two_pushes_and_two_groups():
    """Two groups, [0, 2) and [2, 4); lrs (0.1, 0.01) then (0.05, 0.02):
    eta_max becomes (0.1, 0.02).  After the second push
    v = gamma (1 - gamma) g1^2 + (1 - gamma) g2^2 and the bias correction is
    1 - gamma^2, so v_hat = (gamma g1^2 + g2^2) / (1 + gamma)."""
    g1 = torch.tensor([1.0, -2.0, 3.0, 0.0], dtype=torch.float64)
    g2 = torch.tensor([3.0, 2.0, -1.0, 4.0], dtype=torch.float64)
    state = _gap_state(4, groups=2)
    ranges = [(0, 2), (2, 4)]
    w = torch.zeros(4, dtype=torch.float64)
    comp = Compensation("gap_aware")
    first = [g1.clone()]
    GAP_AWARE.compensate_(first, [w], [w.clone()], state, comp, impl="reference",
                          push=_push_of(0, lrs=[0.1, 0.01], group_ranges=ranges))
    assert torch.equal(first[0], g1), "the weights it was computed on are the current ones: no penalty"

    v_hat = (GAMMA * g1 * g1 + g2 * g2) / (1 + GAMMA)  # [(0.999 + 9) / 1.999, ...]
    eta_max = torch.tensor([0.1, 0.1, 0.02, 0.02], dtype=torch.float64)
    c = eta_max * (v_hat.sqrt() + EPS)
    gap = torch.tensor([1.0, 0.0, 2.0, 0.5], dtype=torch.float64) * c  # in units of C: 1, 0, 2, 0.5
    w_bak = w + gap * torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)  # the sign does not matter
    second = [g2.clone()]
    GAP_AWARE.compensate_(second, [w], [w_bak], state, comp, impl="reference",
                          push=_push_of(2, lrs=[0.05, 0.02], group_ranges=ranges))
    assert torch.allclose(second[0], g2 / torch.tensor([2.0, 1.0, 3.0, 1.5], dtype=torch.float64), rtol=1e-12, atol=0)
    assert torch.allclose(state["square_average"][0], GAMMA * (1 - GAMMA) * g1 * g1 + (1 - GAMMA) * g2 * g2,
                          rtol=1e-14, atol=0)
    assert torch.allclose(state["average_weight"][0], torch.full((2,), 1 - GAMMA**2, dtype=torch.float64),
                          rtol=1e-12, atol=0)
    assert state["max_lr"][0].tolist() == [0.1, 0.02]


def test_gap_aware_on_several_tensors_is_gap_aware_on_their_concatenation():
    """``group_ranges`` index the concatenation: groups [0, 3) and [3, 7)
    across tensors of 2, 4 and 1 elements."""
    gen = torch.Generator().manual_seed(3)
    sizes, ranges = [2, 4, 1], [(0, 3), (3, 7)]
    comp = Compensation("gap_aware")
    flat_state = _gap_state(7, 2, torch.float32)
    flat = {k: torch.randn(7, generator=gen) for k in ("g", "w", "w_bak")}
    parts = {k: [t.clone() for t in v.split(sizes)] for k, v in flat.items()}
    split_state = {"square_average": [torch.zeros(n) for n in sizes], "average_weight": [torch.zeros(2)],
                   "max_lr": [torch.zeros(2)]}
    for lrs in ([0.1, 0.3], [0.2, 0.1]):
        flat["g"] = torch.randn(7, generator=gen)
        parts["g"] = [t.clone() for t in flat["g"].split(sizes)]
        push = _push_of(1, lrs=lrs, group_ranges=ranges)
        GAP_AWARE.compensate_([flat["g"]], [flat["w"]], [flat["w_bak"]], flat_state, comp, impl="foreach",
                              push=push)
        GAP_AWARE.compensate_(parts["g"], parts["w"], parts["w_bak"], split_state, comp, impl="foreach",
                              push=push)
        assert torch.equal(torch.cat(parts["g"]), flat["g"])
    assert torch.equal(torch.cat(split_state["square_average"]), flat_state["square_average"][0])
    assert split_state["max_lr"][0].tolist() == pytest.approx([0.2, 0.3])


def test_a_group_never_stepped_is_not_penalised():
    g = torch.tensor([1.0, 2.0])
    grads = [g.clone()]
    GAP_AWARE.compensate_(grads, [torch.zeros(2)], [torch.zeros(2)], _gap_state(2, dtype=torch.float32),
                          Compensation("gap_aware"), impl="reference",
                          push=_push_of(1, lrs=[0.0], group_ranges=[(0, 2)]))
    assert torch.equal(grads[0], g)


def test_the_state_and_the_path_of_the_new_rules():
    assert STALENESS.state(Compensation("staleness")) == {}
    assert GAP_AWARE.state(Compensation("gap_aware")) == {"square_average": GLOBAL, "average_weight": PER_GROUP,
                                                          "max_lr": PER_GROUP}
    for mode in ("staleness", "gap_aware"):
        assert COMPENSATIONS[mode].kernel(Compensation(mode)) is None
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1)
        path, why = default_update_path(optimizer, Compensation(mode), [torch.zeros(3)], staged=False)
        assert path == FUSED
        assert why.startswith(f"the C kernel does not compute the {mode!r} compensation"), why


# --- on the server ------------------------------------------------------------------
@pytest.fixture
def spy():
    """A rule that records every push it is given."""
    seen = []

    @register_compensation
    class Spy(CompensationRule):
        name = "spy"

        def compensate_(self, grads, weights, backups, state, settings, *, impl, push=None):
            seen.append(push)

    yield seen
    del COMPENSATIONS["spy"]


@pytest.mark.parametrize("lr_scaling", ["none", "horovod"])
def test_the_server_tells_a_rule_the_staleness_and_the_rates_it_applies(spy, lr_scaling):
    server = fresh_server("sgd", Compensation("spy"), lr_factor=lr_factor(lr_scaling, "async", SELF_WORKERS))
    order = [0, 1, 2, 1, 0, 0, 2, 1]
    sent_at, expected = [0] * SELF_WORKERS, []
    for update, worker in enumerate(order):
        push_gradient(server, worker, seed=update, lrs=[0.3, 0.6])
        server.apply(worker)
        expected.append(update - sent_at[worker])
        sent_at[worker] = update + 1
    assert [p.staleness for p in spy] == expected == [0, 1, 2, 1, 3, 0, 3, 3]
    assert server.telemetry.staleness == Counter(expected), "what the trace records"
    factor = 1 / SELF_WORKERS if lr_scaling == "horovod" else 1.0
    assert all(list(p.lrs) == pytest.approx([0.3 * factor, 0.6 * factor]) for p in spy)
    assert all(list(p.group_ranges) == server.layout.group_ranges() for p in spy)
    assert server.optimizer.param_groups[0]["lr"] == pytest.approx(0.3), "the optimizer shows the workers' rate"


def test_a_round_of_the_sync_schedule_is_fresh(spy):
    server = fresh_server("sgd", Compensation("spy", schedule="sync"))
    for round_ in range(3):
        for m in range(SELF_WORKERS):
            push_gradient(server, m, seed=10 * round_ + m, lrs=[0.1, 0.1])
        server.apply_round(range(SELF_WORKERS))
    assert [p.staleness for p in spy] == [0, 0, 0]


@pytest.mark.parametrize("path", [None, REFERENCE, FOREACH], ids=["default-path", "reference-path", "foreach-path"])
@pytest.mark.parametrize("staged", [False, True], ids=["window-backups", "staged-device-path"])
@pytest.mark.parametrize("optimizer_name", ["sgd", "sgd-momentum-wd", "sgd-per-group", "adam"])
@pytest.mark.parametrize("mode", ["staleness", "gap_aware"])
def test_server_updates_match_a_naive_reference(mode, optimizer_name, staged, path):
    """The formulas written out in plain torch, then a copy of the optimizer."""
    server, model, reference, reference_optimizer, comp = server_and_reference(optimizer_name, mode, staged=staged, path=path)
    assert server.update.path == (path or FUSED), server.update.why
    params = [p for group in reference_optimizer.param_groups for p in group["params"]]  # the wire's order
    flat = lambda: torch.cat([p.detach().reshape(-1) for p in params])  # noqa: E731
    group_of = torch.cat([torch.full((sum(p.numel() for p in group["params"]),), i)
                          for i, group in enumerate(reference_optimizer.param_groups)])
    backups = [flat() for _ in range(SELF_WORKERS)]
    sent_at = [0] * SELF_WORKERS
    v, eta_max = torch.zeros_like(backups[0]), torch.zeros(len(reference_optimizer.param_groups))
    for update, worker in enumerate([0, 1, 2, 1, 0, 0, 2, 1, 1, 2]):
        lrs = [0.1 / (1 + update), 0.05]
        g = push_gradient(server, worker, seed=update, lrs=lrs)
        server.apply(worker)
        w = flat()
        if mode == "staleness":
            g = g / max(1, update - sent_at[worker])
        else:
            v = GAMMA * v + (1 - GAMMA) * g * g
            eta_max = torch.maximum(eta_max, torch.tensor(lrs))
            c = eta_max[group_of] * (torch.sqrt(v / (1 - GAMMA ** (update + 1))) + EPS)
            g = g / (1 + (w - backups[worker]).abs() / c)
        reference_step(reference_optimizer, params, g, lrs)
        backups[worker], sent_at[worker] = flat(), update + 1
        assert torch.allclose(server.weights, backups[worker], rtol=1e-5, atol=1e-6), f"update {update}"
    if mode == "gap_aware":
        state = server.update.state.tensors
        assert torch.allclose(state["square_average"][0], v, rtol=1e-5, atol=1e-9)
        assert torch.allclose(state["max_lr"][0], eta_max)


# --- in the simulator ---------------------------------------------------------------
class PlainSGD(torch.optim.SGD):
    """torch's SGD, so that every mode takes the same path (compensate, then torch steps)."""


def _simulate(compensation, workers, optimizer=None):
    train, test = digits_data()
    return simulate(digits_model, train, test, compensation=compensation, workers=workers, epochs=2, batch_size=BATCH,
                    lr=lr_of_epoch, delay=RoundRobin(), optimizer=optimizer)


@pytest.mark.parametrize("mode", ["staleness", "gap_aware"])
def test_one_worker_is_sequential_sgd_bit_for_bit(mode):
    """Staleness 0 and no gap: the gradients are applied as they came."""
    plain = lambda params: PlainSGD(params, lr=lr_of_epoch(0))  # noqa: E731
    ours, none = _simulate(mode, 1, plain), _simulate("none", 1, plain)
    assert set(ours.staleness) == {0}
    assert torch.equal(ours.weights, none.weights)
    assert ours.test_errors == none.test_errors


@pytest.mark.parametrize("mode", ["staleness", "gap_aware"])
def test_the_sync_schedule_is_ssgd_bit_for_bit(mode):
    plain = lambda params: PlainSGD(params, lr=lr_of_epoch(0))  # noqa: E731
    ours = _simulate(Compensation(mode, schedule="sync"), 4, plain)
    none = _simulate(Compensation("none", schedule="sync"), 4, plain)
    assert torch.equal(ours.weights, none.weights)


@pytest.mark.parametrize("mode", ["staleness", "gap_aware"])
def test_four_workers_train_and_differ_from_asgd(mode):
    ours, none = _simulate(mode, 4), _simulate("none", 4)
    assert set(ours.staleness) == {0, 1, 2, 3} and ours.staleness[3] == ours.updates - 3
    assert torch.isfinite(ours.weights).all()
    assert not torch.equal(ours.weights, none.weights)
    assert ours.final_error < 0.9, "it learns (ten classes: chance is 0.9)"


# --- through a checkpoint ------------------------------------------------------------
@pytest.mark.parametrize("optimizer_name", ["sgd", "sgd-momentum-wd", "sgd-per-group", "adam"])
@pytest.mark.parametrize("mode", ["staleness", "gap_aware"])
def test_a_loaded_server_continues_bit_for_bit(optimizer_name, mode, tmp_path):
    comp = Compensation(mode)
    original = fresh_server(optimizer_name, comp)
    apply_pushes(original, range(5))
    torch.save(original.state_dict(), tmp_path / "server.pt")
    state = torch.load(tmp_path / "server.pt", weights_only=True)
    expected = {"staleness": [], "gap_aware": ["average_weight", "max_lr", "square_average"]}[mode]
    assert sorted(state["compensation_state"]) == expected
    if mode == "gap_aware":
        assert state["compensation_state"]["max_lr"][0].shape == (len(original.layout.group_ranges()),)
        assert state["compensation_state"]["square_average"][0].abs().sum() > 0

    resumed = fresh_server(optimizer_name, comp, seed=7)
    resumed.load_state_dict(state)
    assert_same(resumed.state_dict(), original.state_dict())
    apply_pushes(original, range(5, 12))
    apply_pushes(resumed, range(5, 12))
    assert_same(resumed.state_dict(), original.state_dict())


def test_a_gap_aware_state_of_another_shape_changes_nothing():
    server = fresh_server("sgd", Compensation("gap_aware"))
    apply_pushes(server, range(3))
    state = server.state_dict()
    state["compensation_state"]["max_lr"][0] = torch.zeros(5)
    before = server.state_dict()
    with pytest.raises(HvdDcasgdValueError, match="compensation state 'max_lr'"):
        server.load_state_dict(state)
    assert_same(server.state_dict(), before)

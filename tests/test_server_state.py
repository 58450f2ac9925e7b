"""The server's state: a server loaded from another's state_dict applies the
next pushes bit for bit as the original would; a new compensation is one
registered class."""

import copy

import pytest
import torch

from hvd_dcasgd.algorithm.compensation import Compensation
from hvd_dcasgd.algorithm.rules import COMPENSATIONS, GLOBAL, CompensationRule, register_compensation
from hvd_dcasgd.common.errors import HvdDcasgdValueError
from hvd_dcasgd.algorithm.update import FUSED_SGD, lr_factor

from helpers import SELF_WORKERS, apply_pushes, assert_same, fresh_server, push_gradient

@pytest.mark.parametrize("optimizer_name", ["sgd", "sgd-momentum-wd", "sgd-per-group", "adam"])
@pytest.mark.parametrize("mode,per_worker", [("none", False), ("constant", False), ("adaptive", False),
                                             ("adaptive", True)])
def test_a_loaded_server_continues_bit_for_bit(optimizer_name, mode, per_worker, tmp_path):
    comp = Compensation(mode, per_worker_mean_square=per_worker)
    original = fresh_server(optimizer_name, comp)
    apply_pushes(original, range(5))
    torch.save(original.state_dict(), tmp_path / "server.pt")
    state = torch.load(tmp_path / "server.pt", weights_only=True)  # plain tensors and values only

    resumed = fresh_server(optimizer_name, comp, seed=7)
    assert not torch.equal(resumed.weights, original.weights)
    resumed.load_state_dict(state)
    assert resumed.update.path == original.update.path
    assert_same(resumed.state_dict(), original.state_dict())
    apply_pushes(original, range(5, 12))
    apply_pushes(resumed, range(5, 12))
    assert_same(resumed.state_dict(), original.state_dict())
    for m in range(SELF_WORKERS):
        assert torch.equal(resumed.outboxes[m], original.outboxes[m]), "each worker is sent its own backup"
    if optimizer_name != "sgd" and original.update.path == FUSED_SGD:
        assert resumed.update.momentum.started == original.update.momentum.started


def test_state_holds_every_part_and_is_a_copy():
    comp = Compensation("adaptive", per_worker_mean_square=True)
    server = fresh_server("sgd-momentum-wd", comp)
    apply_pushes(server, range(4))
    state = server.state_dict()
    assert state["format"] == 2
    assert state["settings"]["compensation"] == {**comp.__dict__}
    assert state["settings"]["num_workers"] == SELF_WORKERS
    # pushes from workers 0, 1, 2, 1: each sent_at is the update count right after its last push
    assert state["updates"] == 4 and state["pushes"] == [1, 2, 1] and state["sent_at"] == [1, 4, 3]
    assert state["refused"] == [0, 0, 0]
    assert len(state["backups"]) == SELF_WORKERS and len(state["compensation_state"]["mean_square"]) == SELF_WORKERS
    assert sorted(state["optimizer"]["state"]) == [0, 1, 2, 3]
    before = copy.deepcopy(state)
    apply_pushes(server, range(4, 6))
    assert_same(state, before)  # later updates do not reach a state already taken


@pytest.mark.parametrize("change,message", [
    (lambda s: s.update(format=99), "not a server state of format 2"),
    (lambda s: s["settings"]["compensation"].update(lambda_0=0.5), "compensation"),
    (lambda s: s["backups"].pop(), "weights and backups are shaped"),
    (lambda s: s["compensation_state"]["mean_square"].append(torch.zeros(3)), "compensation state 'mean_square'"),
])
def test_a_state_that_does_not_fit_changes_nothing(change, message):
    comp = Compensation("adaptive")
    server = fresh_server("sgd-momentum-wd", comp)
    apply_pushes(server, range(3))
    state = server.state_dict()
    change(state)
    before = server.state_dict()
    with pytest.raises(HvdDcasgdValueError, match=message):
        server.load_state_dict(state)
    assert_same(server.state_dict(), before)


@pytest.mark.parametrize("lr_scaling", ["none", "horovod"])
def test_a_state_saved_under_the_earlier_names_loads(lr_scaling):
    """Files written before kept the untrained state under "extras" (its
    names under "buffers" in the settings) and lr_scaling in the
    compensation's settings; they load, and a server of another rate factor
    still refuses them."""
    comp = Compensation("adaptive")
    factor = lr_factor(lr_scaling, "async", SELF_WORKERS)
    original = fresh_server("sgd-momentum-wd", comp, untrained_state={"count": torch.arange(3.0)}, lr_factor=factor)
    apply_pushes(original, range(4))
    state = original.state_dict()
    state["extras"] = state.pop("untrained_state")
    settings = state["settings"]
    settings["buffers"] = settings.pop("untrained_state")
    del settings["lr_factor"]
    settings["compensation"]["lr_scaling"] = lr_scaling
    resumed = fresh_server("sgd-momentum-wd", comp, seed=7, untrained_state={"count": torch.zeros(3)},
                           lr_factor=factor)
    resumed.load_state_dict(state)
    assert_same(resumed.state_dict(), original.state_dict())
    other = lr_factor("none" if lr_scaling == "horovod" else "horovod", "async", SELF_WORKERS)
    refusing = fresh_server("sgd-momentum-wd", comp, untrained_state={"count": torch.zeros(3)}, lr_factor=other)
    with pytest.raises(HvdDcasgdValueError, match="lr_factor"):
        refusing.load_state_dict(state)


@pytest.fixture
def halved():
    """A toy compensation, defined and registered in one place: half the gradient,
    plus a per-worker count of the gradients seen (its state)."""

    @register_compensation
    class Halved(CompensationRule):
        name = "halved"

        def state(self, settings):
            return {"seen": GLOBAL}

        def compensate_(self, grads, weights, backups, state, settings, *, impl):
            for g, seen in zip(grads, state["seen"]):
                g.mul_(0.5)
                seen.add_(1)

    yield Halved
    del COMPENSATIONS["halved"]


def test_a_registered_compensation_runs_on_the_server(halved):
    comp = Compensation("halved")
    server = fresh_server("sgd", comp)
    reference = fresh_server("sgd", Compensation("none"))
    assert server.update.path != FUSED_SGD, "the kernel does not know it: compensate, then torch steps"
    for worker in (0, 1, 0):
        g = push_gradient(server, worker, seed=worker, lrs=[0.1, 0.1])
        push_gradient(reference, worker, seed=worker, lrs=[0.05, 0.05])  # half the rate: the same step as half the gradient
        server.apply(worker)
        reference.apply(worker)
        assert torch.allclose(server.weights, reference.weights, atol=1e-7)
    assert torch.equal(server.update.state.tensors["seen"][0], torch.full_like(g, 3.0))
    assert server.state_dict()["compensation_state"]["seen"][0][0] == 3.0


def test_an_unknown_compensation_names_the_registered_ones(halved):
    with pytest.raises(ValueError, match="unknown compensation 'halfed'; choose one of none, constant, adaptive"):
        Compensation("halfed")


def test_a_restore_the_server_cannot_apply_changes_nothing():
    """What a worker's restore asks of the server (weights by index, buffers
    by name, the optimizer's state) is all or nothing."""
    server = fresh_server("sgd-momentum-wd", Compensation("adaptive"))
    apply_pushes(server, range(4))
    before = server.state_dict()
    bad_momentum = copy.deepcopy(before["optimizer"])
    bad_momentum["state"][0]["momentum_buffer"] = torch.zeros(7)
    for attempt, message in [
        (lambda: server.set_state({0: torch.zeros(5, 6), 9: torch.zeros(1)}, {}), "no such parameter"),
        (lambda: server.set_state({0: torch.zeros(5, 6), 1: torch.zeros(4)}, {}), "'fc1.bias' is \\[4\\]"),
        (lambda: server.load_optimizer_state(bad_momentum), "optimizer's state cannot be loaded"),
    ]:
        with pytest.raises(HvdDcasgdValueError, match=message):
            attempt()
        assert_same(server.state_dict(), before)
    apply_pushes(server, range(4, 6))  # and it goes on as before

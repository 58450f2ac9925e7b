"""hvd.elastic: Horovod's elastic API with the meaning it has for an
asynchronous job (hvd_dcasgd.api.elastic), in one process.  A real job runs
Horovod's elastic example with only its import changed (test_horovod.py)."""

import pytest
import torch

import hvd_dcasgd as hvd


def test_run_syncs_once_then_runs_the_function_once_and_returns_its_result():
    calls = []

    class Recorded(hvd.elastic.ObjectState):
        def sync(self):
            calls.append("sync")

    @hvd.elastic.run
    def train(state, scale):
        calls.append(("train", state.epoch, scale))
        return 42

    assert train(Recorded(epoch=1), 3) == 42
    assert calls == ["sync", ("train", 1, 3)], "synced first, then the function once: nothing starts it over"
    assert train.__name__ == "train"


def test_commit_saves_the_values_restore_puts_them_back_and_no_change_interrupts():
    resets = []
    state = hvd.elastic.ObjectState(epoch=1, batch=0, seen=[1])
    state.register_reset_callbacks([lambda: resets.append(1)])
    state.epoch, state.batch = 2, 5
    state.seen.append(2)
    state.commit()
    state.epoch, state.batch = 3, 7
    state.seen.append(3)
    state.restore()
    assert (state.epoch, state.batch, state.seen) == (2, 5, [1, 2])
    state.seen.append(9)  # a restored value is a copy: changing it leaves the commit's alone
    state.restore()
    assert state.seen == [1, 2]
    state.sync()  # each asynchronous worker keeps its own values
    assert (state.epoch, state.batch) == (2, 5)
    assert state.check_host_updates() is None and resets == [], "no host update, no reset"
    state.on_reset()  # Horovod's own hook still runs them when called
    assert resets == [1]


def test_a_torch_state_holds_the_model_and_optimizer_and_never_rolls_the_weights_back():
    hvd.init()  # one process: the optimizer trains locally
    model = torch.nn.Linear(3, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, epoch=1)
    assert state.model is model and state.optimizer is optimizer and state.epoch == 1
    state.commit()
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state.epoch = 2
    state.restore()
    assert state.epoch == 1
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters())), \
        "the weights are the server's (here, the model's): a restore does not undo the steps since"


def test_what_an_asynchronous_job_cannot_mean_says_why():
    with pytest.raises(hvd.HvdDcasgdError, match="ElasticSampler is not offered: .* skip optimizer.pushes"):
        hvd.elastic.ElasticSampler
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        hvd.elastic.no_such_name

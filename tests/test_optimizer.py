"""The wrapper's Horovod shape, in one process (local training)."""

import pytest
import torch

import hvd_dcasgd as hvd


@pytest.fixture(scope="module", autouse=True)
def local_runtime():
    hvd.init()
    assert hvd.size() == 1 and hvd.rank() == 0 and not hvd.is_server()


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def test_keeps_the_users_optimizer_class_and_hyperparameters():
    model = _model()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), compensation="constant")
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    assert opt.param_groups[0]["momentum"] == 0.9 and opt.param_groups[0]["nesterov"]
    assert opt.compensation.mode == "constant" and opt.compensation.lambda_0 == 0.04
    assert hasattr(opt, "synchronize") and hasattr(opt, "skip_synchronize")


def test_local_step_is_the_plain_optimizer_step():
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01))
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    x = torch.randn(8, 4)
    for _ in range(3):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    assert torch.allclose(model.weight, reference.weight)


def test_backward_passes_per_step_is_enforced():
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=2)
    x = torch.randn(8, 4)
    model(x).sum().backward()
    model(x).sum().backward()  # two passes accumulate: allowed
    opt.step()
    model(x).sum().backward()
    model(x).sum().backward()
    with pytest.raises(hvd.HvdDcasgdError, match="more than backward_passes_per_step=2"):
        model(x).sum().backward()


def test_environment_overrides_the_script(monkeypatch):
    monkeypatch.setenv("HVD_DCASGD_COMPENSATION", "constant")
    monkeypatch.setenv("HVD_DCASGD_LAMBDA", "0.5")
    monkeypatch.setenv("HVD_DCASGD_BOUND", "inf")
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compensation="adaptive",
                                   lambda_0=2.0, bound=0.5)
    assert opt.compensation.mode == "constant" and opt.compensation.constants() == {"lambda_0": 0.5,
                                                                                     "bound": float("inf")}
    monkeypatch.setenv("HVD_DCASGD_COMPENSATION", "none")  # a constant the method ignores is said, not dropped
    with pytest.raises(ValueError, match="the 'none' compensation does not use lambda_0 .*uses no constant"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    monkeypatch.delenv("HVD_DCASGD_LAMBDA")
    monkeypatch.delenv("HVD_DCASGD_BOUND")
    monkeypatch.setenv("HVD_DCASGD_COMPENSATION", "gap_aware")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), gamma=0.9999, gap_eps=1e-6)
    assert opt.compensation.constants() == {"gamma": 0.9999, "gap_eps": 1e-6}
    monkeypatch.setenv("HVD_DCASGD_COMPENSATION", "fast")
    with pytest.raises(ValueError, match="unknown compensation 'fast'"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))


def test_named_parameters_must_name_every_trained_parameter():
    model, other = _model(), _model()
    with pytest.raises(hvd.HvdDcasgdError, match="named_parameters does not name 2"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=other.named_parameters())


def test_metric_helpers_work_locally():
    assert hvd.allreduce(torch.tensor([3.0, 4.0])).tolist() == [3.0, 4.0]
    assert hvd.allreduce(torch.tensor(5), op=hvd.Sum).item() == 5
    assert hvd.broadcast_object({"x": 1}) == {"x": 1}


def test_empty_param_group_is_accepted():
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD([{"params": list(model.parameters())}, {"params": []}], lr=0.1))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()


def test_horovod_arguments_are_accepted_and_adasum_refused():
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                   hvd.Compression.fp16, 1, op=hvd.Average, gradient_predivide_factor=1.0)
    assert isinstance(opt, torch.optim.SGD)
    with pytest.raises(hvd.HvdDcasgdError, match="op='adasum' is not supported"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)
    assert torch.equal(hvd.allgather(torch.ones(2, 3)), torch.ones(2, 3))
    assert torch.equal(hvd.broadcast(torch.arange(3), root_rank=0), torch.arange(3))


def test_schedule_and_backend_are_their_own_settings(monkeypatch):
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compensation="none", schedule="sync")
    assert opt.compensation.schedule == "sync" and opt.method == "sync"
    shorthand = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compensation="sync")
    assert shorthand.compensation == opt.compensation and shorthand.method == "sync"
    monkeypatch.setenv("HVD_DCASGD_SCHEDULE", "async")
    overridden = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compensation="sync")
    assert overridden.compensation.schedule == "async" and overridden.method == "none"
    monkeypatch.setenv("HVD_DCASGD_SCHEDULE", "later")
    with pytest.raises(ValueError, match="HVD_DCASGD_SCHEDULE='later' is not valid: use async, sync"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    monkeypatch.delenv("HVD_DCASGD_SCHEDULE")
    with pytest.raises(ValueError, match="unknown backend 'gloo'; choose one of server, horovod"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backend="gloo")

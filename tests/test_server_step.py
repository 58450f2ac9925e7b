"""The server's update, on real (single-rank) MPI windows, against a naive
reference: the paper's formula written out, then a fresh copy of the same
torch optimizer stepping with it."""

import copy

import pytest
import torch

from hvd_dcasgd.algorithm.compensation import Compensation
from hvd_dcasgd.algorithm.endpoints import open_server
from hvd_dcasgd.protocol.layout import ModelLayout
from hvd_dcasgd.runtime.mpi import load_mpi
from hvd_dcasgd.algorithm.update import FOREACH, FUSED, FUSED_SGD, REFERENCE, is_sgd, lr_factor

from helpers import OPTIMIZERS, SELF_WORKERS, Net, paper_compensation, param_groups, push_gradient, reference_step, server_and_reference

@pytest.mark.parametrize("path", [None, REFERENCE, FOREACH], ids=["default-path", "reference-path", "foreach-path"])
@pytest.mark.parametrize("staged", [False, True], ids=["window-backups", "staged-device-path"])
@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["none", "constant", "adaptive"])
def test_async_updates_match_naive_reference(optimizer_name, mode, staged, path):
    """``staged`` runs the GPU server's code path (model and backups on the
    device, messages through bounce buffers) with the CPU as the device;
    ``path`` forces one of the update's implementations."""
    server, model, reference, reference_optimizer, comp = server_and_reference(optimizer_name, mode, staged=staged, path=path)
    assert (server.staging is not None) == staged
    # on window memory the C kernel takes every SGD step; elsewhere the compensation is one pass, then torch steps
    if path is None:
        expected = FUSED_SGD if optimizer_name.startswith("sgd") and not staged else FUSED
        assert server.update.path == expected, server.update.why
    params = [p for group in reference_optimizer.param_groups for p in group["params"]]  # the wire's order
    flat = lambda: torch.cat([p.detach().reshape(-1) for p in params])  # noqa: E731
    backups = [flat() for _ in range(SELF_WORKERS)]
    mean_square = torch.zeros_like(backups[0])
    order = [0, 1, 2, 1, 0, 0, 2, 1]
    for i, worker in enumerate(order):
        lrs = [0.1 / (1 + i), 0.05 / (1 + i)]
        g = push_gradient(server, worker, seed=i, lrs=lrs)
        server.apply(worker)
        # the reference: the paper's formula, then the user's optimizer
        w = flat()
        g = paper_compensation(mode, g, w, backups[worker], {"constant": 0.04, "adaptive": 8.0}.get(mode),
                               mean_square)
        reference_step(reference_optimizer, params, g, lrs)
        backups[worker] = flat()
        assert torch.allclose(server.weights, backups[worker], atol=1e-6), f"update {i}"
        assert torch.equal(server.outboxes[worker], server.weights), "outbox holds w_bak(m) = w"
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), "the user's model holds the server's weights"
    assert server.updates == len(order)
    assert server.telemetry.pushes == [3, 3, 2]


def test_per_worker_mean_square_keeps_one_per_worker():
    server, *_ = server_and_reference("sgd", "adaptive", per_worker=True)
    mean_squares = server.update.state.tensors["mean_square"]
    assert len(mean_squares) == SELF_WORKERS
    pushed = {}
    for i, worker in enumerate([0, 1, 0]):
        pushed.setdefault(worker, []).append(push_gradient(server, worker, seed=i, lrs=[0.1, 0.05]))
        server.apply(worker)
    g0, g0_again = pushed[0]
    g1 = pushed[1][0]
    assert torch.allclose(mean_squares[0], 0.95 * 0.05 * g0 * g0 + 0.05 * g0_again * g0_again, atol=1e-6)
    assert torch.allclose(mean_squares[1], 0.05 * g1 * g1, atol=1e-6)
    assert torch.equal(mean_squares[2], torch.zeros_like(g1))


@pytest.mark.parametrize("staged", [False, True], ids=["window-backups", "staged-device-path"])
def test_fp16_wire_gradient_is_applied_in_float32(staged):
    server, _, reference, reference_optimizer, _ = server_and_reference("sgd", "none", wire=torch.float16, staged=staged)
    g = push_gradient(server, 1, seed=5, lrs=[0.1, 0.05])
    before = server.weights.clone()
    server.apply(1)
    n1 = sum(p.numel() for p in reference.fc1.parameters())
    expected = before.clone()
    expected[:n1] -= 0.1 * g[:n1]
    expected[n1:] -= 0.05 * g[n1:]
    assert torch.allclose(server.weights, expected, atol=1e-6)


@pytest.mark.parametrize("staged", [False, True], ids=["window-backups", "staged-device-path"])
def test_sync_round_averages_and_steps_once(staged):
    server, _, reference, reference_optimizer, _ = server_and_reference("sgd-momentum-wd", "sync", staged=staged)
    gradients = [push_gradient(server, m, seed=m, lrs=[0.1, 0.05]) for m in range(SELF_WORKERS)]
    server.apply_round(list(range(SELF_WORKERS)))
    mean = torch.stack(gradients).mean(0)
    offset = 0
    for p in reference.parameters():
        p.grad = mean[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    reference_optimizer.step()
    expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    assert server.updates == 1
    assert torch.allclose(server.weights, expected, atol=1e-6)
    for m in range(SELF_WORKERS):
        assert torch.equal(server.outboxes[m], server.weights)


def test_sgd_detection():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert is_sgd(torch.optim.SGD(params, lr=0.1))
    assert is_sgd(torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True))
    assert not is_sgd(torch.optim.SGD(params, lr=0.1, maximize=True))
    assert not is_sgd(torch.optim.Adam(params))


def test_momentum_state_of_the_fused_path_is_the_optimizers_state():
    """The C kernel's momentum buffers are what state_dict() shows, and a
    loaded state (a restore) is what the kernel continues from."""
    server, _, reference, reference_optimizer, _ = server_and_reference("sgd-momentum-wd", "none")
    assert server.update.path == FUSED_SGD
    for i in range(3):
        g = push_gradient(server, i % SELF_WORKERS, seed=i, lrs=[0.1, 0.05])
        server.apply(i % SELF_WORKERS)
        offset = 0
        for p in reference.parameters():
            p.grad = g[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        reference_optimizer.step()
    ours = server.optimizer.state_dict()["state"]
    theirs = reference_optimizer.state_dict()["state"]
    assert sorted(ours) == sorted(theirs) == [0, 1, 2, 3]
    for k in theirs:
        assert torch.allclose(ours[k]["momentum_buffer"], theirs[k]["momentum_buffer"], atol=1e-6)
    restored = copy.deepcopy(reference_optimizer.state_dict())
    for k in restored["state"]:
        restored["state"][k]["momentum_buffer"].fill_(0.5)
    server.load_optimizer_state(restored)
    assert server.update.path == FUSED_SGD and all(server.update.momentum.started)
    momentum = server.update.momentum.buffer
    assert torch.equal(momentum, torch.full_like(momentum, 0.5))
    before = server.weights.clone()
    server.messages[0].gradient.zero_()
    server.apply(0)  # zero gradient: w <- w - lr * (momentum * 0.5 + wd * w)
    n1 = sum(p.numel() for p in reference.fc1.parameters())
    expected = torch.cat([before[:n1] - 0.1 * (0.9 * 0.5 + 1e-2 * before[:n1]),
                          before[n1:] - 0.05 * (0.9 * 0.5 + 1e-2 * before[n1:])])
    assert torch.allclose(server.weights, expected, atol=1e-6)


def test_frozen_parameters_in_the_optimizer_do_not_move():
    """torch skips parameters without a gradient, even under weight decay and
    momentum; so does the server for parameters with requires_grad=False."""
    model = Net()
    model.fc2.bias.requires_grad_(False)
    frozen = model.fc2.bias.detach().clone()
    optimizer = OPTIMIZERS["sgd-momentum-wd"](model)
    layout = ModelLayout.of(optimizer, model.named_parameters(), model)
    server = open_server(load_mpi().COMM_SELF, optimizer, layout, Compensation("constant"), num_workers=1)
    assert server.update.path == FUSED, server.update.why
    for i in range(3):
        push_gradient(server, 0, seed=i, lrs=[0.1, 0.05])
        server.messages[0].gradient[-2:].zero_()  # the worker sends zeros for a parameter without a gradient
        server.apply(0)
    assert torch.equal(model.fc2.bias.detach(), frozen)
    assert not torch.equal(model.fc2.weight.detach(), Net().fc2.weight.detach())


class Flat(torch.nn.Module):
    """One flat parameter, longer than the C kernel's threading threshold
    (65536 elements), so its OpenMP-parallel variants run."""

    def __init__(self, numel=200_003):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(numel))


@pytest.fixture
def two_threads():
    """The kernel runs torch's thread count, which another test (the
    simulator's) may have set to 1: two threads here, restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("sgd", [dict(), dict(momentum=0.9), dict(momentum=0.9, dampening=0.5, weight_decay=1e-2),
                                 dict(momentum=0.9, nesterov=True, weight_decay=1e-2)],
                         ids=["plain", "momentum", "momentum-dampening-wd", "nesterov-wd"])
@pytest.mark.parametrize("mode", ["none", "constant", "adaptive"])  # none: the kernel's plain step, w_bak never read
def test_threaded_kernel_matches_torch(sgd, mode, two_threads):
    model, reference = Flat(), Flat()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **sgd)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, **sgd)
    layout = ModelLayout.of(optimizer, model.named_parameters(), model)
    server = open_server(load_mpi().COMM_SELF, optimizer, layout, Compensation(mode), num_workers=2)
    assert server.update.path == FUSED_SGD
    backups = [reference.w.detach().clone() for _ in range(2)]
    mean_square = torch.zeros_like(backups[0])
    for i, worker in enumerate([0, 1, 1, 0, 1]):
        g = push_gradient(server, worker, seed=i, lrs=[0.1])
        server.apply(worker)
        w = reference.w.detach()
        g = paper_compensation(mode, g, w, backups[worker], {"constant": 0.04, "adaptive": 8.0}.get(mode),
                               mean_square)
        reference.w.grad = g
        reference_optimizer.step()
        backups[worker] = reference.w.detach().clone()
        # the kernel rounds in another order than torch: float32 rounding, grown by the correction (lambda_0 8)
        # and Nesterov with weight decay over five updates, stays far below 1e-4 of the weights; a wrong term
        # moves them by percents
        diff = (server.weights - reference.w.detach()).abs().max().item()
        assert torch.allclose(server.weights, reference.w.detach(), rtol=1e-4, atol=1e-6), f"update {i}: {diff}"
        assert torch.equal(server.backups[worker], server.weights), "w_bak(m) = w after m's push"


@pytest.mark.parametrize("wire", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["none", "constant", "adaptive"])
def test_compressed_gradients_stay_within_rounding_of_the_float32_run(wire, mode):
    """The stated bound: rounding each gradient to the wire dtype moves it by
    at most eps/2 of itself, and momentum mu adds such errors up with gain at
    most 1/(1 - mu), so the weights differ from the float32 run's by at most
    eps/2 * sum_t lr_t * max|g_t| / (1 - mu)."""
    runs = {}
    for dtype in (torch.float32, wire):
        server, *_ = server_and_reference("sgd-momentum-wd", mode, wire=dtype)
        budget = 0.0
        for i in range(60):
            g = push_gradient(server, i % SELF_WORKERS, seed=i, lrs=[0.1, 0.05])
            budget += 0.1 * g.abs().max().item()
            server.apply(i % SELF_WORKERS)
        runs[dtype] = server.weights.clone()
    bound = torch.finfo(wire).eps / 2 * budget / (1 - 0.9)
    difference = (runs[wire] - runs[torch.float32]).abs().max().item()
    assert 0 < difference <= bound, (difference, bound)


@pytest.mark.parametrize("schedule", ["async", "sync"])
def test_horovod_lr_scaling_applies_each_asynchronous_gradient_at_lr_over_size(schedule):
    """Horovod's convention: the rate is for the average of size() gradients.
    Asynchronously each gradient alone moves the weights lr / size(); a sync
    round applies the average at lr; the optimizer keeps showing lr."""
    model = Net()
    optimizer = torch.optim.SGD(param_groups(model), lr=0.3)
    layout = ModelLayout.of(optimizer, model.named_parameters(), model)
    comp = Compensation("none", schedule=schedule)
    server = open_server(load_mpi().COMM_SELF, optimizer, layout, comp, num_workers=SELF_WORKERS,
                         lr_factor=lr_factor("horovod", schedule, SELF_WORKERS))
    before = server.weights.clone()
    gradients = [push_gradient(server, m, seed=m, lrs=[0.3, 0.6]) for m in range(SELF_WORKERS)]
    n1 = sum(p.numel() for p in model.fc1.parameters())
    if schedule == "async":
        server.apply(0)
        step = gradients[0]
        rates = [0.3 / SELF_WORKERS, 0.6 / SELF_WORKERS]
    else:
        server.apply_round(list(range(SELF_WORKERS)))
        step = torch.stack(gradients).mean(0)
        rates = [0.3, 0.6]
    expected = torch.cat([before[:n1] - rates[0] * step[:n1], before[n1:] - rates[1] * step[n1:]])
    assert torch.allclose(server.weights, expected, atol=1e-6)
    assert [g["lr"] for g in optimizer.param_groups] == [0.3, 0.6], "the state shows the rates the workers set"


def test_a_sync_round_without_a_refused_push_averages_the_others(monkeypatch):
    monkeypatch.setenv("HVD_DCASGD_SKIP_BAD_PUSHES", "1")
    server, _, reference, reference_optimizer, _ = server_and_reference("sgd", "sync")
    gradients = [push_gradient(server, m, seed=m, lrs=[0.1, 0.05]) for m in range(SELF_WORKERS)]
    server.messages[1].gradient[0] = float("inf")
    before = server.weights.clone()
    server.apply_round(list(range(SELF_WORKERS)))
    mean = (gradients[0] + gradients[2]) / 2
    n1 = sum(p.numel() for p in reference.fc1.parameters())
    expected = torch.cat([before[:n1] - 0.1 * mean[:n1], before[n1:] - 0.05 * mean[n1:]])
    assert torch.allclose(server.weights, expected, atol=1e-6)
    assert server.telemetry.refused == [0, 1, 0] and server.updates == 1
    assert torch.equal(server.outboxes[1], before), "the refused worker gets the weights as they were"

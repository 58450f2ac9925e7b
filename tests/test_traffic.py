"""The bytes an update moves, counted from its transfers (benchmarks/traffic.py):
each path's count against the passes its code makes, written out here."""

import sys

import pytest
import torch

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import traffic  # noqa: E402
from common import flat_model, single_rank_server  # noqa: E402
from hvd_dcasgd.common import native  # noqa: E402

N = 4096
MODEL = N * 4  # bytes of one model-sized float32 array


def test_torch_operations_count_what_they_read_and_write():
    a, b = torch.randn(N), torch.randn(N)
    assert traffic.count(lambda: a.add_(b)) == traffic.Traffic(2 * MODEL, MODEL)  # reads a and b, writes a
    assert traffic.count(lambda: a.copy_(b)) == traffic.Traffic(MODEL, MODEL)  # overwrites a unread
    assert traffic.count(lambda: a * b) == traffic.Traffic(2 * MODEL, MODEL)  # a new tensor
    assert traffic.count(lambda: torch._foreach_mul_([a, b], 2.0)) == traffic.Traffic(2 * MODEL, 2 * MODEL)
    assert traffic.count(lambda: a[: N // 4].view(-1, 4).t()) == traffic.Traffic(0, 0)  # views move nothing
    assert traffic.count(lambda: a[: N // 4].zero_()) == traffic.Traffic(0, MODEL // 4)


@pytest.mark.parametrize("mode,momentum,arrays", [
    # (read, written) model-sized arrays of the fused_sgd pass: g and w read, w and w_bak written;
    # the compensation reads w_bak, DC-ASGD-a reads and writes MeanSquare, momentum its buffer
    ("none", 0.0, (2, 2)),
    ("constant", 0.0, (3, 2)),
    ("adaptive", 0.0, (4, 3)),
    ("none", 0.9, (3, 3)),
    ("adaptive", 0.9, (5, 4)),
    # sync: the average (copy the one push into grad, divide) then ASGD's pass
    ("sync", 0.0, (1 + 1 + 2, 1 + 1 + 2)),
])
def test_a_servers_update_counts_its_kernel_pass(mode, momentum, arrays):
    if native.library() is None:
        pytest.skip("the C kernel could not be built here (no C compiler)")
    model = flat_model(N)
    server = single_rank_server(model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=momentum), mode,
                                workers=2, device=torch.device("cpu"))
    assert server.update.path == "fused_sgd"
    step = (lambda: server.apply_round([0])) if mode == "sync" else (lambda: server.apply(0))
    step()  # the momentum buffer exists from the first step on
    before = server.weights.clone()
    counted = traffic.count(step)
    assert not torch.equal(before, server.weights), "the counted call ran the update"
    assert counted == traffic.Traffic(arrays[0] * MODEL, arrays[1] * MODEL)


def test_an_update_of_torch_operations_is_counted_operation_by_operation():
    model = flat_model(N)
    server = single_rank_server(model, torch.optim.SGD(model.parameters(), lr=1e-3), "constant", workers=2,
                                device=torch.device("cpu"))
    server.update.requested_path = "reference"
    server.update.choose_path()
    counted = traffic.count(lambda: server.apply(0))
    # at the least: the compensation reads g, w, w_bak; the step reads g and w and writes w; w_bak = w
    assert counted.read >= 6 * MODEL and counted.written >= 3 * MODEL
    other = flat_model(N)
    fused = single_rank_server(other, torch.optim.SGD(other.parameters(), lr=1e-3), "constant", workers=2,
                               device=torch.device("cpu"))
    if native.library() is not None:
        assert traffic.count(lambda: fused.apply(0)).total < counted.total

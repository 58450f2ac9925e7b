"""The worker's pack: the gradient copied into the push message and checked
for NaN and Inf in one pass (the C kernel), or a copy then a check (torch)."""

from __future__ import annotations

import sys

import pytest
import torch

from helpers import run
from hvd_dcasgd.common import native
from hvd_dcasgd.common.tensors import copy_checked_

SPECIAL = [0.0, -0.0, 1e-45, -1e-45, 1e-38, torch.finfo(torch.float32).max, -torch.finfo(torch.float32).max]


@pytest.mark.parametrize("numel", [1, 7, 65536, 65537, 300_001])  # both sides of the kernel's threading threshold
def test_kernel_copies_bit_for_bit_and_finds_every_nan_and_inf(numel):
    assert native.library() is not None, "the C kernel must build here (cc is part of the set-up)"
    source = torch.randn(numel) * 1e3
    source[: min(numel, len(SPECIAL))] = torch.tensor(SPECIAL[:numel])
    target = torch.full((numel,), 7.0)
    assert native.pack_f32(source, target) is True
    assert torch.equal(target.view(torch.int32), source.view(torch.int32)), "a copy, bit for bit (-0.0 included)"
    for bad in (float("nan"), float("inf"), float("-inf")):
        for where in {0, numel // 2, numel - 1}:
            broken = source.clone()
            broken[where] = bad
            assert native.pack_f32(broken, target) is False, (bad, where)
            assert torch.equal(target.view(torch.int32), broken.view(torch.int32))
            assert native.pack_f32(broken, target, check=False) is True, "without the check, only a copy"


def test_kernel_declines_what_it_cannot_copy_and_the_fallback_checks_in_the_target_dtype():
    source = torch.randn(64)
    assert native.pack_f32(source, torch.empty(64, dtype=torch.float16)) is None
    assert native.pack_f32(source, torch.empty(65)) is None
    assert native.pack_f32(torch.randn(64, 2)[:, 0], torch.empty(64)) is None  # not contiguous
    half = torch.empty(64, dtype=torch.float16)
    source[3] = 1e6  # finite in float32, beyond float16's range
    assert copy_checked_(half, source) is False
    strided = torch.randn(64, 2)[:, 0]
    target = torch.empty(64)
    assert copy_checked_(target, strided) is True and torch.equal(target, strided)
    strided[5] = float("nan")
    assert copy_checked_(target, strided) is False


def test_without_the_kernel_the_pack_is_a_copy_and_a_check():
    probe = ("import torch\nfrom hvd_dcasgd.common import native\nfrom hvd_dcasgd.common.tensors import copy_checked_\n"
             "s, t = torch.randn(100000), torch.empty(100000)\n"
             "assert native.library() is None and native.pack_f32(s, t) is None\n"
             "assert copy_checked_(t, s) and torch.equal(t, s)\n"
             "s[99999] = float('inf')\nassert not copy_checked_(t, s)\nprint('checked')\n")
    result = run([sys.executable, "-c", probe], env={"HVD_DCASGD_NATIVE": "0"}, timeout=120)
    assert result.returncode == 0 and "checked" in result.stdout, result.stdout


class _Channel:
    """What ``Worker.pack`` reads of its channel: the worker index and push count."""

    worker, pushes = 0, 0


def _worker(model, wire=torch.float32, slices=None):
    from hvd_dcasgd.protocol.layout import ModelLayout
    from hvd_dcasgd.protocol.worker import Worker

    optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    channels = [_Channel() for _ in (slices or [None])]
    return Worker(optimizer, ModelLayout.of(optimizer, model.named_parameters()), channels, wire, slices=slices)


def _assemble(pieces, nbytes):
    """The inbox the pieces write, and the check that they cover it once."""
    inbox, covered = torch.zeros(nbytes, dtype=torch.uint8), 0
    for offset, data in sorted(pieces, key=lambda piece: piece[0]):
        assert offset == covered, "pieces in order, no gap, no overlap"
        inbox[offset:offset + data.nbytes] = torch.from_numpy(data.copy())
        covered += data.nbytes
    assert covered == nbytes
    return inbox


def test_large_gradients_go_as_they_lie_small_ones_packed_and_the_inbox_is_the_packed_message():
    from hvd_dcasgd.protocol.layout import flatten_into
    from hvd_dcasgd.protocol.worker import DIRECT_PUT_BYTES

    model = torch.nn.Sequential(torch.nn.Linear(200, 100), torch.nn.Linear(100, 10), torch.nn.Linear(10, 300))
    model(torch.randn(4, 200)).square().sum().backward()
    model[1].bias.grad = None  # a parameter without a gradient travels as zeros
    worker = _worker(model)
    pieces = worker.pack()
    grads = [p.grad for p in worker.params]
    direct = [g for g in grads if g is not None and g.nbytes >= DIRECT_PUT_BYTES]
    assert len(direct) == 1 and any(data.ctypes.data == direct[0].data_ptr() for _, data in pieces), "no copy"
    assert len(pieces) == 3  # header and the small gradients before it; the large one; the rest
    expected = torch.zeros_like(worker.message.bytes)
    expected[: worker.message.header_bytes] = worker.message.bytes[: worker.message.header_bytes]
    flatten_into(expected[worker.message.header_bytes:].view(torch.float32),
                 worker.layout.views(expected[worker.message.header_bytes:].view(torch.float32)), grads)
    assert torch.equal(_assemble(pieces, worker.message.nbytes), expected)
    assert worker.message.lrs.tolist() == [0.25]


def test_a_nan_in_a_gradient_sent_as_it_lies_is_refused_by_name_before_anything_goes():
    from hvd_dcasgd.common.errors import HvdDcasgdError

    model = torch.nn.Sequential(torch.nn.Linear(200, 100), torch.nn.Linear(100, 10))
    model(torch.randn(4, 200)).sum().backward()
    model[0].weight.grad[3, 7] = float("inf")
    with pytest.raises(HvdDcasgdError, match="the gradient of '0.weight' holds NaN or Inf at push 0; nothing was"):
        _worker(model).pack()
    half = _worker(model, torch.float16)  # another wire dtype: packed, cast and checked
    model[0].weight.grad[3, 7] = 1e6
    with pytest.raises(HvdDcasgdError, match="'0.weight' holds finite values beyond float16's range"):
        half.pack()


def test_the_worker_sends_each_server_the_rates_and_its_slice_of_the_gradient():
    """Worker.per_server: server s's inbox is the learning-rate header, then
    the gradient's elements of s's slice, whatever pieces the pack made
    (large gradients Put from their own memory, small ones packed)."""
    from hvd_dcasgd.protocol.worker import DIRECT_PUT_BYTES

    big = DIRECT_PUT_BYTES // 4 + 8  # a gradient Put from its own memory
    model = torch.nn.Sequential(torch.nn.Linear(big, 1), torch.nn.Linear(1, 3))
    numel = sum(p.numel() for p in model.parameters())
    slices = [(0, 1000), (1000, big + 2), (big + 2, numel)]
    worker = _worker(model, slices=slices)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    gradient = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    header = worker.message.header_bytes
    for (start, end), pieces in zip(slices, worker.per_server(worker.pack())):
        inbox = _assemble(pieces, header + 4 * (end - start))
        assert torch.equal(inbox[:header], worker.message.bytes[:header])
        assert torch.equal(inbox[header:].view(torch.float32), gradient[start:end])

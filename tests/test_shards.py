"""How S servers split the flat parameter vector (hvd_dcasgd/shards.py)."""

from __future__ import annotations

import random

import pytest
import torch

from hvd_dcasgd.errors import HvdDcasgdValueError
from hvd_dcasgd.layout import ModelLayout
from hvd_dcasgd.shards import ALIGN_ELEMENTS, TOLERANCE, check_shardable, is_elementwise, partition


def offsets_of(sizes):
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    return offsets


def test_one_server_holds_everything():
    assert partition([0, 3, 10], 1) == [(0, 10)]
    assert partition([0, 3, 10], 1, whole_tensors=True) == [(0, 10)]


def test_cuts_stay_on_parameter_boundaries_when_that_keeps_the_balance():
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(12)])  # 24 parameters, 49,920 elements
    layout = ModelLayout.of(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    slices = partition(layout.offsets, 3)
    assert all(start in layout.offsets for start, _ in slices), slices
    share = layout.numel / 3
    assert all(abs((end - start) - share) <= TOLERANCE * share for start, end in slices), slices


def test_one_large_parameter_is_cut_inside_at_an_even_aligned_share():
    assert partition([0, 1_000_000], 2) == [(0, 500_000), (500_000, 1_000_000)]
    slices = partition([0, 10, 1_000_000], 3)  # the boundary at 10 is far from every even share
    assert [start % ALIGN_ELEMENTS for start, _ in slices] == [0, 0, 0]
    assert all(abs((end - start) - 1_000_000 / 3) <= ALIGN_ELEMENTS for start, end in slices), slices


def test_whole_tensors_cut_only_between_parameters_even_unbalanced():
    assert partition([0, 10, 1_000_000], 2, whole_tensors=True) == [(0, 10), (10, 1_000_000)]
    assert partition([0, 100, 101, 102], 3, whole_tensors=True) == [(0, 100), (100, 101), (101, 102)]
    with pytest.raises(HvdDcasgdValueError, match="2 parameters cannot be split whole into 3 non-empty slices; use fewer servers"):
        partition([0, 5, 10], 3, whole_tensors=True)


def test_too_many_servers_for_the_model_is_a_sentence():
    with pytest.raises(HvdDcasgdValueError, match="20 elements cannot be split into 3 slices of at least 16; use fewer servers"):
        partition([0, 20], 3)
    with pytest.raises(HvdDcasgdValueError, match="at least 1"):
        partition([0, 20], 0)


@pytest.mark.parametrize("seed", range(40))
def test_every_partition_covers_the_vector_in_order_and_is_balanced(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([1, 7, 64, 1000, 4096, 65536, 250_000]) for _ in range(rng.randint(1, 30))]
    offsets, servers = offsets_of(sizes), rng.randint(1, 4)
    numel, share = offsets[-1], offsets[-1] / servers
    for whole in (False, True):
        try:
            slices = partition(offsets, servers, whole_tensors=whole)
        except HvdDcasgdValueError:
            assert whole and len(sizes) < servers or not whole and share < 2 * ALIGN_ELEMENTS, (sizes, servers)
            continue
        assert slices[0][0] == 0 and slices[-1][1] == numel and len(slices) == servers
        assert all(a < b for a, b in slices) and all(b == c for (_, b), (c, _) in zip(slices, slices[1:]))
        if whole:
            assert all(start in offsets for start, _ in slices)
        else:
            assert all(abs((b - a) - share) <= TOLERANCE * share + ALIGN_ELEMENTS for a, b in slices), slices


def test_which_optimizers_are_exact_under_any_cut():
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert is_elementwise(torch.optim.SGD(params, lr=0.1)) and is_elementwise(torch.optim.Adam(params))

    class TrustRatio(torch.optim.SGD):  # a subclass may look at whole tensors (LARS)
        pass

    assert not is_elementwise(TrustRatio(params, lr=0.1))
    check_shardable(torch.optim.LBFGS(params), 1)
    with pytest.raises(HvdDcasgdValueError, match="LBFGS needs every parameter at once, so it cannot run on 2"):
        check_shardable(torch.optim.LBFGS(params), 2)

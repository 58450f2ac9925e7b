"""How S servers split the flat parameter vector (hvd_dcasgd/algorithm/shards.py)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from hvd_dcasgd.common.errors import HvdDcasgdValueError
from hvd_dcasgd.protocol.layout import ModelLayout
from hvd_dcasgd.algorithm.shards import ALIGN_ELEMENTS, TOLERANCE, check_shardable, is_elementwise, partition


def offsets_of(sizes):
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    return offsets


def test_one_server_holds_everything():
    assert partition([0, 3, 10], 1) == [(0, 10)]
    assert partition([0, 3, 10], 1, whole_tensors=True) == [(0, 10)]


def test_bounds_stay_on_parameter_boundaries_when_that_keeps_the_balance():
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(12)])  # 24 parameters, 49,920 elements
    layout = ModelLayout.of(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    slices = partition(layout.offsets, 3)
    assert all(start in layout.offsets for start, _ in slices), slices
    share = layout.numel / 3
    assert all(abs((end - start) - share) <= TOLERANCE * share for start, end in slices), slices


def test_one_large_parameter_is_split_inside_at_an_even_aligned_share():
    assert partition([0, 1_000_000], 2) == [(0, 500_000), (500_000, 1_000_000)]
    slices = partition([0, 10, 1_000_000], 3)  # the boundary at 10 is far from every even share
    assert [start % ALIGN_ELEMENTS for start, _ in slices] == [0, 0, 0]
    assert all(abs((end - start) - 1_000_000 / 3) <= ALIGN_ELEMENTS for start, end in slices), slices


def test_whole_tensors_split_only_between_parameters_even_unbalanced():
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


def test_which_optimizers_are_exact_under_any_partition():
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert is_elementwise(torch.optim.SGD(params, lr=0.1)) and is_elementwise(torch.optim.Adam(params))

    class TrustRatio(torch.optim.SGD):  # a subclass may look at whole tensors (LARS)
        pass

    assert not is_elementwise(TrustRatio(params, lr=0.1))
    check_shardable(torch.optim.LBFGS(params), 1)
    with pytest.raises(HvdDcasgdValueError, match="LBFGS needs every parameter at once, so it cannot run on 2"):
        check_shardable(torch.optim.LBFGS(params), 2)


# --- one server's view of its slice ------------------------------------------------------------
def _model_and_optimizer(cls=torch.optim.SGD, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    groups = [{"params": [model[0].weight, model[0].bias]}, {"params": list(model[1].parameters()), "lr": 0.05}]
    optimizer = cls(groups, lr=0.1, **kwargs)
    return model, optimizer, ModelLayout.of(optimizer, model.named_parameters())


def test_a_slice_is_whole_parameters_and_flat_parts_with_every_group():
    from hvd_dcasgd.algorithm.shards import shard_layout

    _, _, layout = _model_and_optimizer()  # 30 + 5 | 15 + 3 elements
    served, pieces = shard_layout(layout, 32, 47)
    assert [p.name for p in served.params] == ["0.bias[2:5]", "1.weight[0:12]"]
    assert [p.shape for p in served.params] == [(3,), (12,)]
    assert served.group_sizes == [1, 1] and served.numel == 15
    served, pieces = shard_layout(layout, 0, 35)
    assert [p.name for p in served.params] == ["0.weight", "0.bias"] and served.group_sizes == [2, 0]
    assert all(p.whole for p in pieces)


@pytest.mark.parametrize("cls,kwargs", [(torch.optim.SGD, {"momentum": 0.9, "weight_decay": 0.01}),
                                        (torch.optim.Adam, {"weight_decay": 0.01}),
                                        (torch.optim.RMSprop, {"momentum": 0.5})])
def test_optimizers_over_the_slices_step_exactly_as_the_whole_one(cls, kwargs):
    """Element-wise optimizers: each slice's optimizer (its state split from
    the whole one's) steps its elements exactly as the whole optimizer does,
    and the slices' states put together are the whole one's."""
    from hvd_dcasgd.algorithm.shards import merge_states, shard_layout, shard_optimizer

    model, optimizer, layout = _model_and_optimizer(cls, **kwargs)
    params = list(model.parameters())
    for p in params:  # one step first, so there is state to split
        p.grad = torch.randn_like(p)
    optimizer.step()
    slices = [(0, 32), (32, 47), (47, layout.numel)]
    servers = []
    for start, end in slices:  # each server has a model of its own
        served, pieces = shard_layout(layout, start, end)
        servers.append((pieces, shard_optimizer(copy.deepcopy(optimizer), layout, pieces)))
    grads = [torch.randn_like(p) for p in params]
    flat_grad = torch.cat([g.reshape(-1) for g in grads])
    for (start, end), (pieces, sharded) in zip(slices, servers):
        offset = start
        for piece, tensor in zip(pieces, [p for group in sharded.param_groups for p in group["params"]]):
            tensor.grad = flat_grad[offset:offset + tensor.numel()].view_as(tensor).clone()
            offset += tensor.numel()
        sharded.step()
    for p, g in zip(params, grads):
        p.grad = g
    optimizer.step()
    whole = torch.cat([p.detach().reshape(-1) for p in params])
    split = torch.cat([torch.cat([t.detach().reshape(-1) for group in s.param_groups for t in group["params"]])
                       for _, s in servers])
    assert torch.equal(split, whole)
    merged = merge_states([s.state_dict() for _, s in servers], layout, [p for p, _ in servers])
    expected = optimizer.state_dict()
    assert merged["param_groups"] == expected["param_groups"]
    assert sorted(merged["state"]) == sorted(expected["state"])
    for i, entry in expected["state"].items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(merged["state"][i][key]), torch.as_tensor(value)), (i, key)

"""The simulator: deterministic, each delay model orders pushes as it says,
a trace replays in its order (changes of the number of workers included),
one worker is plain torch SGD."""

import json

import pytest
import torch
import torch.nn.functional as F

from helpers import BATCH, SAMPLES, digits_data, digits_model, lr_of_epoch
from hvd_dcasgd.common.errors import HvdDcasgdValueError
from hvd_dcasgd.algorithm.simulator import (
    EventDriven, RandomOrder, RoundRobin, TraceOrder, error_rate, simulate, steps_per_epoch, worker_batches,
)

torch.set_num_threads(1)
EPOCHS = 2


def _run(mode="adaptive", workers=4, delay=None, seed=0, trace=None, epochs=EPOCHS, membership=()):
    train, test = digits_data()
    return simulate(digits_model, train, test, compensation=mode, workers=workers, epochs=epochs, batch_size=BATCH,
                    lr=lr_of_epoch, delay=delay, seed=seed, trace=trace, membership=membership)


def _trace(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("delay", [RandomOrder, lambda: EventDriven.heavy_tailed(4)], ids=["random", "heavy-tailed"])
def test_same_seed_same_result_bit_for_bit(delay):
    first, second = _run(delay=delay()), _run(delay=delay())
    assert torch.equal(first.weights, second.weights)
    assert first.test_errors == second.test_errors and first.staleness == second.staleness
    other = _run(delay=delay(), seed=1)
    assert not torch.equal(first.weights, other.weights)


def test_round_robin_gradients_are_exactly_workers_minus_one_stale(tmp_path):
    workers = 4
    result = _run("none", workers, RoundRobin(), trace=tmp_path / "trace.jsonl")
    records = _trace(tmp_path / "trace.jsonl")
    assert [r["worker"] for r in records] == [u % workers for u in range(len(records))]
    assert [r["staleness"] for r in records[:workers]] == list(range(workers))  # the first round starts from w_0
    assert {r["staleness"] for r in records[workers:]} == {workers - 1}
    assert result.updates == len(records) == EPOCHS * SAMPLES // BATCH
    assert len(result.test_errors) == EPOCHS and result.test_errors[-1] == result.final_error


def test_trace_replay_follows_the_traces_order(tmp_path):
    recorded = _run(delay=RandomOrder(), seed=3, trace=tmp_path / "random.jsonl")
    replayed = _run(delay=TraceOrder(str(tmp_path / "random.jsonl")), seed=3, trace=tmp_path / "replay.jsonl")
    order = [(r["worker"], r["staleness"]) for r in _trace(tmp_path / "random.jsonl")]
    assert len(set(s for _, s in order)) > 2, "a random order mixes staleness values"
    assert [(r["worker"], r["staleness"]) for r in _trace(tmp_path / "replay.jsonl")] == order
    assert torch.equal(recorded.weights, replayed.weights)


def test_a_change_to_the_same_number_of_workers_loses_nothing():
    """The change's path -- the server's state taken on by a new server, every worker's data from its
    position -- ends where the run without it does, bit for bit."""
    plain = _run(delay=RandomOrder(), seed=2)
    changed = _run(delay=RandomOrder(), seed=2, membership=[(17, 4), (40, 4)])
    assert torch.equal(plain.weights, changed.weights) and plain.staleness == changed.staleness
    assert plain.updates == changed.updates and plain.samples == changed.samples


@pytest.mark.parametrize("changes", [[(20, 2)], [(10, 6), (30, 3)]], ids=["4-to-2", "4-to-6-to-3"])
def test_a_trace_with_changes_of_the_number_of_workers_replays_bit_for_bit(tmp_path, changes):
    recorded = _run(delay=RandomOrder(), seed=4, trace=tmp_path / "random.jsonl", membership=changes)
    order = TraceOrder(str(tmp_path / "random.jsonl"))
    assert order.membership == changes, "the trace holds each change"
    replayed = _run(delay=order, seed=4, trace=tmp_path / "replay.jsonl", membership=order.membership)
    assert torch.equal(recorded.weights, replayed.weights) and recorded.updates == replayed.updates
    records = _trace(tmp_path / "random.jsonl")
    events = [r for r in records if r.get("event") == "resized"]
    assert [(r["at"], r["workers"]) for r in events] == changes
    workers, last = 4, 0  # between two changes, only that many workers push
    for at, after in [*changes, (recorded.updates, None)]:
        pushed = {r["worker"] for r in records if "step" in r and last <= r["update"] < at}
        assert pushed <= set(range(workers)) and len(pushed) > 1, (last, at, pushed)
        workers, last = after, at
    assert sum(recorded.staleness.values()) == recorded.updates, "every applied gradient counted once"
    plain = _run(delay=RandomOrder(), seed=4)
    assert not torch.equal(plain.weights, recorded.weights), "the changes changed the run"


def test_an_event_driven_delay_takes_no_change_of_the_number_of_workers():
    with pytest.raises(HvdDcasgdValueError, match="one step time per worker"):
        _run(delay=EventDriven.homogeneous(4), membership=[(5, 2)])


def test_trace_order_skips_finished_workers_then_takes_turns(tmp_path):
    path = tmp_path / "short.jsonl"
    path.write_text("".join(json.dumps({"update": u, "worker": w}) + "\n" for u, w in enumerate([1, 1, 0, 1])))
    delay = TraceOrder(str(path))
    delay.reset(3, torch.Generator())
    picks = [delay.next_worker(active) for active in ([0, 1, 2], [0, 1, 2], [0, 2], [0, 2], [0, 2])]
    assert picks == [1, 1, 0, 0, 2]  # worker 1 done before the trace's last push; then round-robin


def test_random_order_draws_every_worker_and_finishes_every_step():
    result = _run("none", 4, RandomOrder(), seed=5)
    assert result.updates == EPOCHS * SAMPLES // BATCH
    assert max(result.staleness) > 4 > min(result.staleness)


def test_event_driven_slow_worker_pushes_less_and_staler(tmp_path):
    _run("none", 4, EventDriven([1.0, 1.0, 1.0, 3.0]), trace=tmp_path / "trace.jsonl")
    records = _trace(tmp_path / "trace.jsonl")
    # no jitter: fast workers push at t = 1, 2, 3, ..., the slow one at t = 3, 6, ...
    assert [r["worker"] for r in records[:10]] == [0, 1, 2, 0, 1, 2, 0, 1, 2, 3]
    slow = [r["staleness"] for r in records if r["worker"] == 3]
    assert slow[:3] == [9, 9, 9]  # three fast workers push three times in one slow step
    steps = EPOCHS * steps_per_epoch(SAMPLES, 3, 4, BATCH)
    assert len(slow) == steps and records[-1]["worker"] == 3  # it finishes last, alone


def test_heavy_tailed_makes_the_last_quarter_slow():
    delay = EventDriven.heavy_tailed(8, slowdown=3.0)
    assert delay.step_times == [1.0] * 6 + [3.0] * 2
    with pytest.raises(ValueError, match="8 step times for 4 workers"):
        delay.reset(4, torch.Generator())


def test_sync_rounds_average_every_worker_once():
    result = _run("sync", 4)
    assert result.updates == EPOCHS * steps_per_epoch(SAMPLES, 0, 4, BATCH)
    assert set(result.staleness) == {0}


@pytest.mark.parametrize("mode", ["none", "adaptive"])
def test_one_worker_is_plain_torch_sgd(mode):
    result = _run(mode, workers=1)
    train, test = digits_data()
    torch.manual_seed(0)
    model = digits_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr_of_epoch(0))
    for epoch, batch in worker_batches(SAMPLES, 0, 1, BATCH, EPOCHS, seed=0):
        optimizer.param_groups[0]["lr"] = lr_of_epoch(epoch)
        optimizer.zero_grad()
        F.cross_entropy(model(train[0][batch]), train[1][batch]).backward()
        optimizer.step()
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.allclose(result.weights, expected, rtol=1e-5, atol=1e-6)
    assert result.final_error == pytest.approx(error_rate(model, test), abs=1.5 / len(test[1]))
    assert set(result.staleness) == {0}


def test_worker_batches_cover_the_shard_once_per_epoch():
    seen = {}
    for epoch, batch in worker_batches(103, 2, 4, 8, 3, seed=7):
        seen.setdefault(epoch, []).extend(batch.tolist())
    for epoch in range(3):
        assert sorted(seen[epoch]) == list(range(2, 103, 4))
    assert seen[0] != seen[1]
    assert steps_per_epoch(103, 2, 4, 8) == 4


def test_a_synchronous_round_costs_the_slowest_workers_step():
    result = _run("sync", 4, EventDriven([1.0, 1.0, 1.0, 3.0]))
    rounds = EPOCHS * SAMPLES // BATCH // 4
    assert result.updates == rounds and result.seconds == pytest.approx(3.0 * rounds)
    assert result.times == pytest.approx([3.0 * rounds / EPOCHS * (e + 1) for e in range(EPOCHS)])


def test_a_time_budget_lets_fast_workers_draw_more_batches(tmp_path):
    until = 12.0  # virtual time: 12 steps of a fast worker, 4 of the slow one
    train, test = digits_data()
    budgeted = simulate(digits_model, train, test, compensation="none", workers=4, epochs=3, batch_size=BATCH, lr=lr_of_epoch,
                        delay=EventDriven([1.0, 1.0, 1.0, 3.0]), until=until, trace=tmp_path / "budget.jsonl")
    pushes = [sum(1 for r in _trace(tmp_path / "budget.jsonl") if r["worker"] == m) for m in range(4)]
    assert pushes == [12, 12, 12, 4], "arrivals at 1, 2, ..., 12 (fast) and 3, 6, 9, 12 (slow)"
    assert budgeted.samples == BATCH * sum(pushes) and budgeted.seconds == until
    assert budgeted.times == pytest.approx([4.0, 8.0, 12.0]) and len(budgeted.test_errors) == 3
    assert pushes[0] > steps_per_epoch(SAMPLES, 0, 4, BATCH), "a fast worker goes past its shard's epoch"


def test_the_bound_is_the_simulators_too_bit_for_bit(tmp_path):
    """A bounded DC-ASGD-a replays bit for bit from its own trace; the paper's rule (bound inf) and a tighter
    bound are other runs."""
    from hvd_dcasgd import Compensation

    bounded = Compensation("adaptive", lambda_0=8.0, bound=0.5)
    first = _run(bounded, delay=RandomOrder(), trace=tmp_path / "trace.jsonl")
    replay = _run(bounded, delay=TraceOrder(str(tmp_path / "trace.jsonl")))
    assert torch.equal(first.weights, replay.weights)
    paper = _run(Compensation("adaptive", lambda_0=8.0, bound=float("inf")), delay=RandomOrder())
    assert not torch.equal(first.weights, paper.weights)

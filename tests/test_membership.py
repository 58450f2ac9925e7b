"""Membership: a job resumed with another number of workers than the one
that wrote its checkpoint (hvd_dcasgd.algorithm.membership), and each change
of who is present as one event (hvd_dcasgd.serving.membership).  The
server's own state first, then real jobs under the real ``mpirun``, stopped
by SIGTERM and resumed with fewer and with more workers, whose final weights
must be the replay of their whole trace, bit for bit (a drop's events:
test_reliability.py's stall tests)."""

import signal
import time

import pytest
import torch

from hvd_dcasgd.algorithm.compensation import Compensation
from hvd_dcasgd.algorithm.update import lr_factor
from hvd_dcasgd.common.errors import HvdDcasgdValueError
from hvd_dcasgd.observability.telemetry import Telemetry
from hvd_dcasgd.serving.membership import Membership

from helpers import (TRAINING, Job, apply_pushes, assert_same, check_final_weights, fresh_server, push_gradient,
                     run_job, synthetic, trace)


def _saved(workers=3, per_worker=False, pushes=7, factor=1.0):
    comp = Compensation("adaptive", per_worker_mean_square=per_worker)
    server = fresh_server("sgd-momentum-wd", comp, num_workers=workers, lr_factor=factor)
    apply_pushes(server, range(pushes))  # workers 0, 1, 2, 1, 0, 0, 2
    return comp, server, server.state_dict()


def _push(server, worker, seed):
    push_gradient(server, worker, seed=seed, lrs=[0.05, 0.02])
    server.apply(worker)


@pytest.mark.parametrize("per_worker", [False, True])
def test_the_workers_of_both_jobs_go_on_exactly_with_fewer_workers(per_worker):
    comp, original, state = _saved(per_worker=per_worker)
    resumed = fresh_server("sgd-momentum-wd", comp, seed=7, num_workers=2)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.weights, original.weights)
    for m in (0, 1):  # each keeps the weights it was last sent, and the update that sent them
        assert torch.equal(resumed.backups[m], original.backups[m]) and resumed.staleness(m) == original.staleness(m)
    # worker 2 left: workers 0 and 1 push on, and their updates are the ones the 3-worker server makes
    for i, m in enumerate([1, 0, 0, 1]):
        _push(original, m, 300 + i)
        _push(resumed, m, 300 + i)
        assert torch.equal(resumed.weights, original.weights), i
    if per_worker:
        theirs, mine = original.update.state.tensors["mean_square"], resumed.update.state.tensors["mean_square"]
        assert len(mine) == 2 and all(torch.equal(a, b) for a, b in zip(mine, theirs[:2]))


def test_new_workers_start_from_the_current_weights_with_the_mean_square_of_the_others():
    comp, original, state = _saved(per_worker=True)
    grown = fresh_server("sgd-momentum-wd", comp, seed=7, num_workers=5)
    grown.load_state_dict(state)
    for m in (3, 4):
        assert torch.equal(grown.backups[m], original.weights) and grown.staleness(m) == 0
    saved = state["compensation_state"]["mean_square"]
    mean = torch.stack(saved).mean(dim=0)
    mine = grown.update.state.tensors["mean_square"]
    assert all(torch.equal(mine[m], saved[m]) for m in range(3)) and all(torch.equal(mine[m], mean) for m in (3, 4))
    assert float(mean.abs().sum()) > 0  # the saved workers had pushed: a mean of zeros would prove nothing


def test_every_push_is_counted_once_and_each_worker_resumes_at_the_even_share():
    comp, original, state = _saved(pushes=7)  # pushes per worker: 3, 2, 2
    resumed = fresh_server("sgd-momentum-wd", comp, seed=7, num_workers=2)
    resumed.load_state_dict(state)
    assert resumed.before == {"applied": 7, "refused": 0} and resumed.base == 3
    assert [resumed.position(m) for m in (0, 1)] == [3, 3]
    for i, m in enumerate([1, 1, 0]):
        _push(resumed, m, 400 + i)
    again = resumed.state_dict()
    assert again["pushes"] == [1, 2] and again["before"] == {"applied": 7, "refused": 0} and again["base"] == 3
    # saved and resumed by the same number of workers: the counts and positions go on as they were
    same = fresh_server("sgd-momentum-wd", comp, seed=9, num_workers=2)
    same.load_state_dict(again)
    assert_same(same.state_dict(), again)
    assert [same.position(m) for m in (0, 1)] == [4, 5]
    # a second change counts everything before it: 7 + 3 pushes over 4 workers
    grown = fresh_server("sgd-momentum-wd", comp, seed=9, num_workers=4)
    grown.load_state_dict(again)
    assert grown.before == {"applied": 10, "refused": 0} and [grown.position(m) for m in range(4)] == [2] * 4


def test_horovods_rate_scaling_follows_the_number_of_workers_and_other_settings_are_still_refused():
    comp, _, state = _saved(factor=lr_factor("horovod", "async", 3))
    resumed = fresh_server("sgd-momentum-wd", comp, seed=7, num_workers=2, lr_factor=lr_factor("horovod", "async", 2))
    resumed.load_state_dict(state)
    assert resumed.state_dict()["settings"]["lr_factor"] == 0.5
    unscaled = fresh_server("sgd-momentum-wd", comp, seed=7, num_workers=2)  # lr_scaling="none": another meaning
    before = unscaled.state_dict()
    with pytest.raises(HvdDcasgdValueError, match="lr_factor"):
        unscaled.load_state_dict(state)
    assert_same(unscaled.state_dict(), before)
    other = fresh_server("sgd-momentum-wd", Compensation("adaptive", lambda_0=0.5), seed=7, num_workers=2,
                         lr_factor=0.5)
    with pytest.raises(HvdDcasgdValueError, match="compensation"):
        other.load_state_dict(state)


def test_a_state_lacking_a_part_is_refused_with_a_sentence_and_changes_nothing():
    comp, _, state = _saved()
    del state["sent_at"]
    resumed = fresh_server("sgd-momentum-wd", comp, seed=7, num_workers=2)
    before = resumed.state_dict()
    with pytest.raises(HvdDcasgdValueError, match="saved by a job of 3 workers cannot be taken on by this one of 2: "
                                                  "it lacks or misshapes a part"):
        resumed.load_state_dict(state)
    assert_same(resumed.state_dict(), before)


def test_a_state_saved_before_the_counts_of_earlier_workers_loads():
    comp, original, state = _saved()
    del state["before"], state["base"]
    resumed = fresh_server("sgd-momentum-wd", comp, seed=7)
    resumed.load_state_dict(state)
    assert resumed.before == {"applied": 0, "refused": 0} and resumed.base == 0
    assert [resumed.position(m) for m in range(3)] == original.telemetry.pushes


def test_each_change_of_who_is_present_is_one_event_of_the_trace_and_the_count(tmp_path):
    telemetry = Telemetry(4, str(tmp_path / "trace"))
    members = Membership(telemetry)
    assert members.count == telemetry.present == 4
    members.seen([False] * 4, update=3)  # nobody gone: nothing written
    members.dropped(2, update=5)
    members.seen([False, False, True, False], update=6)  # the dropped one, as the next poll sees it: no second event
    members.seen([True, False, True, True], update=9)
    members.dropped(3, update=10)  # gone already (left): not dropped as well
    assert members.present == [False, True, False, False] and members.count == telemetry.present == 1
    members.resized(12, before=4, after=2)
    assert members.present == [True, True] and telemetry.present == 2 and telemetry.pushes == [0, 0]
    telemetry.close()
    assert trace(tmp_path / "trace", events=True) == [
        {"event": "dropped", "member": 2, "at": 5}, {"event": "left", "member": 0, "at": 9},
        {"event": "left", "member": 3, "at": 9}, {"event": "resized", "workers": 2, "before": 4, "at": 12}]
    assert trace(tmp_path / "trace") == [], "no event is a push"


# --- real jobs ---------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("before,after", [(4, 3), (2, 3)], ids=["4-to-3", "2-to-3"])
def test_a_stopped_job_resumes_with_another_number_of_workers_exactly(tmp_path, before, after):
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace")}
    job = Job(tmp_path, *TRAINING, env=env, workers=before)
    job.wait_for("starts at step 0", before)
    time.sleep(0.5)
    job.signal_ranks(signal.SIGTERM)
    assert job.wait() == 75, job.text()
    stopped = len(trace(tmp_path / "trace"))
    assert 0 < stopped // after < 40, "the resumed job has steps left to take"

    status, log = run_job(tmp_path, *TRAINING, env=env, workers=after, log="log2")
    assert status == 0, log
    base = stopped // after
    assert f"resuming from update {stopped}" in log, log
    assert f"the checkpoint's job had {before} workers and this one has {after}" in log, log
    said = {(4, 3): "worker 3 left (its last weights and own state are dropped; nothing of it was pending)",
            (2, 3): "worker 2 joins from the current weights"}[before, after]
    assert said in log, log
    assert f"every worker resumes at batch {base} of its shard, the even share of the {stopped} pushes" in log, log
    for m in range(after):
        assert f"worker {m} starts at step {base}" in log, log
    records = trace(tmp_path / "trace", events=True)
    resized = [r for r in records if r.get("event") == "resized"]
    assert resized == [{"event": "resized", "workers": after, "before": before, "at": stopped}]
    # the first job's pushes, then the change (its workers' leaving came at the checkpoint's update: truncated)
    assert records.index(resized[0]) == stopped
    pushes = [r for r in records if "step" in r]
    assert [r["update"] for r in pushes] == list(range(len(pushes))), "one update per push, across the restart"
    for m in range(after):  # each worker's pushes of this job, once each, up to step 40 of its data
        assert [r["step"] for r in records[stopped + 1:] if r.get("worker") == m] == list(range(40 - base)), m
    assert sorted(r["member"] for r in records if r.get("event") == "left") == list(range(after)), "each left once"
    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, TRAINING))), workers=after,
                        first_workers=before)

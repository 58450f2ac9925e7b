"""A worker sends each bucket of its gradient as soon as backward has
finished it (``HVD_DCASGD_FUSION_THRESHOLD``), and the server still sees one
push, applied whole: the same trace and, bit for bit, the same weights as
when the whole gradient goes with ``step()`` -- with gradient accumulation,
clipping between ``synchronize()`` and ``skip_synchronize()``, compression
and two servers -- and an asynchronous run replays from its trace."""

import json
import sys

import pytest
import torch

from helpers import PROGRAMS, WORKERS, check_exactly_once, mpirun, replay_paper
from hvd_dcasgd.protocol.worker import buckets

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

STEPS = 8
#: synthetic's a (48 float32: 192 bytes on the wire) and b (16: 64 bytes) each a bucket of its own
BUCKETS = {"HVD_DCASGD_FUSION_THRESHOLD": "64"}
WHOLE = {"HVD_DCASGD_FUSION_THRESHOLD": "0"}


def test_buckets_are_runs_of_parameters_split_from_the_end():
    assert buckets([10, 20, 30, 40], 0) == [(0, 4)]  # no threshold: one bucket, sent by step()
    assert buckets([10, 20, 30, 40], 50) == [(0, 1), (1, 3), (3, 4)]  # 40; 30 + 20; 10
    assert buckets([10, 20, 30, 40], 60) == [(0, 3), (3, 4)]  # from the end: 40 alone (+30 > 60); 30 + 20 + 10
    assert buckets([100, 5, 5], 8) == [(0, 1), (1, 2), (2, 3)]  # a parameter above the threshold goes alone
    assert buckets([1, 1, 1], 1 << 26) == [(0, 3)]
    assert buckets([], 64) == []


def _run(tmp_path, name, workers, servers, args, env):
    out = tmp_path / name
    out.mkdir()
    trace = out / "trace.jsonl"
    result = mpirun(workers + servers, PROGRAMS / "synthetic.py", "--out", out, "--steps", STEPS, *args,
                    env={"HVD_DCASGD_TRACE": str(trace), "HVD_DCASGD_SERVERS": str(servers), **env})
    assert result.returncode == 0, result.stdout
    records = sorted((r for r in map(json.loads, trace.read_text().splitlines()) if "event" not in r), key=json.dumps)
    finals = [torch.load(out / f"worker{m}.pt", weights_only=True) for m in range(workers)]
    overlapped = [json.loads((out / f"start{m}.json").read_text())["overlapped"] for m in range(workers)]
    return records, finals, overlapped


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("workers,servers,args", [
    (1, 1, ["--compensation", "adaptive", "--momentum", "0.9", "--accumulate", "--compression", "fp16"]),
    (1, 1, ["--compensation", "constant", "--clip", "--accumulate"]),
    (3, 2, ["--compensation", "sync", "--compression", "bf16", "--accumulate", "--clip"]),
], ids=["adaptive-momentum-accumulate-fp16", "constant-clip-accumulate", "two-servers-sync-bf16-accumulate-clip"])
def test_bucketed_pushes_give_the_whole_pushes_weights_bit_for_bit(tmp_path, workers, servers, args):
    """Runs whose order of updates does not depend on timing (one worker, or
    the sync schedule), with and without buckets."""
    records, finals, overlapped = _run(tmp_path, "buckets", workers, servers, args, BUCKETS)
    whole_records, whole_finals, whole_overlapped = _run(tmp_path, "whole", workers, servers, args, WHOLE)
    assert overlapped == [2 * STEPS] * workers, "each step, both buckets left during backward"
    assert whole_overlapped == [0] * workers
    assert records == whole_records
    for state, whole in zip(finals, whole_finals):
        for name in ("a", "b"):
            assert torch.equal(state[name], whole[name]), name


@pytest.mark.mpi
@pytest.mark.slow
def test_an_asynchronous_run_with_buckets_replays_from_its_trace(tmp_path):
    args = ["--compensation", "constant", "--compression", "fp16", "--accumulate", "--optimizer", "adam"]
    records, finals, overlapped = _run(tmp_path, "async", WORKERS, 1, args, BUCKETS)
    assert overlapped == [2 * STEPS] * WORKERS
    records.sort(key=lambda r: r["update"])
    check_exactly_once(records, [STEPS] * WORKERS)
    expected = replay_paper(records, synthetic.parse_args([*args, "--steps", str(STEPS)]))
    for state in finals:
        assert torch.allclose(state["a"], expected.a.detach(), atol=1e-5)
        assert torch.allclose(state["b"], expected.b.detach(), atol=1e-5)

"""End-to-end runs under the real mpirun: exactly-once delivery, equivalence
with a single-process replay of the trace, sync = sequential SGD, lifecycle."""

import json
import sys

import pytest
import torch

from helpers import PROGRAMS, TCP, WORKERS, check_exactly_once, mpirun, replay_exactly, replay_paper

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

STEPS = 12


def _train(tmp_path, *args, mca=(), workers=WORKERS, env=None):
    trace = tmp_path / "trace.jsonl"
    result = mpirun(
        workers + 1, PROGRAMS / "synthetic.py", "--out", tmp_path, *args,
        mca=mca, env={"HVD_DCASGD_TRACE": str(trace), **(env or {})},
    )
    assert result.returncode == 0, result.stdout
    records = [r for r in map(json.loads, trace.read_text().splitlines()) if "event" not in r]  # the pushes
    final = [torch.load(tmp_path / f"worker{m}.pt") for m in range(workers)]
    starts = [json.loads((tmp_path / f"start{m}.json").read_text()) for m in range(workers)]
    return result.stdout, records, final, starts


@pytest.mark.parametrize("mca", [(), TCP], ids=["shared-memory", "tcp-pt2pt"])
def test_exactly_once(tmp_path, mca):
    out, records, _, _ = _train(tmp_path, "--steps", STEPS, "--compensation", "none", mca=mca)
    check_exactly_once(records, [STEPS] * WORKERS)
    assert f"server: {WORKERS * STEPS} updates in" in out
    assert f"pushes per worker {[STEPS] * WORKERS};" in out


@pytest.mark.parametrize(
    "mode,extra",
    [
        ("none", []),
        ("constant", ["--momentum", "0.9", "--weight-decay", "0.01", "--schedule"]),
        ("adaptive", []),
        ("adaptive", ["--lr-scaling", "horovod", "--momentum", "0.9", "--nesterov"]),
        ("adaptive", ["--optimizer", "adam", "--uneven"]),
        # compressed gradients magnify a last-bit difference in the weights into a
        # different rounding, so these runs use arithmetic the replay repeats bit for bit
        ("constant", ["--compression", "fp16", "--accumulate", "--optimizer", "adam"]),
        ("none", ["--compression", "bf16", "--clip", "--restore", "--optimizer", "adam"]),
    ],
    ids=["asgd", "constant-momentum-wd-schedule", "adaptive-fused", "adaptive-horovod-lr-nesterov", "adaptive-adam-uneven",
         "constant-adam-fp16-accumulate", "asgd-adam-bf16-clip-restore"],
)
def test_equivalence_with_single_processreplay_paper(tmp_path, mode, extra):
    args = synthetic.parse_args(["--compensation", mode, "--steps", str(STEPS), *extra])
    assert args.compensation == mode
    _, records, final, starts = _train(tmp_path, "--compensation", mode, "--steps", STEPS, *extra)
    steps = [STEPS * (m + 1) if args.uneven else STEPS for m in range(WORKERS)]
    check_exactly_once(records, steps)
    expected = replay_paper(records, args)
    for m in range(WORKERS):
        assert torch.allclose(final[m]["a"], expected.a.detach(), atol=1e-5)
        assert torch.allclose(final[m]["b"], expected.b.detach(), atol=1e-5)
    # every worker started from the server's weights (and frozen parameters), not its own seed
    torch.manual_seed(1000)
    initial = synthetic.Model()
    assert [s["a"] for s in starts] == [pytest.approx(initial.a.detach()[:4].tolist())] * WORKERS
    assert [s["frozen"] for s in starts] == [pytest.approx(initial.frozen.tolist())] * WORKERS


def test_the_bounded_rule_trains_where_the_papers_diverges_and_replays_bit_for_bit(tmp_path):
    """DC-ASGD-a at a rate of 0.05: with the paper's unbounded correction (HVD_DCASGD_BOUND=inf) at
    lambda_0 4 the weights blow up: either a worker's gradient becomes NaN or Inf, which ends the job with
    its sentence, or the job ends on weights beyond 1e6 (the data puts them within 1); with the default
    bound the job trains even at the default lambda_0, twice larger (8), ends on the weights of its trace's
    replay bit for bit, and within 1e-5 of the replay through the formulas written out in the tests.

    Which of the two blow-ups comes depends on the order the pushes arrive in: replayed in 600 random
    orders of three workers' 20 pushes, the paper's rule ended in a non-finite gradient in 296 and on
    weights beyond 1e6 in the other 304, in none within 1e6 (at lambda_0 2, 5 of 600 orders stayed within 1e6)."""
    steps = ["--compensation", "adaptive", "--steps", 20, "--lr", 0.05]
    workers = 3  # the rate at which the paper's rule blows up was found with three (staleness about 2)
    paper_out = tmp_path / "paper"
    paper_out.mkdir()
    paper = mpirun(workers + 1, PROGRAMS / "synthetic.py", "--out", paper_out, *steps,
                   env={"HVD_DCASGD_BOUND": "inf", "HVD_DCASGD_LAMBDA": "4"})
    if paper.returncode == 0:
        largest = max(float(torch.load(paper_out / f"worker{m}.pt")["a"].abs().max()) for m in range(workers))
        assert largest > 1e6, (largest, paper.stdout[-3000:])
    else:
        assert paper.returncode == 1 and "holds NaN or Inf" in paper.stdout, paper.stdout[-3000:]
    bounded = tmp_path / "bounded"
    bounded.mkdir()
    _, records, final, _ = _train(bounded, *steps, workers=workers)
    check_exactly_once(records, [20] * workers)
    args = synthetic.parse_args([str(a) for a in steps])
    a, b = replay_exactly(records, args, workers=workers)
    expected = replay_paper(records, args, workers=workers)
    for m in range(workers):
        assert torch.equal(final[m]["a"], a) and torch.equal(final[m]["b"], b), m
        assert torch.allclose(final[m]["a"], expected.a.detach(), atol=1e-5)
    assert float(a.abs().max()) < 10, "it trained: the weights stayed where the data puts them"

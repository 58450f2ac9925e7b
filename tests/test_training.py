"""End-to-end runs under the real mpirun: exactly-once delivery, equivalence
with a single-process replay of the trace, sync = sequential SGD, lifecycle."""

import json
import sys

import pytest
import torch

from helpers import PROGRAMS, TCP, mpirun, paper_compensation

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

WORKERS, STEPS = 3, 12


def _train(tmp_path, *args, mca=(), workers=WORKERS, env=None):
    trace = tmp_path / "trace.jsonl"
    result = mpirun(
        workers + 1, PROGRAMS / "synthetic.py", "--out", tmp_path, *args,
        mca=mca, env={"HVD_DCASGD_TRACE": str(trace), **(env or {})},
    )
    assert result.returncode == 0, result.stdout
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    final = [torch.load(tmp_path / f"worker{m}.pt") for m in range(workers)]
    starts = [json.loads((tmp_path / f"start{m}.json").read_text()) for m in range(workers)]
    return result.stdout, records, final, starts


def _check_exactly_once(records, steps_per_worker):
    total = sum(steps_per_worker)
    assert [r["update"] for r in records] == list(range(total)), "one server update per push, in order"
    for m, steps in enumerate(steps_per_worker):
        assert [r["step"] for r in records if r["worker"] == m] == list(range(steps))
    last_sent = {}
    for r in records:  # staleness = updates between the weights sent to m and this update
        assert r["staleness"] == r["update"] - last_sent.get(r["worker"], 0)
        last_sent[r["worker"]] = r["update"] + 1


@pytest.mark.parametrize("mca", [(), TCP], ids=["shared-memory", "tcp-pt2pt"])
def test_exactly_once(tmp_path, mca):
    out, records, _, _ = _train(tmp_path, "--steps", STEPS, "--compensation", "none", mca=mca)
    _check_exactly_once(records, [STEPS] * WORKERS)
    assert f"server: {WORKERS * STEPS} updates in" in out
    assert f"pushes per worker {[STEPS] * WORKERS};" in out


def _replay(records, args):
    """Replay the trace in one process: the gradient of push (m, k) at w_bak(m),
    compensated by the paper's formulas written out here (sharing no code with
    the package), then a fresh torch optimizer."""
    torch.manual_seed(1000)  # the server rank's seed: its weights are the initial ones
    model = synthetic.Model()
    if args.restore:
        with torch.no_grad():
            model.a.fill_(synthetic.RESTORED_A)
    optimizer = synthetic.make_optimizer(model, args)
    params = [model.a, model.b]
    backups = [[p.detach().clone() for p in params] for _ in range(WORKERS)]
    mean_squares = [torch.zeros_like(p) for p in params]
    lambda_0 = {"constant": 0.04, "adaptive": 2.0}.get(args.compensation, 0.0)
    wire = {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.compression]
    for r in records:
        m, k = r["worker"], r["step"]
        worker_model = synthetic.Model()
        with torch.no_grad():
            worker_model.a.copy_(backups[m][0])
            worker_model.b.copy_(backups[m][1])
        synthetic.backward_passes(worker_model, m, k, args)
        if args.clip:
            torch.nn.utils.clip_grad_norm_(worker_model.parameters(), synthetic.CLIP)
        grads = [worker_model.a.grad.to(wire).float(), worker_model.b.grad.to(wire).float()]
        for p, g, w_bak, mean_square in zip(params, grads, backups[m], mean_squares):
            w = p.detach()
            p.grad = paper_compensation(args.compensation, g, w, w_bak, lambda_0, mean_square)
        factor = synthetic.lr_factor(k) if args.schedule else 1.0
        if args.lr_scaling == "horovod":  # Horovod's rate is for the average of all workers' gradients
            factor /= WORKERS
        optimizer.param_groups[0]["lr"] = args.lr * factor
        optimizer.param_groups[1]["lr"] = args.lr * 0.5 * factor
        optimizer.step()
        backups[m] = [p.detach().clone() for p in params]
    return model


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
def test_equivalence_with_single_process_replay(tmp_path, mode, extra):
    args = synthetic.parse_args(["--compensation", mode, "--steps", str(STEPS), *extra])
    assert args.compensation == mode
    _, records, final, starts = _train(tmp_path, "--compensation", mode, "--steps", STEPS, *extra)
    steps = [STEPS * (m + 1) if args.uneven else STEPS for m in range(WORKERS)]
    _check_exactly_once(records, steps)
    expected = _replay(records, args)
    for m in range(WORKERS):
        assert torch.allclose(final[m]["a"], expected.a.detach(), atol=1e-5)
        assert torch.allclose(final[m]["b"], expected.b.detach(), atol=1e-5)
    # every worker started from the server's weights (and frozen parameters), not its own seed
    torch.manual_seed(1000)
    initial = synthetic.Model()
    assert [s["a"] for s in starts] == [pytest.approx(initial.a.detach()[:4].tolist())] * WORKERS
    assert [s["frozen"] for s in starts] == [pytest.approx(initial.frozen.tolist())] * WORKERS

"""Several servers under the real mpirun: each server's trace replays, with
the rest of the model taken from what that worker last received, to that
server's final weights; one worker (and the sync schedule) give bit for bit
the weights of one server; every rank ends with the same whole model."""

import json
import signal
import sys
import time

import pytest
import torch

from helpers import PROGRAMS, TCP, Job, mpirun, paper_compensation, run_job

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

WORKERS, STEPS = 3, 10
FLAT = synthetic.DIM_A + synthetic.DIM_B  # a, then b: the flat vector


def _train(tmp_path, servers, *args, workers=WORKERS, mca=(), env=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    trace = tmp_path / "trace.jsonl"
    result = mpirun(workers + servers, PROGRAMS / "synthetic.py", "--out", tmp_path, *args, mca=mca,
                    env={"HVD_DCASGD_TRACE": str(trace), "HVD_DCASGD_SERVERS": str(servers), **(env or {})})
    assert result.returncode == 0, result.stdout
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    finals = [torch.load(tmp_path / f"worker{m}.pt") for m in range(workers)]
    servers_final = [torch.load(tmp_path / ("server.pt" if s == 0 else f"server{s}.pt")) for s in range(servers)]
    return result.stdout, lines, finals, servers_final


def _flat(state):
    return torch.cat([state["a"].reshape(-1), state["b"].reshape(-1)])


def _per_shard(lines, servers, sync=False):
    """Each server's slice and its records, in the order it applied them."""
    heads = {r["shard"]: (r["offset"], r["numel"]) for r in lines if "offset" in r}
    assert sorted(heads) == list(range(servers)), "one first line per server"
    slices = [heads[s] for s in range(servers)]
    assert slices[0][0] == 0 and sum(n for _, n in slices) == FLAT
    assert all(o1 + n1 == o2 for (o1, n1), (o2, _) in zip(slices, slices[1:])), "contiguous, in order"
    records = [[r for r in lines if r.get("shard") == s and "update" in r] for s in range(servers)]
    for rs in records:
        updates = [r["update"] for r in rs]
        if sync:  # one update per round of every worker's push
            assert updates == [u for u in range(len(rs) // WORKERS) for _ in range(WORKERS)]
        else:
            assert updates == list(range(len(rs))), "one update per push, in order, per server"
    return slices, records


def _sharded_replay(slices, records, args):
    """Replay every server's trace at once, sharing no code with the package:
    the gradient of push (m, k) is computed on the whole model worker m held
    then (from each server, the weights it answered push k-1 with), each
    server compensates and steps its slice with a fresh torch optimizer over
    its pieces, in the order of its own trace."""
    torch.manual_seed(1000)  # the first server's seed: its weights are the initial ones
    initial = synthetic.Model()
    flat0 = torch.cat([initial.a.detach(), initial.b.detach()])
    lambda_0 = {"constant": 0.04, "adaptive": 2.0}.get(args.compensation, 0.0)
    shards = []
    for offset, numel in slices:
        weights = flat0[offset:offset + numel].clone()
        cut = max(0, min(numel, synthetic.DIM_A - offset))  # where b starts in this slice
        pieces = [weights[:cut].clone().requires_grad_(), weights[cut:].clone().requires_grad_()]
        groups = [{"params": [p for p in pieces[:1] if p.numel()]},
                  {"params": [p for p in pieces[1:] if p.numel()], "lr": args.lr * 0.5}]
        if args.optimizer == "adam":
            optimizer = torch.optim.Adam(groups, lr=args.lr, weight_decay=args.weight_decay)
        else:
            optimizer = torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
                                        nesterov=args.nesterov)
        shards.append({"offset": offset, "numel": numel, "pieces": pieces, "optimizer": optimizer,
                       "backups": {m: flat0[offset:offset + numel].clone() for m in range(WORKERS)},
                       "mean_square": torch.zeros(numel), "weights": lambda ps=pieces: torch.cat([p.detach() for p in ps])})
    sent = {}  # (server, worker, push) -> the weights that server answered it with
    position = [0] * len(shards)

    def gradient(m, k):
        whole = torch.cat([sent[(s, m, k - 1)] if k else flat0[sh["offset"]:sh["offset"] + sh["numel"]]
                           for s, sh in enumerate(shards)])
        model = synthetic.Model()
        with torch.no_grad():
            model.a.copy_(whole[:synthetic.DIM_A])
            model.b.copy_(whole[synthetic.DIM_A:])
        synthetic.backward_passes(model, m, k, args)
        return torch.cat([model.a.grad, model.b.grad])

    while any(p < len(rs) for p, rs in zip(position, records)):
        moved = False
        for s, shard in enumerate(shards):
            while position[s] < len(records[s]):
                r = records[s][position[s]]
                m, k = r["worker"], r["step"]
                if k and any((t, m, k - 1) not in sent for t in range(len(shards))):
                    break  # this worker's previous push is not answered by every server yet
                g = gradient(m, k)[shard["offset"]:shard["offset"] + shard["numel"]]
                w, w_bak = shard["weights"](), shard["backups"][m]
                if args.compensation in ("constant", "adaptive"):
                    g = paper_compensation(args.compensation, g, w, w_bak, lambda_0, shard["mean_square"])
                elif args.compensation == "staleness":  # Zhang et al. 2016: this server's own staleness
                    g = g / max(1, r["staleness"])
                cut = shard["pieces"][0].numel()
                shard["pieces"][0].grad, shard["pieces"][1].grad = g[:cut].clone(), g[cut:].clone()
                optimizer = shard["optimizer"]
                optimizer.param_groups[0]["lr"] = args.lr
                optimizer.param_groups[1]["lr"] = args.lr * 0.5
                optimizer.step()
                shard["backups"][m] = shard["weights"]()
                sent[(s, m, k)] = shard["backups"][m].clone()
                position[s] += 1
                moved = True
        assert moved, "no server can go on: the traces are not those of one run"
    return [shard["weights"]() for shard in shards]


@pytest.mark.parametrize("servers,mode,extra", [
    (2, "none", []),
    (2, "constant", ["--momentum", "0.9", "--weight-decay", "0.01"]),
    (2, "adaptive", []),
    (2, "staleness", ["--optimizer", "adam"]),
    (3, "constant", ["--momentum", "0.9", "--weight-decay", "0.01"]),
    (3, "adaptive", ["--optimizer", "adam"]),
], ids=["2-asgd", "2-constant-momentum-wd", "2-adaptive", "2-staleness-adam", "3-constant-momentum-wd",
        "3-adaptive-adam"])
def test_each_servers_trace_replays_to_its_final_weights(tmp_path, servers, mode, extra):
    args = synthetic.parse_args(["--compensation", mode, "--steps", str(STEPS), *extra])
    _, lines, finals, servers_final = _train(tmp_path, servers, "--compensation", mode, "--steps", STEPS, *extra)
    slices, records = _per_shard(lines, servers)
    for rs in records:  # every server took every push once, each worker's in order
        for m in range(WORKERS):
            assert [r["step"] for r in rs if r["worker"] == m] == list(range(STEPS))
    expected = _sharded_replay(slices, records, args)
    final = _flat(finals[0])
    for (offset, numel), weights in zip(slices, expected):
        assert torch.allclose(final[offset:offset + numel], weights, atol=1e-5), (offset, numel)
    for state in finals[1:] + servers_final:  # every rank, every server included, holds the whole final model
        assert torch.equal(_flat(state), final)
        assert torch.equal(state["running"], finals[0]["running"])


@pytest.mark.parametrize("servers", [3])
def test_one_worker_on_several_servers_is_sequential_sgd_bit_for_bit(tmp_path, servers):
    extra = ["--compensation", "adaptive", "--steps", STEPS, "--momentum", "0.9", "--nesterov"]
    _, _, one, _ = _train(tmp_path / "one", 1, *extra, workers=1)
    _, lines, several, _ = _train(tmp_path / "several", servers, *extra, workers=1)
    assert torch.equal(_flat(several[0]), _flat(one[0]))
    _per_shard(lines, servers)


@pytest.mark.parametrize("servers,mca", [(2, ()), (3, TCP)], ids=["2", "3-tcp-pt2pt"])
def test_sync_rounds_per_server_equal_one_server_bit_for_bit(tmp_path, servers, mca):
    extra = ["--compensation", "sync", "--steps", STEPS, "--optimizer", "adam"]
    _, _, one, _ = _train(tmp_path / "one", 1, *extra)
    _, lines, several, _ = _train(tmp_path / "several", servers, *extra, mca=mca)
    for m in range(WORKERS):
        assert torch.equal(_flat(several[m]), _flat(one[0]))
    _, records = _per_shard(lines, servers, sync=True)
    assert all(len(rs) == WORKERS * STEPS for rs in records)


@pytest.mark.parametrize("env,ranks,expected", [
    ({"HVD_DCASGD_SERVERS": "4"}, 4, "4 server(s) (HVD_DCASGD_SERVERS) need at least 5 ranks, one worker or more; "
                                     "this job has 4"),
    ({"HVD_DCASGD_SERVERS": "0"}, 3, "HVD_DCASGD_SERVERS='0' is not valid: use a whole number >= 1"),
], ids=["more-servers-than-ranks", "zero"])
def test_a_bad_number_of_servers_is_a_sentence_on_every_rank(tmp_path, env, ranks, expected):
    env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}
    result = mpirun(ranks, PROGRAMS / "synthetic.py", "--steps", 2, env=env, timeout=120)
    assert result.returncode != 0
    assert result.stdout.count(expected) == ranks, result.stdout


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_restores_and_optimizer_state_on_several_servers_are_those_of_one(tmp_path, optimizer):
    """Horovod's restore idiom (worker 0 loads weights after wrapping, then
    broadcasts parameters and optimizer state) reaches every server, each its
    slice; the optimizer state a worker saves mid-training is the servers'
    put together: with one worker, both are bit for bit those of one server."""
    extra = ["--compensation", "adaptive", "--steps", STEPS, "--optimizer", optimizer, "--momentum", "0.9",
             "--restore", "--snapshot-at", 4]
    if optimizer == "adam":
        extra = [x for x in extra if x not in ("--momentum", "0.9")]
    _, _, one, _ = _train(tmp_path / "one", 1, *extra, workers=1)
    _, _, several, servers_final = _train(tmp_path / "several", 3, *extra, workers=1)
    assert torch.equal(_flat(several[0]), _flat(one[0]))
    assert all(torch.equal(_flat(state), _flat(one[0])) for state in servers_final)
    saved = [torch.load(tmp_path / run / "snapshot.pt") for run in ("one", "several")]
    assert torch.equal(_flat(saved[1]["model"]), _flat(saved[0]["model"]))
    states = [s["optimizer"]["state"] for s in saved]
    assert sorted(states[1]) == sorted(states[0]) == [0, 1]
    for i in states[0]:
        assert sorted(states[1][i]) == sorted(states[0][i])
        for key, value in states[0][i].items():
            assert torch.equal(torch.as_tensor(states[1][i][key]), torch.as_tensor(value)), (i, key)
    assert saved[1]["optimizer"]["param_groups"] == saved[0]["optimizer"]["param_groups"]


TRAINING = ["--steps", 40, "--step-time", 0.03, "--compensation", "adaptive", "--momentum", 0.9]


def _check_resumed(tmp_path, lines, servers):
    """The concatenated trace of the interrupted and the resumed job replays,
    server by server, to the final weights every rank holds."""
    slices, records = _per_shard(lines, servers)  # each server's update numbers continue across the restart
    for rs in records:
        for m in range(WORKERS):
            assert [r["step"] for r in rs if r["worker"] == m] == list(range(40))
    expected = _sharded_replay(slices, records, synthetic.parse_args(list(map(str, TRAINING))))
    final = _flat(torch.load(tmp_path / "worker0.pt"))
    for (offset, numel), weights in zip(slices, expected):
        assert torch.allclose(final[offset:offset + numel], weights, atol=1e-5), (offset, numel)
    for path in [*(tmp_path / f"worker{m}.pt" for m in range(1, WORKERS)), tmp_path / "server.pt",
                 *(tmp_path / f"server{s}.pt" for s in range(1, servers))]:
        assert torch.equal(_flat(torch.load(path)), final), path


@pytest.mark.parametrize("servers", [2, 3])
def test_sigterm_stops_every_server_at_one_cut_and_the_same_command_resumes_exactly(tmp_path, servers):

    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace"),
           "HVD_DCASGD_SERVERS": str(servers)}
    job = Job(tmp_path, *TRAINING, env=env, servers=servers)
    job.wait_for("starts at step 0", WORKERS)
    time.sleep(0.5)
    job.signal_ranks(signal.SIGTERM)
    status = job.wait()
    log = job.text()
    assert status == 75, log
    assert log.count("exit status 75 (preempted)") == servers, log
    folders = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert folders == [f"server-{s}-of-{servers}" for s in range(servers)]
    cuts = [sorted(p.name for p in (tmp_path / "checkpoints" / f).iterdir()) for f in folders]
    assert all(names == cuts[0] for names in cuts), cuts  # every server wrote the same cuts
    states = [torch.load(tmp_path / "checkpoints" / f / cuts[0][-1], weights_only=True) for f in folders]
    assert all(s["pushes"] == states[0]["pushes"] for s in states), "one cut: the same pushes on every server"
    assert 0 < sum(states[0]["pushes"]) < WORKERS * 40

    status, log = run_job(tmp_path, *TRAINING, env=env, log="log2", servers=servers)
    assert status == 0, log
    assert log.count("resuming from update") == servers, log
    assert "starts at step 0" not in log
    _check_resumed(tmp_path, [json.loads(line) for line in (tmp_path / "trace").read_text().splitlines()], servers)


def test_sigkill_then_every_server_resumes_from_the_newest_cut_they_all_hold(tmp_path):

    servers = 2
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_TRACE": str(tmp_path / "trace"),
           "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.2", "HVD_DCASGD_SERVERS": str(servers)}
    job = Job(tmp_path, *TRAINING, env=env, servers=servers)
    job.wait_for(lambda: all(len(list((tmp_path / "checkpoints").glob(f"server-{s}-of-2/checkpoint-*.pt"))) >= 2
                             for s in range(servers)))
    time.sleep(0.1)
    job.signal_ranks(signal.SIGKILL, ranks=[servers + 1])  # one worker dies: mpirun ends the job
    assert job.wait() != 0
    status, log = run_job(tmp_path, *TRAINING, env=env, log="log2", servers=servers)
    assert status == 0, log
    assert log.count("resuming from update") == servers, log
    _check_resumed(tmp_path, [json.loads(line) for line in (tmp_path / "trace").read_text().splitlines()], servers)


def test_a_checkpoint_folder_of_another_number_of_servers_is_refused(tmp_path):
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HVD_DCASGD_SERVERS": "2"}
    result = mpirun(4, PROGRAMS / "synthetic.py", "--steps", 2, env=env, timeout=120)
    assert result.returncode == 0, result.stdout
    for ranks, servers in ((5, "3"), (4, "1")):
        result = mpirun(ranks, PROGRAMS / "synthetic.py", "--steps", 2, env={**env, "HVD_DCASGD_SERVERS": servers},
                        timeout=120)
        assert result.returncode != 0
        assert "holds server-0-of-2, written by a job with another number of servers" in result.stdout, result.stdout


@pytest.mark.parametrize("schedule", ["async", "sync"])
def test_a_stalled_worker_is_dropped_by_every_server_and_the_others_finish(tmp_path, schedule):

    servers = 2
    env = {"HVD_DCASGD_STALL_TIMEOUT": "2", "HVD_DCASGD_SCHEDULE": schedule, "HVD_DCASGD_SERVERS": str(servers)}
    job = Job(tmp_path, "--bad", "hang", "--steps", 20, "--step-time", 0.02, env=env, servers=servers)
    status = job.wait()
    log = job.text()
    assert status == 69, log
    assert "worker 1 (MPI rank 3, host" in log and "dropped after 2 s (HVD_DCASGD_STALL_TIMEOUT)" in log, log
    for m in (0, 2):  # their code after shutdown() ran: the final weights were saved
        assert f"worker {m} done: 20 steps" in log
    final = [_flat(torch.load(tmp_path / f"worker{m}.pt", weights_only=True)) for m in (0, 2)]
    assert torch.equal(final[0], final[1])
    assert not (tmp_path / "worker1.pt").exists()
    assert time.monotonic() - job.started < 60  # not the stalled worker's 600 s

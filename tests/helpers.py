"""What the tests share, in one module (tests import it, never each other):

* jobs: a program under the real ``mpirun`` (built by the launcher's
  builder), or Python, with a timeout, so a hang fails;
* the paper's formula, written out once and independently of the package
  (:func:`paper_compensation`), for the references the server is checked
  against;
* a small model, its optimizers and a server over ``COMM_SELF`` with pushes
  written straight into its inboxes; the digits data of the simulator's tests.
"""

import copy
import json
import math
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from sklearn.datasets import load_digits

from hvd_dcasgd.algorithm.compensation import Compensation
from hvd_dcasgd.algorithm.endpoints import open_server
from hvd_dcasgd.launcher.command import local_command
from hvd_dcasgd.protocol.layout import ModelLayout, flatten_into
from hvd_dcasgd.runtime.mpi import load_mpi
from hvd_dcasgd.common.process import run_command
from hvd_dcasgd.algorithm.update import ServerUpdate

# --- jobs ------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
TCP = ("--mca", "btl", "tcp,self", "--mca", "osc", "pt2pt")
#: Workers of a job (:class:`Job`, and the checks of its trace), unless a test says otherwise: two, the fewest
#: that make gradients stale, since each rank of a job costs the suite seconds of CPU (it imports torch).
WORKERS = 2


def run(cmd, env=None, timeout=180):
    """Run ``cmd`` in its own process group, this checkout first on
    PYTHONPATH; a run past ``timeout`` (a hang) fails the test."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    result = run_command(cmd, timeout=timeout, env=full_env, cwd=ROOT)
    if result.timed_out:
        pytest.fail(f"timed out after {timeout} s (a hang): {' '.join(result.args)}\n{result.stdout[-4000:]}")
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, "")


def mpirun(np, program, *args, mca=(), env=None, timeout=180):
    """``mpirun -np np python program args`` (oversubscribed, root allowed),
    built by the launcher's builder."""
    return run(local_command(np, [program, *args], mca), env=env, timeout=timeout)


def python(program, *args, env=None, timeout=180):
    return run([sys.executable, str(program), *map(str, args)], env=env, timeout=timeout)


def unavailable(reason, deliberate=False):
    """A real component the test needs (Horovod, SLURM) could not be had:
    skip, saying why -- except under CI (``CI`` set), whose set-up is there to
    provide it, where the test fails; ``deliberate`` (the set-up was told to
    leave the component out) skips there too."""
    if os.environ.get("CI") and not deliberate:
        pytest.fail(f"{reason} (CI is set: its set-up is supposed to provide this)")
    pytest.skip(reason)


def horovod_installed() -> bool:
    return importlib.util.find_spec("horovod") is not None



class BackgroundJob:
    """A command in the background in its own process group, its output in
    the file ``log``, killed (the whole group) if it outlives ``timeout``."""

    def __init__(self, cmd, log: Path, env=None, timeout=120):
        self.timeout, self.log = timeout, log
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
        self.started = time.monotonic()
        with open(self.log, "w") as log_file:
            self.proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=full_env, stdout=log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, what, count=1) -> None:
        """Wait until the output holds ``what`` ``count`` times (or ``what()`` is true)."""
        deadline = self.started + self.timeout
        while time.monotonic() < deadline:
            if callable(what) and what():
                return
            if isinstance(what, str) and self.text().count(what) >= count:
                return
            if self.proc.poll() is not None:
                pytest.fail(f"the job ended (status {self.proc.returncode}) before {what!r}:\n{self.text()[-4000:]}")
            time.sleep(0.02)
        self.kill()
        pytest.fail(f"timed out waiting for {what!r}:\n{self.text()[-4000:]}")

    def wait(self) -> int:
        try:
            self.proc.wait(timeout=max(1.0, self.started + self.timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"timed out after {self.timeout} s (a hang):\n{self.text()[-4000:]}")
        return self.proc.returncode

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Job(BackgroundJob):
    """One ``mpirun`` of the synthetic program in the background (see
    :class:`BackgroundJob`)."""

    def __init__(self, out: Path, *args, workers=WORKERS, mca=(), env=None, timeout=120, log="log", launcher=False,
                 servers=1):
        self.out, self.ranks = out, workers + servers
        if launcher:  # this project's launcher, as a user runs it
            start = [sys.executable, str(ROOT / "launch" / "hvd-dcasgd-run"), "-n", str(workers)]
        else:
            start = local_command(workers + servers, [], mca)
        cmd = [*start, str(PROGRAMS / "synthetic.py"), "--out", str(out), *map(str, args)]
        super().__init__(cmd, out / log, env, timeout)

    def pid(self, world_rank: int) -> int:
        return int((self.out / f"pid{world_rank}").read_text())

    def signal_ranks(self, number, ranks=None) -> None:
        for rank in range(self.ranks) if ranks is None else ranks:
            os.kill(self.pid(rank), number)


class SlowDisk:
    """Every ``fsync`` of process ``pid`` (all its threads) takes ``seconds``
    longer, from now until :meth:`end`: a slow disk (an overloaded network
    file system) for that process alone, by ``strace``'s fault injection,
    with nothing changed in the process.  Returns once strace is attached.
    (Attached with ``-p``, strace stops the process at every system call,
    not only at fsync: the process runs somewhat slower meanwhile.)"""

    def __init__(self, pid: int, seconds: float, log: Path):
        if shutil.which("strace") is None:
            unavailable("strace is not installed (the set-up installs it)")
        self.pid, self.log = pid, log
        errors = log.with_suffix(".stderr")
        with open(errors, "w") as err:  # a file, not a pipe: a full pipe would stop strace and the process
            self.proc = subprocess.Popen(["strace", "-f", "-qq", "-o", str(log), "-e", "trace=fsync",
                                          "-e", f"inject=fsync:delay_enter={int(seconds * 1e6)}", "-p", str(pid)],
                                         stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 10
        while self._tracer() in (None, 0):
            if self.proc.poll() is not None:
                unavailable(f"strace cannot attach to process {pid} here: {errors.read_text().strip()}")
            if time.monotonic() > deadline:
                pytest.fail(f"strace did not attach to process {pid} within 10 s")
            time.sleep(0.01)

    def _tracer(self):
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("TracerPid:")))

    def slowed(self) -> int:
        """How many fsync calls were slowed so far."""
        return self.log.read_text().count("(DELAYED)") if self.log.exists() else 0

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # strace detaches and leaves the process running
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # strace can hang on a tracee gone in a delayed call
                self.proc.kill()  # the kernel detaches what it still traced
                self.proc.wait()


def run_on_slow_disk(job: "Job", rank: int, seconds: float = 2.5):
    """Once every worker of ``job`` has started, make every fsync of world
    rank ``rank`` take ``seconds`` longer (:class:`SlowDisk`) until the job
    ends: its status, its output and how many fsync calls were slowed."""
    job.wait_for("starts at step 0", WORKERS)
    disk = SlowDisk(job.pid(rank), seconds, job.out / "strace")
    try:
        status = job.wait()
    finally:
        disk.end()
    return status, job.text(), disk.slowed()


def run_job(out, *args, **kwargs):
    job = Job(out, *args, **kwargs)
    status = job.wait()
    return status, job.text()


# --- GPU placement -----------------------------------------------------------
def placed_ranks(folder: Path, size: int) -> list:
    """What each of ``size`` ranks of ``programs/pinning.py`` wrote into ``folder``, by world rank."""
    found = sorted(folder.glob("rank*.json"))
    assert len(found) == size, f"{len(found)} of {size} ranks wrote what they see: {[p.name for p in found]}"
    return sorted((json.loads(p.read_text()) for p in found), key=lambda r: r["world_rank"])


def gpu_placement_problems(ranks: list, gpus: list) -> list:
    """What is wrong with the GPUs ``ranks`` (:func:`placed_ranks`) see among the stand-in ids ``gpus``, by
    the rule of docs/GPU.md, written out here: on each host the servers take the first GPUs, one each; each
    worker takes one no server of its host holds (any, where the servers took them all), the workers together
    every one the servers leave, as evenly as they can; each rank sees every GPU, its own at its
    ``hvd.local_rank()`` (or its own alone, where that index is past the list)."""
    problems = []
    for host in sorted({r["host"] for r in ranks}):
        here = [r for r in ranks if r["host"] == host]
        owns = {True: [], False: []}  # servers', workers' own GPUs
        for r in here:
            same_role = [o for o in here if o["server"] == r["server"] and o["world_rank"] < r["world_rank"]]
            if r["local_rank"] != len(same_role):
                problems.append(f"{host} rank {r['world_rank']}: hvd.local_rank() {r['local_rank']} is not its place "
                                f"among its host's {'servers' if r['server'] else 'workers'} ({len(same_role)})")
            seen = r["visible"].split(",")
            turned = any(seen == gpus[i:] + gpus[:i] for i in range(len(gpus)))
            if not (turned if r["local_rank"] < len(gpus) else len(seen) == 1 and seen[0] in gpus):
                problems.append(f"{host} rank {r['world_rank']} sees {r['visible']!r}: not every GPU turned, nor "
                                f"its own alone")
            owns[r["server"]].append(seen[r["local_rank"] % len(seen)])
        if owns[True] != [gpus[i % len(gpus)] for i in range(len(owns[True]))]:
            problems.append(f"{host}: the servers are on {owns[True]}, not the first GPUs one each")
        left = [g for g in gpus if g not in owns[True]] or gpus
        workers = owns[False]
        if any(g not in left for g in workers):
            problems.append(f"{host}: a worker shares a server's GPU ({workers}, the servers' {owns[True]})")
        counts = [workers.count(g) for g in left]
        if workers and max(counts) - min(counts) > 1:
            problems.append(f"{host}: the workers are on {workers}, not spread over {left}")
    return problems


# --- the paper's formula ---------------------------------------------------
def paper_compensation(mode, g, w, w_bak, lambda_0, mean_square=None, bound=1.0):
    """DC-ASGD's compensated gradient, as the paper writes it: Eq. 10,
    ``g + lambda * g * g * (w - w_bak)``, with lambda_t = lambda_0
    (``constant``) or lambda_0 / sqrt(MeanSquare + eps) (``adaptive``,
    section 6: ``mean_square``, updated in place, with momentum 0.95 and
    eps 1e-7), the correction then held within ``bound * |g|`` (the package's
    default 1.0; ``math.inf``: the paper's formula unchanged); ``g`` itself
    for any other mode (ASGD)."""
    if mode == "constant":
        correction = lambda_0 * g * g * (w - w_bak)
    elif mode == "adaptive":
        mean_square.mul_(0.95).add_(0.05 * g * g)
        correction = lambda_0 / torch.sqrt(mean_square + 1e-7) * g * g * (w - w_bak)
    else:
        return g
    if bound != math.inf:
        correction = correction.clamp(min=-bound * g.abs(), max=bound * g.abs())
    return g + correction


# --- a server over COMM_SELF -------------------------------------------------
#: Workers of a server over COMM_SELF (no process each: any number costs nothing).
SELF_WORKERS = 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(6, 5)
        self.fc2 = torch.nn.Linear(5, 2)


def param_groups(model):
    return [{"params": list(model.fc1.parameters())}, {"params": list(model.fc2.parameters()), "lr": 0.05}]


def _weights_and_biases(model):
    """The usual per-group settings: weight decay off for biases; Nesterov
    with weight decay for the weights; dampening on the biases' momentum."""
    return [{"params": [model.fc1.weight, model.fc2.weight], "weight_decay": 1e-2, "nesterov": True},
            {"params": [model.fc1.bias, model.fc2.bias], "lr": 0.05, "momentum": 0.5, "dampening": 0.3}]


OPTIMIZERS = {
    "sgd": lambda model: torch.optim.SGD(param_groups(model), lr=0.1),
    "sgd-momentum-wd": lambda model: torch.optim.SGD(param_groups(model), lr=0.1, momentum=0.9, weight_decay=1e-2),
    "sgd-nesterov": lambda model: torch.optim.SGD(param_groups(model), lr=0.1, momentum=0.9, nesterov=True),
    "sgd-dampening": lambda model: torch.optim.SGD(param_groups(model), lr=0.1, momentum=0.9, dampening=0.5),
    "sgd-per-group": lambda model: torch.optim.SGD(_weights_and_biases(model), lr=0.1, momentum=0.9),
    "adam": lambda model: torch.optim.Adam(param_groups(model), lr=0.01, weight_decay=1e-3),
}


def server_and_reference(optimizer_name, mode, wire=torch.float32, per_worker=False, staged=False, path=None):
    model = Net()
    optimizer = OPTIMIZERS[optimizer_name](model)
    reference = copy.deepcopy(model)
    reference_optimizer = OPTIMIZERS[optimizer_name](reference)
    layout = ModelLayout.of(optimizer, model.named_parameters(), model)
    comp = Compensation(mode, per_worker_mean_square=per_worker)
    server = open_server(load_mpi().COMM_SELF, optimizer, layout, comp, num_workers=SELF_WORKERS, wire_dtype=wire,
                         staged=staged, update_path=path)
    return server, model, reference, reference_optimizer, comp


def reference_step(optimizer, params, g, lrs):
    """The user's optimizer stepping with the flat gradient ``g`` (in the
    wire's order of ``params``) at the rates ``lrs``, one per param group."""
    offset = 0
    for p in params:
        p.grad = g[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    optimizer.step()


def push_gradient(server, worker, seed, lrs):
    gen = torch.Generator().manual_seed(seed)
    gradient = torch.randn(server.layout.numel, generator=gen)
    message = server.messages[worker]
    message.gradient.copy_(gradient)
    message.lrs.copy_(torch.tensor(lrs, dtype=torch.float64))
    return message.gradient.to(torch.float32, copy=True)  # what the server sees, after any wire cast


ORDER = [0, 1, 2, 1, 0, 0, 2, 1, 2, 0]


def fresh_server(optimizer_name, comp, seed=0, wire=torch.float32, num_workers=SELF_WORKERS, **options):
    torch.manual_seed(seed)
    model = Net()
    if seed:  # a server that starts elsewhere, so a load has something to overwrite
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
    optimizer = OPTIMIZERS[optimizer_name](model)
    layout = ModelLayout.of(optimizer, model.named_parameters(), model)
    return open_server(load_mpi().COMM_SELF, optimizer, layout, comp, num_workers=num_workers, wire_dtype=wire, **options)


def apply_pushes(server, pushes):
    for i in pushes:
        worker = ORDER[i % len(ORDER)]
        push_gradient(server, worker, seed=100 + i, lrs=[0.1 / (1 + i), 0.05])
        server.apply(worker)


def assert_same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert sorted(a, key=str) == sorted(b, key=str), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"



# --- the simulator's data ----------------------------------------------------
SAMPLES, BATCH = 240, 10  # 240 digits: 60 per worker for 4 workers, 6 steps per worker per epoch


def digits_data():
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y)
    return (x[:SAMPLES], y[:SAMPLES]), (x[SAMPLES : SAMPLES + 200], y[SAMPLES : SAMPLES + 200])


def digits_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


def lr_of_epoch(epoch):
    return 0.2 / (1 + int(epoch))  # the simulator asks at fractional epochs; this rate changes once per epoch


# The synthetic job (tests/programs/synthetic.py): its trace, and replays of
# it that end bit for bit where the job ends.

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

FLAT = synthetic.DIM_A + synthetic.DIM_B  # a, then b: the flat vector


def trace(path: Path, events: bool = False):
    """A trace's lines of pushes and of weights sent outside a push; with
    ``events``, its membership events too (``{"event": ...}``: a worker that
    left or was dropped, a resume with another number of workers)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return lines if events else [r for r in lines if "event" not in r]


def replay_exactly(records, args, workers=WORKERS, at_sent=None):
    """The weights the server ends with, computed in one process with its own
    update (compensation, then the optimizer's step, on one flat vector),
    following the trace line by line; ``at_sent(weights, optimizer)`` is
    called where the trace says weights were sent outside a push.  Where the
    job resumed with another number of workers (a ``"resized"`` event), the
    workers of both keep their backups, new ones start from the weights then,
    and every worker's data goes on at the even share of the pushes before
    (hvd_dcasgd.algorithm.membership's rule, written out here)."""
    torch.manual_seed(1000)  # the server rank's seed: its weights are the initial ones
    model = synthetic.Model()
    optimizer = synthetic.make_optimizer(model, args)
    layout = ModelLayout.of(optimizer, model.named_parameters())
    params = [model.a, model.b]
    weights = torch.empty(layout.numel, dtype=layout.dtype)
    flatten_into(weights, layout.views(weights), [p.detach() for p in params])
    grad = torch.zeros_like(weights)
    for p, weight, g in zip(params, layout.views(weights), layout.views(grad)):
        p.data, p.grad = weight, g
    update = ServerUpdate(optimizer, layout, Compensation(mode=args.compensation), weights, grad, workers,
                          staged=False)
    backups = [weights.clone() for _ in range(workers)]
    lrs = [group["lr"] for group in optimizer.param_groups]
    taken, base = 0, 0  # pushes applied so far; the data position every worker resumed at
    for r in records:
        if r.get("event") == "resized":
            backups = [*backups[:r["workers"]], *(weights.clone() for _ in range(r["workers"] - len(backups)))]
            base = taken // r["workers"]
            continue
        if "event" in r:  # a worker left: nothing to replay
            continue
        m = r["worker"]
        if "sent" in r:  # the worker got the weights of this moment, outside a push
            backups[m].copy_(weights)
            if at_sent is not None:
                at_sent(layout.views(weights), optimizer)
            continue
        worker_model = synthetic.Model()
        with torch.no_grad():
            worker_model.a.copy_(layout.views(backups[m])[0])
            worker_model.b.copy_(layout.views(backups[m])[1])
        synthetic.backward_passes(worker_model, m, base + r["step"], args)
        gradient = torch.empty_like(weights)
        flatten_into(gradient, layout.views(gradient), [worker_model.a.grad, worker_model.b.grad])
        update(gradient, backups[m], m, lrs)
        backups[m].copy_(weights)
        taken += 1
    return layout.views(weights)


def check_history(records, steps, workers=WORKERS):
    """Update numbers 0..n-1 once each, in order; every worker's steps 0..steps-1 once each, in order."""
    records = [r for r in records if "update" in r]
    assert [r["update"] for r in records] == list(range(len(records)))
    for m in range(workers):
        assert [r["step"] for r in records if r["worker"] == m] == list(range(steps)), m


def check_final_weights(out, records, args, at_sent=None, workers=WORKERS, first_workers=None):
    """Every worker's final weights (``workers`` of them) are the trace's
    replay, bit for bit (``first_workers``: the first job's number of
    workers, where it differs)."""
    a, b = replay_exactly(records, args, workers=first_workers or workers, at_sent=at_sent)
    for m in range(workers):
        final = torch.load(out / f"worker{m}.pt", weights_only=True)
        assert torch.equal(final["a"], a) and torch.equal(final["b"], b), m


TRAINING = ["--steps", 40, "--step-time", 0.03, "--compensation", "adaptive", "--momentum", 0.9]


def flat_ab(state):
    return torch.cat([state["a"].reshape(-1), state["b"].reshape(-1)])


def per_shard(lines, servers, sync=False, workers=WORKERS):
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
            assert updates == [u for u in range(len(rs) // workers) for _ in range(workers)]
        else:
            assert updates == list(range(len(rs))), "one update per push, in order, per server"
    return slices, records


def sharded_replay(slices, records, args):
    """Replay every server's trace at once, sharing no code with the package:
    the gradient of push (m, k) is computed on the whole model worker m held
    then (from each server, the weights it answered push k-1 with), each
    server compensates and steps its slice with a fresh torch optimizer over
    its pieces, in the order of its own trace."""
    torch.manual_seed(1000)  # the first server's seed: its weights are the initial ones
    initial = synthetic.Model()
    flat0 = torch.cat([initial.a.detach(), initial.b.detach()])
    lambda_0 = {"constant": 0.04, "adaptive": 8.0}.get(args.compensation, 0.0)
    shards = []
    for offset, numel in slices:
        weights = flat0[offset:offset + numel].clone()
        split = max(0, min(numel, synthetic.DIM_A - offset))  # where b starts in this slice
        pieces = [weights[:split].clone().requires_grad_(), weights[split:].clone().requires_grad_()]
        groups = [{"params": [p for p in pieces[:1] if p.numel()]},
                  {"params": [p for p in pieces[1:] if p.numel()], "lr": args.lr * 0.5}]
        if args.optimizer == "adam":
            optimizer = torch.optim.Adam(groups, lr=args.lr, weight_decay=args.weight_decay)
        else:
            optimizer = torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
                                        nesterov=args.nesterov)
        shards.append({"offset": offset, "numel": numel, "pieces": pieces, "optimizer": optimizer,
                       "backups": {},  # each worker's, from its first push on
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
                w = shard["weights"]()
                w_bak = shard["backups"].get(m, flat0[shard["offset"]:shard["offset"] + shard["numel"]])
                if args.compensation in ("constant", "adaptive"):
                    g = paper_compensation(args.compensation, g, w, w_bak, lambda_0, shard["mean_square"])
                elif args.compensation == "staleness":  # Zhang et al. 2016: this server's own staleness
                    g = g / max(1, r["staleness"])
                split = shard["pieces"][0].numel()
                shard["pieces"][0].grad, shard["pieces"][1].grad = g[:split].clone(), g[split:].clone()
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


def check_resumed_sharded(tmp_path, lines, servers, workers=WORKERS):
    """The concatenated trace of the interrupted and the resumed job replays,
    server by server, to the final weights every rank holds."""
    slices, records = per_shard(lines, servers)  # each server's update numbers continue across the restart
    for rs in records:
        for m in range(workers):
            assert [r["step"] for r in rs if r["worker"] == m] == list(range(40))
    expected = sharded_replay(slices, records, synthetic.parse_args(list(map(str, TRAINING))))
    final = flat_ab(torch.load(tmp_path / "worker0.pt"))
    for (offset, numel), weights in zip(slices, expected):
        assert torch.allclose(final[offset:offset + numel], weights, atol=1e-5), (offset, numel)
    for path in [*(tmp_path / f"worker{m}.pt" for m in range(1, workers)), tmp_path / "server.pt",
                 *(tmp_path / f"server{s}.pt" for s in range(1, servers))]:
        assert torch.equal(flat_ab(torch.load(path)), final), path


def check_exactly_once(records, steps_per_worker):
    total = sum(steps_per_worker)
    assert [r["update"] for r in records] == list(range(total)), "one server update per push, in order"
    for m, steps in enumerate(steps_per_worker):
        assert [r["step"] for r in records if r["worker"] == m] == list(range(steps))
    last_sent = {}
    for r in records:  # staleness = updates between the weights sent to m and this update
        assert r["staleness"] == r["update"] - last_sent.get(r["worker"], 0)
        last_sent[r["worker"]] = r["update"] + 1


def replay_paper(records, args, workers=WORKERS):
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
    backups = [[p.detach().clone() for p in params] for _ in range(workers)]
    mean_squares = [torch.zeros_like(p) for p in params]
    lambda_0 = {"constant": 0.04, "adaptive": 8.0}.get(args.compensation, 0.0)
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
            factor /= workers
        optimizer.param_groups[0]["lr"] = args.lr * factor
        optimizer.param_groups[1]["lr"] = args.lr * 0.5 * factor
        optimizer.step()
        backups[m] = [p.detach().clone() for p in params]
    return model

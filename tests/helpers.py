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
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from sklearn.datasets import load_digits

from hvd_dcasgd.compensation import Compensation
from hvd_dcasgd.endpoints import open_server
from hvd_dcasgd.launch import local_command
from hvd_dcasgd.layout import ModelLayout
from hvd_dcasgd.mpi import load_mpi
from hvd_dcasgd.process import run_command

# --- jobs ------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
TCP = ("--mca", "btl", "tcp,self", "--mca", "osc", "pt2pt")


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



class Job:
    """One ``mpirun`` of the synthetic program in the background, its output
    in a file, killed (its process group) if it outlives ``timeout``."""

    def __init__(self, out: Path, *args, workers=3, mca=(), env=None, timeout=120, log="log", launcher=False,
                 servers=1):
        self.out, self.timeout, self.ranks = out, timeout, workers + servers
        self.log = out / log
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
        if launcher:  # this project's launcher, as a user runs it
            start = [sys.executable, str(ROOT / "launch" / "hvd-dcasgd-run"), "-n", str(workers)]
        else:
            start = local_command(workers + servers, [], mca)
        cmd = [*start, str(PROGRAMS / "synthetic.py"), "--out", str(out), *map(str, args)]
        self.started = time.monotonic()
        with open(self.log, "w") as log_file:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, what, count=1) -> None:
        """Wait until the output holds ``what`` ``count`` times (or a file ``what`` exists)."""
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

    def pid(self, world_rank: int) -> int:
        return int((self.out / f"pid{world_rank}").read_text())

    def signal_ranks(self, number, ranks=None) -> None:
        for rank in range(self.ranks) if ranks is None else ranks:
            os.kill(self.pid(rank), number)

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


def run_job(out, *args, **kwargs):
    job = Job(out, *args, **kwargs)
    status = job.wait()
    return status, job.text()


# --- the paper's formula ---------------------------------------------------
def paper_compensation(mode, g, w, w_bak, lambda_0, mean_square=None):
    """DC-ASGD's compensated gradient, as the paper writes it: Eq. 10,
    ``g + lambda * g * g * (w - w_bak)``, with lambda_t = lambda_0
    (``constant``) or lambda_0 / sqrt(MeanSquare + eps) (``adaptive``,
    section 6: ``mean_square``, updated in place, with momentum 0.95 and
    eps 1e-7); ``g`` itself for any other mode (ASGD)."""
    if mode == "constant":
        return g + lambda_0 * g * g * (w - w_bak)
    if mode == "adaptive":
        mean_square.mul_(0.95).add_(0.05 * g * g)
        return g + lambda_0 / torch.sqrt(mean_square + 1e-7) * g * g * (w - w_bak)
    return g


# --- a server over COMM_SELF -------------------------------------------------
WORKERS = 3


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
    server = open_server(load_mpi().COMM_SELF, optimizer, layout, comp, num_workers=WORKERS, wire_dtype=wire,
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


def fresh_server(optimizer_name, comp, seed=0, wire=torch.float32):
    torch.manual_seed(seed)
    model = Net()
    if seed:  # a server that starts elsewhere, so a load has something to overwrite
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
    optimizer = OPTIMIZERS[optimizer_name](model)
    layout = ModelLayout.of(optimizer, model.named_parameters(), model)
    return open_server(load_mpi().COMM_SELF, optimizer, layout, comp, num_workers=WORKERS, wire_dtype=wire)


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



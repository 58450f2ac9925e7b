"""The CUDA server path: same weights as the CPU path, and its apply figure.

For a machine with a GPU (under 5 minutes).  For each mode and for a fused
(plain SGD) and a generic (SGD with momentum) optimizer, a CPU server and a
CUDA server -- both on real MPI windows -- apply the same pushes from three
workers; their weights must agree to 1e-5.  Then, where an MPI launcher is
installed, two servers (``HVD_DCASGD_SERVERS=2``) run a real job on the GPU
and on the CPU, each on its own slice; the final weights must agree to 1e-5
(the ``sync`` schedule with three workers, and DC-ASGD-a with one: runs
whose order of updates does not depend on timing).  Then the apply benchmark
runs on the GPU.  Exit status 0 only if every comparison passed.

    python benchmarks/check_cuda.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from common import flat_model, single_rank_server

WORKERS, PUSHES, NUMEL = 3, 12, 1_000_003


def run(device: torch.device, mode: str, momentum: float) -> torch.Tensor:
    torch.manual_seed(0)
    model = flat_model(NUMEL)
    server = single_rank_server(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum), mode,
                                WORKERS, device)
    generator = torch.Generator().manual_seed(1)
    for k in range(PUSHES):
        worker = (k * 7) % WORKERS
        server.messages[worker].gradient.copy_(torch.randn(NUMEL, generator=generator))
        server.messages[worker].lrs.fill_(0.05 / (1 + k))
        if mode == "sync":
            for m in range(WORKERS):
                server.messages[m].gradient.copy_(torch.randn(NUMEL, generator=generator))
            server.apply_round(list(range(WORKERS)))
        else:
            server.apply(worker)
        for m in range(WORKERS):  # every outbox holds what that worker was last sent
            if m == worker or mode == "sync":
                assert torch.equal(server.outboxes[m], server.weights.cpu()), (mode, k, m)
    return server.weights.cpu()


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("check_cuda: no CUDA device visible to torch")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failures = 0
    for mode in ("none", "constant", "adaptive", "sync"):
        for momentum in (0.0, 0.9):
            cpu, cuda = run(torch.device("cpu"), mode, momentum), run(torch.device("cuda"), mode, momentum)
            error = (cpu - cuda).abs().max().item()
            ok = error <= 1e-5
            failures += not ok
            print(f"  {mode:9s} momentum {momentum}: max |cpu - cuda| = {error:.2e}  {'ok' if ok else 'FAIL'}")
    failures += several_servers()
    here = Path(__file__).resolve().parent
    subprocess.run([sys.executable, str(here / "bench_apply.py"), "--device", "cuda"], check=True)
    sys.exit(1 if failures else 0)


def several_servers(devices=("cuda", "cpu")) -> int:
    """Two servers on the GPU against two on the CPU, under the real
    launcher; the number of comparisons that failed."""
    launcher = shutil.which("mpirun") or shutil.which("mpiexec")
    if launcher is None:
        print("  several servers: no mpirun or mpiexec here, not checked")
        return 0
    open_mpi = "Open MPI" in subprocess.run([launcher, "--version"], capture_output=True, text=True).stdout
    root = Path(__file__).resolve().parent.parent
    failures = 0
    for workers, extra in ((3, ["--compensation", "sync"]), (1, ["--compensation", "adaptive", "--momentum", "0.9"])):
        weights = {}
        for device in devices:
            out = Path(tempfile.mkdtemp())
            env = {**os.environ, "HVD_DCASGD_SERVERS": "2", "HVD_DCASGD_SERVER_DEVICE": device,
                   "PYTHONPATH": str(root), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
            cmd = [launcher, *(["--oversubscribe"] if open_mpi else []), "-np", str(workers + 2), sys.executable,
                   str(root / "tests" / "programs" / "synthetic.py"), "--out", str(out), "--steps", "10", *extra]
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            if result.returncode != 0:
                print(f"  several servers, {device}: the job failed\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
                return failures + 1
            state = torch.load(out / "worker0.pt", weights_only=True)
            weights[device] = torch.cat([state["a"].reshape(-1), state["b"].reshape(-1)])
        error = (weights[devices[1]] - weights[devices[0]]).abs().max().item()
        ok = error <= 1e-5
        failures += not ok
        print(f"  two servers, {extra[1]}, {workers} worker(s): max |cpu - cuda| = {error:.2e}  {'ok' if ok else 'FAIL'}")
    return failures


if __name__ == "__main__":
    main()

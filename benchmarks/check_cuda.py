"""The CUDA paths: same weights as the CPU paths, and their figures against their bounds.

For a machine with a GPU (under 10 minutes).  In order:

1. which staging the CUDA server takes, and why (is MPI CUDA-aware?);
2. for each mode and for a plain and a momentum SGD, a CPU server and a CUDA
   server -- both on real MPI windows -- apply the same pushes from three
   workers; their weights must agree to 1e-5 (:data:`TOLERANCE`);
3. the CUDA server's update time for 1M, 25M and 100M parameters against its
   bound measured in the same run: the gradient in and the weights out as
   page-locked copies of the same bytes, the two directions overlapped
   (target: at least 0.8 of the bound);
4. where an MPI launcher is installed, real jobs: two servers on the GPU
   against two on the CPU, and every worker's model on the GPU with the
   server on the CPU and on the GPU, against the same job on the CPU; final
   weights must agree to 1e-5 (the ``sync`` schedule with three workers, and
   DC-ASGD-a with one: runs whose order of updates does not depend on timing);
5. a GPU worker's exchange (gradient device to host, Put, Get, weights host
   to device) against its bound in the same run: a CPU worker's exchange of
   the same model plus page-locked copies of the same bytes each way;
6. the apply benchmark on the GPU.

Exit status 0 only if every comparison passed.  ``--write`` also writes the
output to ``docs/results/check_cuda-<device>.txt`` with the command, date and
machine.

    python benchmarks/check_cuda.py [--write] [--sizes 1000000 25000000 100000000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import flat_model, single_rank_server

WORKERS, PUSHES, NUMEL = 3, 12, 1_000_003
TOLERANCE = 1e-5
LINK_TARGET = 0.8
ROOT = Path(__file__).resolve().parent.parent
LINES = []


def say(line: str) -> None:
    print(line, flush=True)
    LINES.append(line)


def run(device: torch.device, mode: str, momentum: float):
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
    return server.weights.cpu(), server


def _median_cuda(fn, repeats: int = 9) -> float:
    times = []
    for i in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def link_bound(numel: int) -> dict:
    """Page-locked copies of ``numel`` float32 each way, alone and overlapped
    on two streams: seconds."""
    host_in = torch.empty(numel, pin_memory=True).normal_()
    host_out = torch.empty(numel, pin_memory=True)
    device_in, device_out = torch.empty(numel, device="cuda"), torch.randn(numel, device="cuda")
    streams = torch.cuda.Stream(), torch.cuda.Stream()

    def both():
        with torch.cuda.stream(streams[0]):
            device_in.copy_(host_in, non_blocking=True)
        with torch.cuda.stream(streams[1]):
            host_out.copy_(device_out, non_blocking=True)

    return {"in": _median_cuda(lambda: device_in.copy_(host_in, non_blocking=True)),
            "out": _median_cuda(lambda: host_out.copy_(device_out, non_blocking=True)),
            "both": _median_cuda(both)}


def update_against_link(sizes) -> None:
    """The CUDA server's update against its link bound, same run, per size."""
    for numel in sizes:
        bound = link_bound(numel)
        for mode in ("none", "adaptive"):
            model = flat_model(numel)
            server = single_rank_server(model, torch.optim.SGD(model.parameters(), lr=1e-3), mode, 2,
                                        torch.device("cuda"))
            seconds = _median_cuda(lambda: server.apply(0))
            how = "pipelined in chunks" if server.pipelined is not None else f"not pipelined ({server.pipelined_why})"
            say(f"  {numel / 1e6:g}M, {mode:8s}: update {seconds * 1e3:7.2f} ms; bound (page-locked copies, in "
                f"{bound['in'] * 1e3:.2f} ms and out {bound['out'] * 1e3:.2f} ms, overlapped "
                f"{bound['both'] * 1e3:.2f} ms): ratio {bound['both'] / seconds:.2f} (target {LINK_TARGET}); {how}")
            del server, model
            torch.cuda.empty_cache()


def _launcher():
    launcher = shutil.which("mpirun") or shutil.which("mpiexec")
    if launcher is None:
        return None, False
    return launcher, "Open MPI" in subprocess.run([launcher, "--version"], capture_output=True, text=True).stdout


def _job(launcher, open_mpi, ranks, args, env) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           **env}
    cmd = [launcher, *(["--oversubscribe"] if open_mpi else []), "-np", str(ranks), sys.executable, *map(str, args)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def jobs() -> int:
    """Real jobs under the launcher, each against the same job on the CPU;
    the number of comparisons that failed."""
    launcher, open_mpi = _launcher()
    if launcher is None:
        say("  jobs: no mpirun or mpiexec here, not checked")
        return 0
    settings = [  # (what, servers, the server's device, the workers' device)
        ("two servers on the GPU", 2, "cuda", "cpu"),
        ("GPU workers, server on the CPU", 1, "cpu", "cuda"),
        ("GPU workers, server on the GPU", 1, "cuda", "cuda"),
    ]
    failures = 0
    for workers, extra in ((3, ["--compensation", "sync"]), (1, ["--compensation", "adaptive", "--momentum", "0.9"])):
        for what, servers, server_device, worker_device in settings:
            weights = {}
            for label, devices in (("cpu", ("cpu", "cpu")), ("gpu", (server_device, worker_device))):
                out = Path(tempfile.mkdtemp())
                result = _job(launcher, open_mpi, workers + servers,
                              [ROOT / "tests" / "programs" / "synthetic.py", "--out", out, "--steps", 10, *extra,
                               "--worker-device", devices[1]],
                              {"HVD_DCASGD_SERVERS": str(servers), "HVD_DCASGD_SERVER_DEVICE": devices[0]})
                if result.returncode != 0:
                    say(f"  {what}, {extra[1]}: the {label} job failed\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
                    return failures + 1
                state = torch.load(out / "worker0.pt", weights_only=True, map_location="cpu")
                weights[label] = torch.cat([state["a"].reshape(-1), state["b"].reshape(-1)])
            error = (weights["gpu"] - weights["cpu"]).abs().max().item()
            ok = error <= TOLERANCE
            failures += not ok
            say(f"  {what}, {extra[1]}, {workers} worker(s): max |cpu job - this job| = {error:.2e}  "
                f"{'ok' if ok else 'FAIL'}")
    return failures


def exchange_job(args) -> None:
    """Under mpirun -np 2: rank 0 serves on the CPU, rank 1 trains a flat
    model on ``--exchange-device`` and prints, as JSON, its median step()
    (the exchange: nothing else runs) and, on a GPU, page-locked copies of
    the same bytes each way."""
    import hvd_dcasgd as hvd

    hvd.init()
    device = torch.device(args.exchange_device)
    model = flat_model(args.exchange_numel)
    if not hvd.is_server():
        model.to(device)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-6),
                                         named_parameters=model.named_parameters(), compensation="none")
    gradient = torch.randn(args.exchange_numel, device=device) * 1e-3
    times = []
    for i in range(21):
        model.w.grad = gradient
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    figures = {"exchange": statistics.median(times)}
    if device.type == "cuda":
        host = torch.empty(args.exchange_numel, pin_memory=True)
        figures["down"] = _median_cuda(lambda: host.copy_(gradient))
        figures["up"] = _median_cuda(lambda: gradient.copy_(host))
    hvd.shutdown()
    print(json.dumps(figures), flush=True)


def worker_exchange(numel: int = 25_000_000) -> None:
    """A GPU worker's exchange against a CPU worker's plus page-locked copies, same run."""
    launcher, open_mpi = _launcher()
    if launcher is None:
        say("  worker exchange: no mpirun or mpiexec here, not measured")
        return
    figures = {}
    for device in ("cpu", "cuda"):
        result = _job(launcher, open_mpi, 2, [__file__, "--exchange-device", device, "--exchange-numel", numel],
                      {"HVD_DCASGD_SERVER_DEVICE": "cpu"})
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if result.returncode != 0 or not lines:
            say(f"  worker exchange on {device}: the job failed\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
            return
        figures[device] = json.loads(lines[-1])
    gpu, cpu = figures["cuda"], figures["cpu"]["exchange"]
    bound = cpu + gpu["down"] + gpu["up"]
    say(f"  {numel / 1e6:g}M parameters: GPU worker's exchange {gpu['exchange'] * 1e3:.1f} ms; bound {bound * 1e3:.1f} ms "
        f"(CPU worker's exchange {cpu * 1e3:.1f} ms + page-locked copies down {gpu['down'] * 1e3:.1f} ms and up "
        f"{gpu['up'] * 1e3:.1f} ms): ratio {bound / gpu['exchange']:.2f}")


def write_results(argv) -> None:
    """The output under docs/results/, named after the device, headed by the command, date and machine."""
    name = torch.cuda.get_device_name()
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    launcher, _ = _launcher()
    mpi = subprocess.run([launcher, "--version"], capture_output=True, text=True).stdout.splitlines()[0] if launcher \
        else "no MPI launcher"
    head = (f"`python benchmarks/check_cuda.py {' '.join(argv)}` on one {name} ({os.cpu_count()} cores, torch "
            f"{torch.__version__}, {mpi}), {datetime.date.today().isoformat()}:")
    path = ROOT / "docs" / "results" / f"check_cuda-{slug}.txt"
    path.write_text("\n".join([head, "", *LINES]) + "\n")
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 25_000_000, 100_000_000])
    parser.add_argument("--write", action="store_true", help="also write docs/results/check_cuda-<device>.txt")
    parser.add_argument("--exchange-device", help=argparse.SUPPRESS)
    parser.add_argument("--exchange-numel", type=int, default=25_000_000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.exchange_device:
        exchange_job(args)
        return
    if not torch.cuda.is_available():
        sys.exit("check_cuda: no CUDA device visible to torch")
    from hvd_dcasgd.protocol.staging import choose_staging

    say(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    say(f"staging: {' -- '.join(choose_staging(torch.device('cuda')))}")
    failures = 0
    for mode in ("none", "constant", "adaptive", "sync"):
        for momentum in (0.0, 0.9):
            cpu, _ = run(torch.device("cpu"), mode, momentum)
            cuda, server = run(torch.device("cuda"), mode, momentum)
            error = (cpu - cuda).abs().max().item()
            ok = error <= TOLERANCE
            failures += not ok
            how = "pipelined" if server.pipelined is not None else "not pipelined"
            say(f"  {mode:9s} momentum {momentum}: max |cpu - cuda| = {error:.2e}  {'ok' if ok else 'FAIL'} ({how})")
    say("the CUDA server's update against its host link:")
    update_against_link(args.sizes)
    say("jobs (final weights against the same job on the CPU):")
    failures += jobs()
    say("a GPU worker's exchange against its bound:")
    worker_exchange()
    result = subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "bench_apply.py"), "--device",
                             "cuda"], capture_output=True, text=True)
    for line in result.stdout.splitlines():
        say(line)
    failures += result.returncode != 0
    if args.write:
        write_results(sys.argv[1:])
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

"""The evidence, in one command: the paper's Table 1 at CPU scale (simulator
for M = 4, 8, 16 and the real MPI parameter server for M = 4), a lambda_0
sweep, delay models against real staleness, wall-clock and throughput with and
without a straggler, the compensation's cost; tables, plots and
``RESULTS.md``.

    python benchmarks/evidence/run.py            # about 30 minutes on 2 cores
    python benchmarks/evidence/run.py --quick    # a few minutes, fewer epochs and seeds
    python benchmarks/evidence/run.py --out docs # RESULTS.md there, plots and numbers in docs/results/

MPI runs go one at a time (their timings are compared); simulator runs then
share the cores (``--jobs``).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import mean, stdev
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from tasks import TASKS  # noqa: E402

#: The paper's five methods, in its table's order: (key, label).  ``sgd`` is
#: one worker (sequential SGD); the others are compensation modes.
METHODS = [("sgd", "SGD"), ("none", "ASGD"), ("sync", "SSGD"), ("constant", "DC-ASGD-c"), ("adaptive", "DC-ASGD-a")]
LABELS = dict(METHODS, horovod="Horovod allreduce")
ASYNC = ("none", "constant", "adaptive")
DELAY_METHODS = ("none", "adaptive")  # simulated under every delay model


@dataclass(frozen=True)
class Scale:
    """How much of everything to run."""

    tasks: Tuple[str, ...]
    epochs: Optional[int]  # None: each task's own
    seeds: int
    sim_workers: Tuple[int, ...]
    mpi_workers: Tuple[int, ...]
    mpi_seeds: int
    mpi_methods: Tuple[str, ...]
    lambdas: Dict[str, Tuple[float, ...]]  # the sweep, besides each task's default
    delay_models: Tuple[str, ...]  # besides round-robin, compared at the first MPI worker count
    straggler: float  # 0: no straggler runs
    bench: bool  # the server-bound end-to-end benchmark


SCALES = {
    "full": Scale(("digits", "mnist1d"), None, 3, (4, 8, 16), (4,), 3, tuple(m for m, _ in METHODS),
                  {"constant": (0.01, 0.16, 0.64), "adaptive": (0.5, 1.0, 4.0)}, ("random", "heavy-tailed"),
                  3.0, True),
    "quick": Scale(("digits", "mnist1d"), 4, 2, (4, 8), (4,), 1, tuple(m for m, _ in METHODS),
                   {"constant": (0.64,), "adaptive": (0.5,)}, ("random", "heavy-tailed"), 3.0, False),
    # the test suite's end-to-end check: every step, at the smallest size
    "tiny": Scale(("digits",), 2, 1, (2,), (2,), 1, ("adaptive",), {"constant": (0.64,), "adaptive": (0.5,)},
                  ("heavy-tailed",), 0.0, False),
}


# --- simulator runs (in worker processes) -----------------------------------
def simulate_one(job: Dict) -> Dict:
    """One simulator run described by ``job``; returns ``job`` with its results."""
    import torch

    from hvd_dcasgd.compensation import Compensation
    from hvd_dcasgd.simulator import EventDriven, RandomOrder, RoundRobin, TraceOrder, simulate

    torch.set_num_threads(1)
    task = TASKS[job["task"]]
    train, test = task.data(Path(job["cache"]))
    workers, delay = job["workers"], job["delay"]
    models = {"round-robin": RoundRobin, "random": RandomOrder, "heavy-tailed": lambda: EventDriven.heavy_tailed(workers)}
    order = TraceOrder(job["trace"]) if delay == "trace" else models[delay]()
    mode = "none" if job["method"] == "sgd" else job["method"]
    result = simulate(task.model, train, test, compensation=Compensation(mode, job["lambda_0"]), workers=workers,
                      epochs=job["epochs"], batch_size=task.batch_size, lr=lambda e: task.lr_at(e, job["epochs"]),
                      delay=order, seed=job["seed"])
    return {**job, "final_error": result.final_error, "test_errors": result.test_errors,
            "staleness": {str(s): n for s, n in sorted(result.staleness.items())}}


def sim_job(task: str, method: str, workers: int, seed: int, epochs: int, cache: Path, lambda_0=None,
            delay: str = "round-robin", trace: Optional[str] = None) -> Dict:
    lambda_0 = TASKS[task].lambda_0(method) if lambda_0 is None else lambda_0
    return {"source": "simulator", "task": task, "method": method, "workers": 1 if method == "sgd" else workers,
            "seed": seed, "epochs": epochs, "lambda_0": lambda_0, "delay": delay, "trace": trace, "cache": str(cache)}


def run_simulations(jobs: List[Dict], processes: int) -> List[Dict]:
    """Every job, in fresh processes (each its own MPI singleton), in order."""
    with multiprocessing.get_context("spawn").Pool(processes, maxtasksperchild=8) as pool:
        return pool.map(simulate_one, jobs, chunksize=1)


# --- real MPI runs ----------------------------------------------------------
def run_command(cmd: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None) -> Tuple[int, str]:
    """Run ``cmd`` in its own process group; kill the group on timeout."""
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(list(map(str, cmd)), cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -9, out + f"\n(killed after {timeout:.0f} s)"
    return proc.returncode, out


def mpirun(ranks: int, *args) -> List[str]:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "--oversubscribe", "-np", str(ranks), sys.executable, *map(str, args)]


def mpi_run(task: str, method: str, workers: int, seed: int, epochs: int, cache: Path, work: Path,
            straggler: float = 1.0, timeout: float = 900) -> Dict:
    """One real run, ``mpirun -np workers+1``; its result, or why it failed."""
    workers = 1 if method == "sgd" else workers
    name = f"{task}-{method}-M{workers}-s{seed}-x{straggler:g}"
    out, trace = work / f"{name}.json", work / f"{name}.jsonl"
    cmd = mpirun(workers + 1, HERE / "train_mpi.py", "--task", task,
                 "--compensation", "none" if method == "sgd" else method, "--epochs", epochs, "--seed", seed,
                 "--straggler", straggler, "--cache", cache, "--trace", trace, "--out", out)
    started = time.perf_counter()
    code, output = run_command(cmd, timeout)
    record = {"source": "mpi", "task": task, "method": method, "workers": workers, "seed": seed, "epochs": epochs,
              "straggler": straggler, "command": shlex.join(map(str, cmd)), "launch_seconds": time.perf_counter() - started}
    if code != 0 or not out.exists():
        return {**record, "failed": output.strip().splitlines()[-12:]}
    record = {**json.loads(out.read_text()), **record}  # the program calls sequential SGD "none"
    rate = re.search(r"\(([\d.]+) updates/s\)", output)
    record["server_updates_per_s"] = float(rate.group(1)) if rate else None
    if trace.exists() and trace.stat().st_size:
        record["trace"] = str(trace)
        counts: Dict[int, int] = {}
        for line in trace.read_text().splitlines():
            s = json.loads(line)["staleness"]
            counts[s] = counts.get(s, 0) + 1
        record["staleness"] = {str(s): n for s, n in sorted(counts.items())}
    print(f"  {name}: final error {record['final_error']:.4f}, {record['launch_seconds']:.0f} s", flush=True)
    return record


def bench_end_to_end() -> Dict:
    """The server-bound update rate of every mode (benchmarks/bench_end_to_end.py)."""
    cmd = [sys.executable, ROOT / "benchmarks" / "bench_end_to_end.py", "--steps", "150"]
    code, output = run_command(cmd, 900)
    rates = {f"{mode} {variant}".strip(): float(rate)
             for mode, variant, rate in re.findall(r"^\s+(\w+)\s+(.*?)\s*([\d.]+) updates/s", output, re.M)}
    return {"command": shlex.join(map(str, cmd)), "updates_per_s": rates, "output": output.strip().splitlines()}


# --- tables -----------------------------------------------------------------
def select(records: List[Dict], **match) -> List[Dict]:
    return [r for r in records if "failed" not in r and all(r.get(k) == v for k, v in match.items())]


def errors_of(records: List[Dict], **match) -> List[float]:
    return [100 * r["final_error"] for r in select(records, **match)]


def cell(values: List[float]) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{mean(values):.2f} ± {stdev(values):.2f}"


def table(header: Sequence[str], rows: List[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def table1(records: List[Dict], task: str, scale: Scale) -> str:
    rows = []
    for key, source, counts in (("simulator", "simulator", scale.sim_workers), ("mpi", "MPI", scale.mpi_workers)):
        base = {"delay": "round-robin"} if key == "simulator" else {"straggler": 1.0}
        rows.append(["1", source, cell(errors_of(records, source=key, task=task, method="sgd", **base)), "", "", "", ""])
        for workers in counts:
            lambdas = lambda m: {"lambda_0": TASKS[task].lambda_0(m)} if key == "simulator" else {}  # noqa: E731
            rows.append([str(workers), source, "", *[cell(errors_of(records, source=key, task=task, method=m,
                                                                     workers=workers, **base, **lambdas(m)))
                                                     for m, _ in METHODS[1:]]])
    rows.sort(key=lambda r: (int(r[0]), r[1] != "simulator"))
    return table(["M", "run", *[label for _, label in METHODS]], [r for r in rows if any(r[2:])])


def sweep_table(records: List[Dict], task: str, workers: int, lambdas: Dict[str, List[float]]) -> str:
    values = sorted({0.0, *lambdas["constant"], *lambdas["adaptive"]})
    rows = []
    for value in values:
        row = [f"{value:g}"]
        for method in ("constant", "adaptive"):
            method_at = "none" if value == 0 else method
            found = errors_of(records, source="simulator", task=task, workers=workers, delay="round-robin",
                              method=method_at, **({} if value == 0 else {"lambda_0": value}))
            row.append(cell(found) if value == 0 or value in lambdas[method] else "")
        rows.append(row)
    return table(["lambda_0", "DC-ASGD-c", "DC-ASGD-a"], rows)


def delay_table(records: List[Dict], task: str, workers: int, delays: Sequence[str]) -> str:
    rows = []
    for delay in ("round-robin", *delays):
        found = select(records, source="simulator", task=task, workers=workers, delay=delay, method="none")
        stale = [mean_staleness(r) for r in found]
        rows.append([f"simulator, {delay}", f"{mean(stale):.2f}" if stale else "",
                     *[cell(errors_of(records, source="simulator", task=task, workers=workers, delay=delay,
                                      method=m, lambda_0=TASKS[task].lambda_0(m))) for m in DELAY_METHODS]])
    real = [r for r in select(records, source="mpi", task=task, workers=workers, straggler=1.0) if r["method"] in ASYNC]
    rows.append(["real MPI runs", f"{mean(mean_staleness(r) for r in real):.2f}" if real else "",
                 *[cell(errors_of(records, source="mpi", task=task, workers=workers, method=m, straggler=1.0))
                   for m in DELAY_METHODS]])
    return table(["order of pushes", "mean staleness", *[LABELS[m] for m in DELAY_METHODS]], rows)


def mean_staleness(record: Dict) -> float:
    counts = {int(s): n for s, n in record.get("staleness", {}).items()}
    return sum(s * n for s, n in counts.items()) / max(1, sum(counts.values()))


def replay_table(records: List[Dict], task: str) -> Tuple[str, float]:
    rows, gaps = [], []
    for real in select(records, source="mpi", task=task, straggler=1.0):
        replay = select(records, source="simulator", delay="trace", trace=real.get("trace"))
        if real["method"] in ASYNC and replay:
            gap = 100 * abs(real["final_error"] - replay[0]["final_error"])
            gaps.append(gap)
            rows.append([LABELS[real["method"]], real["workers"], real["seed"], f"{100 * real['final_error']:.2f}",
                         f"{100 * replay[0]['final_error']:.2f}", f"{gap:.2f}"])
    return table(["method", "M", "seed", "real run", "simulator on its trace", "difference"], rows), max(gaps, default=math.nan)


def first_time_below(curve: List[List[float]], target: float) -> Optional[float]:
    return next((seconds for _, seconds, error in curve if error <= target), None)


def wallclock_rows(records: List[Dict], task: str, workers: int) -> List[Dict]:
    """Seed-0 runs of ``task`` at ``workers`` workers (and sequential SGD),
    with and without the straggler: what the wall-clock table shows."""
    rows = []
    for straggler in sorted({r["straggler"] for r in select(records, source="mpi", task=task)}):
        for method in ("sgd", "none", "constant", "adaptive", "sync", "horovod"):
            found = [r for r in records if r["source"] == "mpi" and r["task"] == task and r["method"] == method
                     and r["seed"] == 0 and r["straggler"] == straggler and r["workers"] in (1, workers)]
            if found and not (method == "sgd" and straggler != 1.0):
                rows.append(found[0])
    return rows


def wallclock_table(rows: List[Dict], task: str) -> str:
    target = TASKS[task].target_error
    base = {r["straggler"]: r for r in rows if r["method"] == "none" and "failed" not in r}
    out = []
    for r in rows:
        label = f"{LABELS[r['method']]}" + (f", M={r['workers']}" if r["method"] != "sgd" else ", M=1")
        if "failed" in r:
            out.append([label, f"{r['straggler']:g}", "failed: " + (r["failed"][-1] if r["failed"] else "?"), "", "", "", "", ""])
            continue
        seconds = max(s for _, s in r["per_worker"])
        samples = sum(n for n, _ in r["per_worker"])
        while_training = sum(n / s for n, s in r["per_worker"])
        reach = first_time_below(r["curve"], target)
        ref = base.get(r["straggler"])
        ratio = ""
        if ref is not None:
            ref_rate = sum(n for n, _ in ref["per_worker"]) / max(s for _, s in ref["per_worker"])
            ratio = f"{samples / seconds / ref_rate:.2f}"
        out.append([label, f"{r['straggler']:g}", f"{seconds:.1f}", f"{samples / seconds:.0f}", ratio,
                    f"{while_training:.0f}", f"{reach:.1f}" if reach is not None else "not reached",
                    f"{100 * r['final_error']:.2f}"])
    return table(["method", "straggler", "job seconds", "samples/s", "samples/s vs ASGD", "sum of workers' samples/s",
                  f"seconds to {100 * target:.0f}% error", "final error %"], out)


# --- plots --------------------------------------------------------------------
def plots(records: List[Dict], scale: Scale, out: Path) -> List[str]:
    """Every figure, as PNGs in ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    colors = {"sgd": "black", "none": "tab:red", "sync": "tab:orange", "constant": "tab:blue", "adaptive": "tab:green",
              "horovod": "tab:purple"}
    for task in scale.tasks:
        panels = [("simulator", w) for w in scale.sim_workers] + [("mpi", w) for w in scale.mpi_workers]
        fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
        for ax, (source, workers) in zip(axes[0], panels):
            for method, label in METHODS:
                if source == "simulator":
                    found = select(records, source=source, task=task, method=method, delay="round-robin",
                                   workers=1 if method == "sgd" else workers, lambda_0=TASKS[task].lambda_0(method))
                    curves = [r["test_errors"] for r in found]
                else:
                    found = select(records, source=source, task=task, method=method, straggler=1.0,
                                   workers=1 if method == "sgd" else workers)
                    curves = [[e for _, _, e in r["curve"]] for r in found]
                if curves:
                    length = min(map(len, curves))
                    ys = [100 * mean(c[i] for c in curves) for i in range(length)]
                    ax.plot(range(1, length + 1), ys, color=colors[method], label=label,
                            linestyle="--" if method == "sgd" else "-")
            label_axes(ax, f"{task}, {'simulator' if source == 'simulator' else 'real MPI'}, M={workers}",
                       "epoch", "test error %")
        names.append(save(fig, out, f"error_vs_epoch_{task}.png", legend_on=[axes[0][0]]))

        stragglers = sorted({r["straggler"] for r in select(records, source="mpi", task=task)})
        if stragglers:
            fig, axes = plt.subplots(1, len(stragglers), figsize=(5.5 * len(stragglers), 3.6), squeeze=False)
            for ax, straggler in zip(axes[0], stragglers):
                for r in wallclock_rows(records, task, scale.mpi_workers[0]):
                    if r["straggler"] == straggler and "failed" not in r:
                        xs = [0.0] + [s for _, s, _ in r["curve"]]
                        ys = [100 * 0.9] + [100 * e for _, _, e in r["curve"]]
                        ax.plot(xs, ys, color=colors[r["method"]], label=LABELS[r["method"]],
                                linestyle="--" if r["method"] == "sgd" else "-", marker=".")
                label_axes(ax, f"{task}, real MPI, M={scale.mpi_workers[0]}"
                           + (f", one worker {straggler:g}x slower" if straggler != 1.0 else ""),
                           "wall-clock seconds", "test error %")
            names.append(save(fig, out, f"error_vs_seconds_{task}.png", legend_on=[axes[0][0]]))

    fig, axes = plt.subplots(1, len(scale.tasks), figsize=(5.5 * len(scale.tasks), 3.6), squeeze=False)
    workers = scale.mpi_workers[0]
    for ax, task in zip(axes[0], scale.tasks):
        sources = [("real MPI runs", select(records, source="mpi", task=task, workers=workers, straggler=1.0))]
        sources += [(f"simulator, {d}", select(records, source="simulator", task=task, workers=workers, delay=d,
                                                method="none")) for d in ("round-robin", *scale.delay_models)]
        for label, found in sources:
            counts: Dict[int, int] = {}
            for r in found:
                if r["method"] in ASYNC:
                    for s, n in r.get("staleness", {}).items():
                        counts[int(s)] = counts.get(int(s), 0) + n
            if counts:
                total = sum(counts.values())
                xs = sorted(counts)
                ax.plot(xs, [counts[x] / total for x in xs], marker="o", markersize=3, label=label)
        label_axes(ax, f"{task}: staleness of applied gradients, M={workers}", "staleness (server updates)",
                   "fraction of gradients")
        ax.set_xlim(-0.5, 4 * workers)
    names.append(save(fig, out, "staleness.png", legend_on=axes[0]))

    sweep_workers = sweep_size(scale)
    fig, axes = plt.subplots(1, len(scale.tasks), figsize=(5 * len(scale.tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], scale.tasks):
        asgd = errors_of(records, source="simulator", task=task, workers=sweep_workers, delay="round-robin", method="none")
        if asgd:
            ax.axhline(mean(asgd), color=colors["none"], linestyle=":", label="ASGD (lambda_0 = 0)")
        for method in ("constant", "adaptive"):
            values = sorted({TASKS[task].lambda_0(method), *scale.lambdas[method]})
            points = [(v, errors_of(records, source="simulator", task=task, workers=sweep_workers,
                                    delay="round-robin", method=method, lambda_0=v)) for v in values]
            points = [(v, e) for v, e in points if e]
            ax.errorbar([v for v, _ in points], [mean(e) for _, e in points],
                        yerr=[stdev(e) if len(e) > 1 else 0 for _, e in points], marker="o", capsize=3,
                        color=colors[method], label=LABELS[method])
        ax.set_xscale("log")
        label_axes(ax, f"{task}, simulator, M={sweep_workers}", "lambda_0", "final test error %")
    names.append(save(fig, out, "lambda_sweep.png", legend_on=axes[0]))
    return names


def label_axes(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def save(fig, out: Path, name: str, legend_on) -> str:
    """Legends on the axes ``legend_on``, then the figure as ``out/name``; returns ``name``."""
    import matplotlib.pyplot as plt

    for ax in legend_on:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def sweep_size(scale: Scale) -> int:
    """The lambda sweep's worker count: 8 where the table has it."""
    return 8 if 8 in scale.sim_workers else scale.sim_workers[-1]


# --- the reading ----------------------------------------------------------------
def reading(records: List[Dict], scale: Scale) -> List[str]:
    """Sentences computed from the numbers: which of the paper's claims hold here."""
    lines = []
    for task in scale.tasks:
        sgd = errors_of(records, source="simulator", task=task, method="sgd", delay="round-robin")
        gaps = []
        for workers in scale.sim_workers:
            means = {m: mean(e) for m, _ in METHODS[1:]
                     if (e := errors_of(records, source="simulator", task=task, method=m, workers=workers,
                                        delay="round-robin", lambda_0=TASKS[task].lambda_0(m)))}
            if len(means) < 4:
                continue
            spread = {m: stdev(e) if len(e) > 1 else 0.0 for m in means
                      for e in [errors_of(records, source="simulator", task=task, method=m, workers=workers,
                                          delay="round-robin", lambda_0=TASKS[task].lambda_0(m))]}
            ranking = ", ".join(f"{LABELS[m]} {v:.2f}" for m, v in sorted(means.items(), key=lambda kv: kv[1]))
            holds = means["adaptive"] <= means["constant"] <= min(means["none"], means["sync"])
            gain = means["none"] - means["adaptive"]
            within = abs(gain) <= max(spread["none"], spread["adaptive"])
            lines.append(f"- **{task}, M={workers} (simulator)**, best first: {ranking} (sequential SGD {mean(sgd):.2f}). "
                         f"The paper's order DC-ASGD-a <= DC-ASGD-c <= ASGD, SSGD **{'holds' if holds else 'does not hold'}**. "
                         f"ASGD minus DC-ASGD-a: {gain:+.2f} points"
                         + (" (within the seed-to-seed standard deviation)" if within else "")
                         + f"; DC-ASGD-a minus sequential SGD: {means['adaptive'] - mean(sgd):+.2f}.")
            gaps.append((workers, means["none"] - means["adaptive"]))
        if len(gaps) > 1:
            grows = all(b[1] > a[1] for a, b in zip(gaps, gaps[1:]))
            lines.append(f"- **{task}**: the ASGD - DC-ASGD-a gap by M is "
                         + ", ".join(f"{g:+.2f} (M={w})" for w, g in gaps)
                         + f": it **{'grows' if grows else 'does not grow steadily'}** with M.")
        for workers in scale.mpi_workers:
            pairs = []
            for method, _ in METHODS[1:]:
                sim = errors_of(records, source="simulator", task=task, method=method, workers=workers,
                                delay="round-robin", lambda_0=TASKS[task].lambda_0(method))
                real = errors_of(records, source="mpi", task=task, method=method, workers=workers, straggler=1.0)
                if sim and real:
                    pairs.append(f"{LABELS[method]} {mean(real) - mean(sim):+.2f}")
            if pairs:
                lines.append(f"- **{task}, M={workers}, real MPI minus simulator (round-robin)**: " + ", ".join(pairs)
                             + " points.")
    return lines


def wallclock_reading(rows: List[Dict]) -> List[str]:
    lines = []
    rate = {(r["method"], r["straggler"]): sum(n for n, _ in r["per_worker"]) / max(s for _, s in r["per_worker"])
            for r in rows if "failed" not in r}
    sgd = rate.get(("sgd", 1.0))
    if sgd:
        lines.append("- Speed-up in samples/s over sequential SGD, no straggler: " + ", ".join(
            f"{LABELS[m]} {v / sgd:.2f}x" for (m, s), v in rate.items() if s == 1.0 and m != "sgd")
            + f" (every process -- the server and the workers -- shares the machine's {os.cpu_count()} cores).")
    stragglers = sorted({s for _, s in rate} - {1.0})
    seconds = [max(s for _, s in r["per_worker"]) for r in rows if "failed" not in r]
    for s in stragglers:
        kept = {m: rate[(m, s)] / rate[(m, 1.0)] for m in ("none", "constant", "adaptive", "sync", "horovod")
                if (m, s) in rate and (m, 1.0) in rate}
        lines.append(f"- With one worker {s:g}x slower, the fraction of its own samples/s each method keeps: "
                     + ", ".join(f"{LABELS[m]} {v:.2f}" for m, v in kept.items())
                     + ". Every worker trains the same number of epochs, so the job ends when the straggler does, "
                     f"whatever the method. These runs last {min(seconds):.1f} to {max(seconds):.1f} s on "
                     f"{os.cpu_count()} cores that every process shares, so run-to-run noise is as large as these "
                     "differences" + (" (a fraction above 1 can only be noise)" if max(kept.values(), default=0) > 1
                                      else "")
                     + ": they show that each method runs with a straggler, not which one copes best; the delay "
                     "models above compare the methods under controlled delays.")
    return lines


# --- the run ------------------------------------------------------------------
def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description="Reproduce the paper's comparison at CPU scale.")
    parser.add_argument("--quick", action="store_true", help="a few minutes: 4 epochs, 2 seeds, M = 4 and 8")
    parser.add_argument("--scale", choices=sorted(SCALES), default=None, help="full (default), quick, or tiny (tests)")
    parser.add_argument("--out", default="docs", help="RESULTS.md here, plots and numbers in OUT/results")
    parser.add_argument("--work", default="build/evidence", help="data cache, traces and per-run files")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulator processes")
    parser.add_argument("--mpi-seeds", type=int, default=None, help="seeds of the real runs (default: the scale's)")
    args = parser.parse_args()
    scale_name = args.scale or ("quick" if args.quick else "full")
    scale = SCALES[scale_name]
    if args.mpi_seeds is not None:
        scale = replace(scale, mpi_seeds=args.mpi_seeds)
    out, work = Path(args.out), Path(args.work)
    figures = out / "results"
    figures.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "data"
    started, load_before = time.time(), os.getloadavg()
    for task in scale.tasks:
        TASKS[task].data(cache)

    # real runs whose timings are reported go one at a time; the others share the cores with the simulator
    timed, untimed = [], []
    for task in scale.tasks:
        epochs = scale.epochs or TASKS[task].epochs
        for workers in scale.mpi_workers:
            for seed in range(scale.mpi_seeds):
                for method in scale.mpi_methods:
                    if method != "sgd" or workers == scale.mpi_workers[0]:
                        wallclock = scale.straggler and (task, workers, seed) == (scale.tasks[0], scale.mpi_workers[0], 0)
                        (timed if wallclock else untimed).append(dict(task=task, method=method, workers=workers,
                                                                      seed=seed, epochs=epochs))
    if scale.straggler:
        task, epochs = scale.tasks[0], scale.epochs or TASKS[scale.tasks[0]].epochs
        timed.append(dict(task=task, method="horovod", workers=scale.mpi_workers[0], seed=0, epochs=epochs))
        timed += [dict(task=task, method=m, workers=scale.mpi_workers[0], seed=0, epochs=epochs,
                       straggler=scale.straggler) for m in ("none", "constant", "adaptive", "sync", "horovod")]
    print(f"{len(timed)} real MPI runs timed for wall-clock, one at a time", flush=True)
    records: List[Dict] = [mpi_run(**run, cache=cache, work=work) for run in timed]
    bench = bench_end_to_end() if scale.bench else None
    timed_seconds = time.time() - started

    jobs = []
    for task in scale.tasks:
        epochs = scale.epochs or TASKS[task].epochs
        for seed in range(scale.seeds):
            jobs.append(sim_job(task, "sgd", 1, seed, epochs, cache))
            for workers in scale.sim_workers:
                jobs += [sim_job(task, m, workers, seed, epochs, cache) for m, _ in METHODS[1:]]
            for method, values in scale.lambdas.items():
                jobs += [sim_job(task, method, sweep_size(scale), seed, epochs, cache, lambda_0=v) for v in values]
            for delay in scale.delay_models:
                jobs += [sim_job(task, m, scale.mpi_workers[0], seed, epochs, cache, delay=delay)
                         for m in DELAY_METHODS]
    print(f"{len(untimed)} more real MPI runs, alongside {len(jobs)} simulator runs on {args.jobs} processes", flush=True)
    with ThreadPoolExecutor(1) as thread:
        background = thread.submit(lambda: [mpi_run(**run, cache=cache, work=work) for run in untimed])
        simulated = run_simulations(jobs, args.jobs)
        records += background.result() + simulated
    replays = [sim_job(r["task"], r["method"], r["workers"], r["seed"], r["epochs"], cache, delay="trace",
                       trace=r["trace"]) for r in records
               if r["source"] == "mpi" and r["method"] in ASYNC and r.get("trace") and r["straggler"] == 1.0]
    print(f"{len(replays)} simulator replays of real runs' traces", flush=True)
    records += run_simulations(replays, args.jobs)
    total_seconds = time.time() - started

    (figures / "evidence.json").write_text(json.dumps({"scale": scale_name, "records": records, "bench": bench},
                                                      indent=1))
    names = plots(records, scale, figures)
    write_results(out, scale_name, scale, records, bench, names, total_seconds, timed_seconds, load_before, cache)
    print(f"wrote {out / 'RESULTS.md'} and {len(names)} plots in {total_seconds / 60:.1f} min", flush=True)


def write_results(out: Path, scale_name: str, scale: Scale, records: List[Dict], bench: Optional[Dict],
                  figures: List[str], total_seconds: float, timed_seconds: float, load_before, cache: Path) -> None:
    command = "python benchmarks/evidence/run.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    load_after = os.getloadavg()
    failed = [r for r in records if "failed" in r]
    text = [
        "# Results: DC-ASGD at CPU scale",
        "",
        f"Generated by `{command.strip()}` ({scale_name} scale) in {total_seconds / 60:.1f} minutes "
        f"({timed_seconds / 60:.1f} of them the real runs whose timings are reported, one at a time; the other "
        "real runs shared the cores with the simulator runs, which changes their order of pushes as any load "
        "would, and nothing else).",
        f"Machine: {machine()}. Load average (1, 5, 15 min) before the run "
        f"{', '.join(f'{x:.1f}' for x in load_before)}, after {', '.join(f'{x:.1f}' for x in load_after)}"
        + (": the machine was shared with other work during the run, so absolute timings are noisy; "
           "ratios come from runs made minutes apart." if max(load_before + load_after) > (os.cpu_count() or 1)
           else "."),
        "",
        "Quick and tiny scales run fewer epochs and seeds than the full one: their numbers show the shape of "
        "the comparison, not converged errors." if scale_name != "full" else "",
        "",
        "## Set-up",
        "",
        "Methods as in the paper: sequential SGD (one worker), ASGD (`none`), SSGD (`sync`: the server averages "
        "one gradient of every worker per update), DC-ASGD-c (`constant`) and DC-ASGD-a (`adaptive`, MeanSquare "
        "momentum 0.95, eps 1e-7). Every method trains the same model from the same initial weights, "
        "with plain SGD (no momentum, no weight decay) on the server, the same epochs and the same step schedule "
        "(learning rate / 10 at 50% and 75% of the epochs, each worker sending the rate of its own epoch). "
        "Worker m trains on the shard m, m+M, ... of the training set, reshuffled every epoch "
        "(`hvd_dcasgd.simulator.worker_batches`); an epoch is one pass over the training set by all workers together.",
        "",
        table(["task", "data", "model", "epochs", "batch per worker", "lr", "lambda_0 (c / a)"], [
            [t, "{} train / {} test".format(*(len(part[1]) for part in TASKS[t].data(cache))),
             TASKS[t].model.__name__, scale.epochs or TASKS[t].epochs, TASKS[t].batch_size, TASKS[t].lr,
             f"{TASKS[t].lambda_constant:g} / {TASKS[t].lambda_adaptive:g}"] for t in scale.tasks]),
        "",
        "digits is scikit-learn's 1,797 real 8x8 handwritten digits (fixed 80/20 split); mnist1d is MNIST-1D "
        "generated by the `mnist1d` package with its default arguments (no download). The models are in "
        "`benchmarks/evidence/tasks.py`; lambda_0 are the paper's CIFAR-10 values.",
        "",
        "The simulator (`hvd_dcasgd.simulator.simulate`) runs M virtual workers in one process against the "
        "project's own `ParameterServer` on MPI windows of one rank; its delay model decides whose push the "
        "server applies next. Table 1 uses round-robin (every gradient M-1 updates stale, the paper's analysis). "
        "Real rows are `mpirun -np M+1 python benchmarks/evidence/train_mpi.py` (rank 0 the server), on the "
        "same batches.",
        "",
        "## Table 1 at CPU scale: final test error (%), mean ± std over seeds",
        "",
        f"Simulator: {scale.seeds} seeds; real MPI runs: {scale.mpi_seeds} seed(s). Paper (CIFAR-10, ResNet-20): "
        "M=4 ASGD 9.27, SSGD 9.17, DC-ASGD-c 8.67, DC-ASGD-a 8.19; M=8 10.26, 10.10, 9.27, 8.57; sequential 8.65.",
        "",
    ]
    for task in scale.tasks:
        text += [f"### {task}", "", table1(records, task, scale), "", f"![error vs epoch](results/error_vs_epoch_{task}.png)", ""]
    text += ["### Reading, computed from the numbers above", "", *reading(records, scale), ""]

    text += ["## lambda_0 sweep (simulator, round-robin)", ""]
    for task in scale.tasks:
        text += [f"### {task}, M={sweep_size(scale)}", "", sweep_table(records, task, sweep_size(scale), {
            m: sorted({TASKS[task].lambda_0(m), *v}) for m, v in scale.lambdas.items()}), ""]
    text += ["![lambda sweep](results/lambda_sweep.png)", ""]

    workers = scale.mpi_workers[0]
    text += ["## Delay models against the real system", "",
             f"Final test error (%) at M={workers} when the server takes the pushes in the order of each delay model "
             "(heavy-tailed: a quarter of the workers 3x slower, log-normal jitter of width 1), and in the real runs.", ""]
    for task in scale.tasks:
        text += [f"### {task}", "", delay_table(records, task, workers, scale.delay_models), ""]
    text += ["![staleness](results/staleness.png)", "",
             "The simulator replaying a real run's trace (`TraceOrder`) on the same batches and initial weights:", ""]
    for task in scale.tasks:
        replay, worst = replay_table(records, task)
        text += [f"### {task}", "", replay, "",
                 f"Largest difference: {worst:.2f} points." if not math.isnan(worst) else "", ""]

    text += ["## Wall-clock and throughput (real MPI runs, one each)", ""]
    for task in scale.tasks:
        rows = wallclock_rows(records, task, workers)
        if not any(r["straggler"] != 1.0 for r in rows) and task != scale.tasks[0]:
            continue
        text += [f"### {task}, M={workers}", "", wallclock_table(rows, task), "",
                 "samples/s: all workers' samples over the job's time (until the last worker finishes). "
                 "Sum of workers' samples/s: each worker's samples over its own training time. "
                 f"Seconds to the target: the first of worker 0's evaluations (after each of its epochs) at or "
                 "below it. The straggler is the last worker: after each step it sleeps (factor - 1) times "
                 "that step's measured compute.", "", *wallclock_reading(rows), "",
                 f"![error vs seconds](results/error_vs_seconds_{task}.png)", ""]

    text += ["## The compensation's cost", ""]
    rates = {r["method"]: r.get("server_updates_per_s") for r in wallclock_rows(records, scale.tasks[0], workers)
             if "failed" not in r and r["straggler"] == 1.0 and r["method"] in ASYNC}
    if rates.get("none") and rates.get("adaptive"):
        text.append(f"- The timed {scale.tasks[0]} runs above, M={workers}: server updates/s "
                    + ", ".join(f"{LABELS[m]} {v:.1f}" for m, v in rates.items())
                    + f" (DC-ASGD-a / ASGD {rates['adaptive'] / rates['none']:.2f}); there the workers' compute, "
                    "not the server, sets the rate.")
    if bench and bench["updates_per_s"]:
        rates = bench["updates_per_s"]
        text += [f"- Server-bound (`{bench['command'].replace(str(ROOT) + '/', '')}`: 4 workers push precomputed "
                 "gradients of a 1M-parameter model as fast as the server answers), updates/s and ratio to ASGD "
                 "(`none`) in the same setting: "
                 + ", ".join(f"{m} {v:.1f} ({v / rates['none' + m[len(m.split()[0]):]]:.2f})"
                             for m, v in rates.items()) + "."]
    text += ["", "## Runs that failed", ""]
    text += [f"- {r['task']} {LABELS[r['method']]} M={r['workers']} seed {r['seed']} straggler {r['straggler']:g}: "
             f"`{r['command']}` ended with: {' / '.join(r['failed'][-3:])}" for r in failed] or ["None."]
    text += ["", "## Commands", "", "```bash",
             "python benchmarks/evidence/run.py            # this page, full scale",
             "python benchmarks/evidence/run.py --quick    # a few minutes",
             ".venv/bin/python -m pytest -q tests/test_simulator.py tests/test_evidence.py",
             "```", "", "Every real run's command line and result are in `results/evidence.json`."]
    (out / "RESULTS.md").write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    main()

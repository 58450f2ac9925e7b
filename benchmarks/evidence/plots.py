"""The evidence's figures, drawn from the records alone (``report.py`` calls
``plots``): error against epochs and against virtual time, the recovery
ratio against M, the staleness of applied gradients (simulated and real), the
tuning sweeps.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Dict, List

import claims
from plan import ASYNC, LABELS, METHODS, TUNING_SEEDS, Scale, key_of, simulator_spec
from records import by_seed, select
from stats import paired_difference, recovery_ratio

COLORS = {"sgd": "black", "none": "tab:red", "constant": "tab:blue", "adaptive": "tab:green",
          "staleness": "tab:brown", "gap_aware": "tab:cyan", "ssgd": "tab:orange", "horovod": "tab:purple",
          "ssgd_paper": "tab:gray"}


def plots(records: List[Dict], scale: Scale, out: Path) -> List[str]:
    """Every figure, as PNGs in ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    task = scale.tasks[0]
    return [curves(records, scale, task, "event", out, f"error_vs_epoch_{task}.png"),
            *([curves(records, scale, task, "one-slow", out, f"error_vs_time_{task}.png")] if scale.slow_methods else []),
            recovery(records, scale, task, out),
            *([staleness(records, scale, task, out)] if scale.mpi_seeds and scale.mpi_methods else []),
            sweep(records, scale, task, out)]


def curves(records: List[Dict], scale: Scale, task: str, delay: str, out: Path, name: str) -> str:
    """Mean test error after each (virtual) epoch, one panel per M."""
    import matplotlib.pyplot as plt

    methods = scale.main_methods if delay == "event" else scale.slow_methods
    fig, axes = plt.subplots(1, len(scale.workers), figsize=(4 * len(scale.workers), 3.4), squeeze=False)
    for ax, workers in zip(axes[0], scale.workers):
        for method in methods:
            found = [r for r in select(records, source="simulator", task=task, method=method, delay=delay,
                                       split="test", workers=1 if method == "sgd" else workers)
                     if not r.get("diverged")]
            if not found:
                continue
            n = min(len(r["test_errors"]) for r in found)
            x = [mean(r["times"][i] for r in found) for i in range(n)] if delay == "one-slow" else range(1, n + 1)
            ax.plot(list(x), [100 * mean(r["test_errors"][i] for r in found) for i in range(n)],
                    color=COLORS[method], label=LABELS[method])
        label_axes(ax, f"{task}, M={workers}, {delay}",
                   "virtual time (a step = 1)" if delay == "one-slow" else "epoch", "test error %")
        ax.set_yscale("log")
    return save(fig, out, name, legend_on=axes[0][:1])


def recovery(records: List[Dict], scale: Scale, task: str, out: Path) -> str:
    """The recovery ratio against M, with its bootstrap interval."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for method in ("adaptive", "constant", "gap_aware", "staleness"):
        points = []
        for workers in scale.workers:
            runs = [by_seed(records, source="simulator", task=task, method=m, delay="event", split="test",
                            workers=1 if m == "sgd" else workers) for m in ("none", method, "sgd")]
            seeds = sorted(set(runs[0]) & set(runs[1]) & set(runs[2]))
            if len(seeds) >= 2 and penalty_shown([runs[0][s] for s in seeds], [runs[2][s] for s in seeds]):
                r = recovery_ratio(*([run[s] for s in seeds] for run in runs))
                points.append((workers, r.value, r.interval))
        if points:
            ax.errorbar([p[0] for p in points], [p[1] for p in points],
                        yerr=[[p[1] - p[2][0] for p in points], [p[2][1] - p[1] for p in points]],
                        color=COLORS[method], label=LABELS[method], marker="o", capsize=3)
    ax.axhline(0, color="gray", lw=0.8)  # only where ASGD's penalty over SGD is shown
    ax.axhline(1, color="gray", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    label_axes(ax, f"{task}: share of ASGD's loss recovered", "M", "R")
    return save(fig, out, "recovery_ratio.png", legend_on=[ax])


def penalty_shown(asgd: List[float], sgd: List[float]) -> bool:
    """Whether ASGD's penalty over SGD is shown (the rules of ``claims``)."""
    d = paired_difference(asgd, sgd)
    return claims.penalty_shown(d.t_interval, d.mean)


def staleness(records: List[Dict], scale: Scale, task: str, out: Path) -> str:
    """Distribution of the staleness of applied gradients at the real runs'
    M: event-driven simulator against the real system."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    workers = scale.mpi_workers
    for label, found, style in (
            ("simulator, event-driven", select(records, source="simulator", task=task, method="none", delay="event",
                                                 split="test", workers=workers), "-"),
            ("simulator, round-robin", select(records, source="simulator", task=task, method="none",
                                               delay="round-robin", workers=workers), ":"),
            ("real MPI", [r for r in select(records, source="mpi", task=task, workers=workers, step_time=0.0)
                          if r["method"] in ASYNC], "--")):
        counts: Dict[int, int] = {}
        for r in found:
            for s, n in r.get("staleness", {}).items():
                counts[int(s)] = counts.get(int(s), 0) + n
        total = sum(counts.values())
        if total:
            xs = sorted(counts)
            ax.plot(xs, [counts[s] / total for s in xs], style, marker="o", label=label)
    label_axes(ax, f"{task}, M={workers}: staleness of applied gradients", "staleness (updates)", "share")
    return save(fig, out, "staleness.png", legend_on=[ax])


def sweep(records: List[Dict], scale: Scale, task: str, out: Path) -> str:
    """Validation error against each tuned method's value, per tuning M."""
    import matplotlib.pyplot as plt

    tuned = [m for m in scale.main_methods if METHODS[m].grid]
    fig, axes = plt.subplots(1, max(1, len(tuned)), figsize=(4 * max(1, len(tuned)), 3.4), squeeze=False)
    by_key = {r["key"]: r for r in records if "failed" not in r}

    for ax, method in zip(axes[0], tuned):
        for workers in scale.tune_workers:
            xs, ys = [], []
            for value in METHODS[method].grid:
                found = [by_key.get(key_of(simulator_spec(task, method, workers, seed, scale.epochs_of(task),
                                                          split="validation", value=value, lr=scale.lr)))
                         for seed in TUNING_SEEDS]
                if all(found):
                    xs.append(value)
                    ys.append(100 * mean(r["final_error"] for r in found))
            if xs:
                ax.plot(xs, ys, marker="o", label=f"M={workers}")
        ax.set_xscale("log")
        label_axes(ax, f"{task}: {LABELS[method]}", METHODS[method].tuned + (" (multiplier k, capped at M)"
                   if METHODS[method].tuned == "scale" else ""), "validation error %")
    return save(fig, out, "lambda_sweep.png", legend_on=axes[0])


def label_axes(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def save(fig, out: Path, name: str, legend_on) -> str:
    """Legends on the axes ``legend_on``, then the figure as ``out/name``; returns ``name``."""
    import matplotlib.pyplot as plt

    for ax in legend_on:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name

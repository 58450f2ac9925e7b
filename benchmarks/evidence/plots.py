"""The evidence's figures, drawn from the records alone (``report.py`` calls
``plots``): error against epoch and against wall-clock seconds, the staleness
of applied gradients, the lambda_0 sweep.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean, stdev
from typing import Dict, List

from plan import ASYNC, LABELS, METHODS, Scale
from records import errors_of, select, wallclock_rows
from tasks import TASKS


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

    sweep_workers = scale.sweep_workers
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

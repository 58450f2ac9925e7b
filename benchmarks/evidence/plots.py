"""The evidence's figures, drawn from the records alone (``report.py`` calls
``plots``): validation error against the rate for every method and M (every
tuning cell at the chosen constants), and test error against epochs.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import List

from plan import CHANCE_ERROR, LABELS, itt_error

COLORS = {"sgd": "black", "none": "tab:red", "adaptive": "tab:green", "adaptive_paper": "tab:olive",
          "gap_aware": "tab:cyan", "ssgd": "tab:orange", "horovod": "tab:purple", "adaptive@default": "tab:green",
          "gap_aware@default": "tab:cyan"}


def plots(report, out: Path) -> List[str]:
    """Every figure, as PNGs in ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    return [tuning(report, out), curves(report, out)]


def tuning(report, out: Path) -> str:
    """Mean validation error over the tuning seeds against the rate, at each method's chosen constants (its
    best cell's, while tuning goes on), one panel per M; a rate where a tuning seed did not train is an x at
    chance; the choice is circled."""
    import matplotlib.pyplot as plt

    workers = report.scale.workers
    fig, axes = plt.subplots(1, len(workers), figsize=(4 * len(workers), 3.4), squeeze=False)
    for ax, w in zip(axes[0], workers):
        for (m, method), t in report.tuned.items():
            if m not in (w, 1) or not t.outcomes:
                continue
            anchor = t.choice or min(t.outcomes, key=lambda p: (not t.outcomes[p].trained, t.outcomes[p].error))
            line = sorted((p for p in t.outcomes if p[1] == anchor[1]), key=lambda p: p[0])
            ok = [p for p in line if t.outcomes[p].trained]
            ax.plot([p[0] for p in ok], [t.outcomes[p].error for p in ok], marker="o", ms=3, color=COLORS[method],
                    label=LABELS[method], ls="--" if method == "sgd" else "-")
            failed = [p[0] for p in line if not t.outcomes[p].trained]
            if failed:
                ax.plot(failed, [100 * CHANCE_ERROR] * len(failed), "x", color=COLORS[method])
            if t.choice is not None and t.outcomes[t.choice].trained:
                ax.plot([t.choice[0]], [t.outcomes[t.choice].error], "o", mfc="none", ms=8, color=COLORS[method])
        ax.set_xscale("log")
        label_axes(ax, f"M={w}", "base rate (Horovod: x M)", "validation error %")
    return save(fig, out, "tuning.png", legend_on=axes[0][:1])


def curves(report, out: Path) -> str:
    """Mean test error after each epoch, intention to treat (a run that did not train at chance throughout),
    one panel per M; the out-of-the-box rows dotted."""
    import matplotlib.pyplot as plt

    workers = report.scale.workers
    fig, axes = plt.subplots(1, len(workers), figsize=(4 * len(workers), 3.4), squeeze=False)
    epochs = report.scale.epochs_of()
    for ax, w in zip(axes[0], workers):
        for row in ["sgd", *report.rows_at()]:
            found = list(report.cell(w, row).values())
            if not found:
                continue
            curve = [[r["test_errors"][i] if itt_error(r) < CHANCE_ERROR and i < len(r["test_errors"])
                      else CHANCE_ERROR for i in range(epochs)] for r in found]
            ax.plot(range(1, epochs + 1), [100 * mean(c[i] for c in curve) for i in range(epochs)],
                    color=COLORS[row], ls=":" if "@" in row else "--" if row == "sgd" else "-", label=LABELS[row])
        label_axes(ax, f"M={w}", "epoch", "test error % (intention to treat)")
    return save(fig, out, "error_vs_epoch.png", legend_on=axes[0][:1])


def label_axes(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def save(fig, out: Path, name: str, legend_on) -> str:
    """Legends on the axes ``legend_on``, then the figure as ``out/name``; returns ``name``."""
    for ax in legend_on:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / name, dpi=110, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name

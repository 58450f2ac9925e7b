"""The evidence's figures, drawn from the records alone (``report.py`` calls
``plots``): validation error against the rate for every method and M (the
whole tuning grid), test error against epochs, and test error against
wall-clock seconds of the real jobs.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import List

from plan import LABELS, trained, tuning_cells

COLORS = {"sgd": "black", "none": "tab:red", "constant": "tab:blue", "adaptive": "tab:green",
          "staleness": "tab:brown", "gap_aware": "tab:cyan", "ssgd": "tab:orange", "horovod": "tab:purple",
          "constant@asgd": "tab:blue", "adaptive@asgd": "tab:green", "horovodrun": "tab:pink"}


def plots(report, out: Path) -> List[str]:
    """Every figure, as PNGs in ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    names = [tuning(report, optimizer, out)
             for optimizer in sorted({s.optimizer for s in report.scale.settings if s.tuned_in is None})]
    names.append(curves(report, out))
    if any(r["source"] != "simulator" for r in report.done.values()):
        names.append(timed(report, out))
    return names


def tuning(report, optimizer: str, out: Path) -> str:
    """Validation error (at each rate's best constant) against the rate, one panel per M; a rate where no
    constant trained is marked with an x at the top."""
    import matplotlib.pyplot as plt

    cells = [(w, m) for o, w, m in tuning_cells(report.scale) if o == optimizer]
    workers = sorted({w for w, _ in cells if w > 1})
    fig, axes = plt.subplots(1, len(workers), figsize=(4 * len(workers), 3.4), squeeze=False)
    sgd = report.chosen.get((optimizer, 1, "sgd"))
    for ax, w in zip(axes[0], workers):
        for method in [m for cw, m in cells if cw == w] + ["sgd"]:
            choice = sgd if method == "sgd" else report.chosen.get((optimizer, w, method))
            if choice is None:
                continue
            by_rate = choice.by_rate()
            rates = sorted(by_rate)
            ax.plot([r for r in rates if by_rate[r] is not None], [by_rate[r] for r in rates if by_rate[r] is not None],
                    marker="o", ms=3, color=COLORS[method], label=LABELS[method], ls="--" if method == "sgd" else "-")
            failed = [r for r in rates if by_rate[r] is None]
            if failed:
                ax.plot(failed, [100 * 0.9] * len(failed), "x", color=COLORS[method])
        ax.set_xscale("log")
        label_axes(ax, f"M={w}, {optimizer}", "base rate (Horovod: x M)", "validation error %")
    return save(fig, out, f"tuning_{optimizer}.png", legend_on=axes[0][:1])


def curves(report, out: Path) -> str:
    """Mean test error after each epoch (runs that trained), main setting, one panel per M."""
    import matplotlib.pyplot as plt

    from plan import rows_of

    setting = report.main_setting()
    fig, axes = plt.subplots(1, len(setting.workers), figsize=(4 * len(setting.workers), 3.4), squeeze=False)
    for ax, w in zip(axes[0], setting.workers):
        for row in ["sgd", *rows_of(setting)]:
            found = [r for r in report.cell(setting, w, row).values() if trained(r) and r["test_errors"]]
            if not found:
                continue
            n = min(len(r["test_errors"]) for r in found)
            ax.plot(range(1, n + 1), [100 * mean(r["test_errors"][i] for r in found) for i in range(n)],
                    color=COLORS[row], ls=":" if "@" in row else "-", label=LABELS[row])
        label_axes(ax, f"M={w}, {setting.optimizer}, {setting.delay}", "epoch", "test error %")
    return save(fig, out, "error_vs_epoch.png", legend_on=axes[0][:1])


def timed(report, out: Path) -> str:
    """Test error against wall-clock seconds of the real jobs, mean over seeds at each copy, per (M, straggler)."""
    import matplotlib.pyplot as plt

    runs = [r for r in report.done.values() if r["source"] != "simulator" and r.get("curve")]
    panels = sorted({(r["workers"], r["straggler"]) for r in runs})
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4 * max(1, len(panels)), 3.4), squeeze=False)
    for ax, (w, straggler) in zip(axes[0], panels):
        for method in sorted({r["method"] for r in runs}):
            found = [r for r in runs if (r["workers"], r["straggler"], r["method"]) == (w, straggler, method)]
            if not found:
                continue
            n = min(len(r["curve"]) for r in found)
            ax.plot([mean(r["curve"][i][0] for r in found) for i in range(n)],
                    [100 * mean(r["curve"][i][1] for r in found) for i in range(n)],
                    color=COLORS.get(method, "gray"), label=LABELS.get(method, "plain Horovod (horovodrun)"))
        ax.axhline(100 * found[0]["target"], color="gray", lw=0.8, ls=":")
        label_axes(ax, f"M={w}, straggler {straggler:g}x", "seconds", "test error %")
    return save(fig, out, "error_vs_seconds.png", legend_on=axes[0][:1])


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

"""The unchanged Horovod script against plain Horovod: final test accuracy.

``examples/pytorch_digits_horovod.py`` is Horovod's PyTorch MNIST example on
scikit-learn's digits, with the learning rate scaled by ``hvd.size()`` as
Horovod's docs tell every user to write; ``examples/pytorch_digits.py`` is the
same script with its import changed.  Each round runs plain Horovod on W
workers, then the drop-in script in every mode on W workers and a server, back
to back.  A mode's final test accuracy (the last one worker 0 prints) minus
plain Horovod's in the same round is one paired difference.  Over the rounds
the table shows each mode's mean difference with its 95% t interval, its
worst single run, and whether the interval lies above the margin (within it:
met), below it (missed) or across it (not decided by this run).

The asynchronous modes are not deterministic (the order of the pushes is the
machines' timing), so a single run says little: on digits one epoch's test
accuracy can move by several points.  Plain Horovod and ``sync`` are seeded
and repeat exactly.

    python benchmarks/drop_in_accuracy.py [--workers 4] [--rounds 12] [--modes none sync] [--markdown docs/USAGE.md]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import sys
from pathlib import Path

import docs_section
from evidence.stats import paired_difference, verdict
from jobs import child_env, mpirun

ROOT = Path(__file__).resolve().parent.parent
PLAIN = ROOT / "examples" / "pytorch_digits_horovod.py"
DROP_IN = ROOT / "examples" / "pytorch_digits.py"
MODES = ("none", "constant", "adaptive", "sync")
LABELS = {"none": "ASGD", "constant": "DC-ASGD-c", "adaptive": "DC-ASGD-a", "sync": "SSGD"}
#: How far below plain Horovod's accuracy a mode may end on average (a fraction).
MARGIN = 0.03


def final_accuracy(output: str) -> float:
    """The last test accuracy worker 0 printed, as a fraction."""
    found = re.findall(r"Accuracy: ([0-9.]+)%", output)
    if not found:
        raise ValueError(f"no test accuracy in the output:\n{output[-3000:]}")
    return float(found[-1]) / 100


def run_once(args, script: Path, ranks: int, mode: str = "") -> float:
    """One mpirun of ``script``: its final test accuracy."""
    from hvd_dcasgd.common.process import run_command

    env = child_env(HVD_DCASGD_COMPENSATION=mode) if mode else child_env()
    out = run_command(mpirun(ranks, script, "--epochs", args.epochs), timeout=args.timeout, env=env)
    if out.returncode != 0:
        sys.exit(f"{script.name} {mode} failed{' (timed out)' if out.timed_out else ''}:\n{out.stdout[-4000:]}")
    return final_accuracy(out.stdout)


def label(mode: str) -> str:
    """A mode's name, with DC-ASGD's constants where it has them: the
    package's defaults, which every run of this script uses."""
    from hvd_dcasgd.algorithm.compensation import Compensation

    constants = Compensation(mode).constants() if mode != "sync" else {}
    shown = [f"{name} {constants[name]:g}" for name in ("lambda_0", "bound") if name in constants]
    return f"`{mode}` ({', '.join([LABELS[mode], *shown])})"


def rows(plain: list, ours: dict) -> list:
    """One row per mode: mean accuracy, the mean difference from plain
    Horovod with its 95% interval, the worst run and the verdict."""
    table = []
    for mode, accuracies in ours.items():
        difference = paired_difference(accuracies, plain)
        low, high = difference.t_interval
        worst = min(a - p for a, p in zip(accuracies, plain))
        table.append([label(mode), f"{100 * statistics.mean(accuracies):.2f}%",
                      f"{100 * difference.mean:+.2f} [{100 * low:+.2f}, {100 * high:+.2f}]",
                      f"{100 * worst:+.2f}", verdict((low, high), -MARGIN)])
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12, help="run every script this many times, interleaved")
    parser.add_argument("--epochs", type=int, default=10, help="the examples' own default")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                        help="the drop-in script's modes to run (default: every one)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each mpirun")
    parser.add_argument("--markdown", metavar="PATH", help="also write this benchmark's section of PATH "
                        "(docs/USAGE.md)")
    args = parser.parse_args()
    modes = [mode for mode in MODES if mode in args.modes]
    if importlib.util.find_spec("horovod") is None:
        sys.exit("drop_in_accuracy.py compares with plain Horovod, which is not installed: "
                 "`bash .ci/setup.sh` builds it")
    if args.rounds < 2:
        sys.exit(f"--rounds {args.rounds}: an interval needs at least 2 rounds")
    plain, ours = [], {mode: [] for mode in modes}
    for number in range(1, args.rounds + 1):
        plain.append(run_once(args, PLAIN, args.workers))
        for mode in modes:
            ours[mode].append(run_once(args, DROP_IN, args.workers + 1, mode))
        print(f"round {number}: plain Horovod {plain[-1]:.4f}, "
              + ", ".join(f"{mode} {ours[mode][-1]:.4f}" for mode in modes), flush=True)
    header = ["mode", "mean final accuracy", "minus Horovod's, points: mean [95% interval]", "worst run, points",
              f"within {100 * MARGIN:g} points"]
    table = rows(plain, ours)
    reference = (f"mean final accuracy {100 * statistics.mean(plain):.2f}% "
                 f"(range {100 * min(plain):.2f} to {100 * max(plain):.2f})")
    print(f"plain Horovod: {reference}")
    for row in table:
        print("  " + "  ".join(row))
    if args.markdown:
        ran = ("every mode" if modes == list(MODES) else ("mode " if len(modes) == 1 else "the modes ")
               + ", ".join(f"`{mode}`" for mode in modes))
        summary = (f"{args.workers} workers, {args.epochs} epochs, {args.rounds} rounds; in each round plain "
                   f"Horovod (`{PLAIN.relative_to(ROOT)}`) and the drop-in script "
                   f"(`{DROP_IN.relative_to(ROOT)}`, one rank more) in {ran}, one mpirun each, so the "
                   f"differences are paired within a round. Plain Horovod's {reference}.")
        command = docs_section.command("drop_in_accuracy.py", sys.argv[1:])
        docs_section.write(args.markdown, "drop_in_accuracy.py", command,
                           [summary, "", *docs_section.table(header, table)])


if __name__ == "__main__":
    main()

"""Whether this tree is slower than an earlier commit, in same-run ratios.

The earlier commit (``--base REV``; by default the parent of the commit that
made the server's algorithm and its serving two modules, the start of that
restructuring) is checked out into a temporary git worktree.  Then, round by
round, each mode of ``benchmarks/bench_end_to_end.py`` runs once from each
tree (its ``--run`` entry point under mpirun, the server's end-of-run figures
read from ``HVD_DCASGD_SUMMARY``), back to back, the order of the two trees
alternating between rounds.  The machine's load drifts between rounds, so
each round gives one ratio of the server's updates/s, this tree over the
earlier one; per mode the script prints their geometric mean with the 95% t
interval of the mean of their logarithms (``scipy.stats``), and a verdict
against a tolerance (``--tolerance``, 0.95 by default):

* ``no slowdown``: the whole interval lies at or above the tolerance;
* ``slower``: the whole interval lies below it;
* ``not decided by this run``: the interval holds the tolerance (more rounds
  narrow it).

Every run has the Horovod integration off (``HVD_DCASGD_HOROVOD=0``) and no
other ``HVD_DCASGD_*`` variable from this environment, so both trees run the
same job whatever variables either knows.  ``--new-env NAME=VALUE`` sets a
variable for this tree's runs only: where a default changed since the earlier
commit, it runs this tree with the earlier default (``HVD_DCASGD_BOUND=inf``,
the paper's unbounded formula, which DC-ASGD-a ran before the bound), so that
the ratio measures the code and not the change of rule.

    python benchmarks/compare_commits.py [--base REV] [--rounds 5] [--modes none adaptive]
        [--workers 4] [--numel 1000000] [--steps 200] [--new-env NAME=VALUE ...] [--markdown docs/PERFORMANCE.md]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import docs_section
from jobs import ROOT, mpirun

LABELS = {"none": "ASGD", "constant": "DC-ASGD-c", "adaptive": "DC-ASGD-a", "sync": "SSGD"}
NO_SLOWDOWN, SLOWER, UNDECIDED = "no slowdown", "slower", "not decided by this run"
#: Each measure of a run's summary: what it is called, and whether more of it is faster.
MEASURES = {"updates_per_s": ("updates/s", True),
            "apply_seconds_per_update": ("the server's time per update (compensate and step)", False)}
#: The variables every run gets from this script (``--new-env`` cannot change them).
OWN_VARIABLES = ("HVD_DCASGD_HOROVOD", "HVD_DCASGD_SUMMARY")


def git(*args: str, cwd: Path = ROOT) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"git {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout.strip()


def default_base() -> str:
    """The parent of the oldest commit that added ``hvd_dcasgd/serving.py``."""
    added = git("log", "--diff-filter=A", "--format=%H", "--", "hvd_dcasgd/serving.py").splitlines()
    if not added:
        sys.exit("no commit adds hvd_dcasgd/serving.py here: name the earlier commit with --base REV")
    return git("rev-parse", f"{added[-1]}^")


def run_once(tree: Path, mode: str, args: argparse.Namespace,
             extra: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """One mpirun of ``mode`` from ``tree``, with the variables ``extra``: the server's summary."""
    with tempfile.TemporaryDirectory() as scratch:
        summary = Path(scratch) / "summary.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_DCASGD_")}
        env.update(PYTHONPATH=str(tree), HVD_DCASGD_HOROVOD="0", HVD_DCASGD_SUMMARY=str(summary), **(extra or {}))
        cmd = mpirun(args.workers + 1, str(tree / "benchmarks" / "bench_end_to_end.py"), "--run", mode,
                     "--numel", args.numel, "--steps", args.steps)
        try:
            out = subprocess.run([str(c) for c in cmd], cwd=tree, env=env, capture_output=True, text=True,
                                 timeout=args.timeout)
        except subprocess.TimeoutExpired:
            sys.exit(f"{mode} from {tree} took over {args.timeout:g} s")
        if out.returncode != 0 or not summary.exists():
            sys.exit(f"{mode} from {tree} failed (status {out.returncode}):\n{out.stdout}\n{out.stderr}")
        return json.loads(summary.read_text())


def ratio_interval(new: Sequence[float], base: Sequence[float],
                   level: float = 0.95) -> Tuple[float, Tuple[float, float]]:
    """The geometric mean of the per-round ratios ``new / base`` and the
    ``level`` t interval of the mean of their logarithms, back on the ratio
    scale (a ratio and its inverse are equally far from 1).  With one round
    the interval is unbounded."""
    from scipy import stats

    logs = [math.log(n / b) for n, b in zip(new, base)]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), (0.0, math.inf)
    half = stats.t.ppf(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def verdict(interval: Tuple[float, float], tolerance: float) -> str:
    """``no slowdown`` when the interval lies at or above ``tolerance``,
    ``slower`` when it lies below, else ``not decided by this run``."""
    low, high = interval
    if low >= tolerance:
        return NO_SLOWDOWN
    if high < tolerance:
        return SLOWER
    return UNDECIDED


def compare(base_tree: Path, new_tree: Path, args: argparse.Namespace) -> Dict[str, Dict[str, List[Dict[str, Any]]]]:
    """Rounds of every mode from both trees, paired by round (each run's
    summary); the order of the two trees alternates from one round to the next."""
    runs: Dict[str, Dict[str, List[Dict[str, Any]]]] = {m: {"base": [], "new": []} for m in args.modes}
    trees = [("base", base_tree), ("new", new_tree)]
    for r in range(args.rounds):
        for mode in args.modes:
            for name, tree in (trees if r % 2 == 0 else trees[::-1]):
                runs[mode][name].append(run_once(tree, mode, args, args.new_env if name == "new" else None))
        print(f"round {r + 1}: " + "  ".join(
            f"{LABELS[m]} base {runs[m]['base'][-1]['updates_per_s']:.1f}, new {runs[m]['new'][-1]['updates_per_s']:.1f} "
            f"updates/s, {runs[m]['base'][-1]['apply_seconds_per_update'] * 1e3:.3f} and "
            f"{runs[m]['new'][-1]['apply_seconds_per_update'] * 1e3:.3f} ms per update" for m in args.modes), flush=True)
    return runs


def report(runs: Dict[str, Dict[str, List[Dict[str, Any]]]], tolerance: float) -> List[str]:
    """Per mode, a line per measure: the speed ratio, its interval and the
    verdict; and a line where the two trees' update paths differ."""
    lines = []
    for mode, by_tree in runs.items():
        for measure, (name, more_is_faster) in MEASURES.items():
            base, new = ([run[measure] for run in by_tree[tree]] for tree in ("base", "new"))
            faster, slower = (new, base) if more_is_faster else (base, new)
            ratios = [f / s for f, s in zip(faster, slower)]
            mean, (low, high) = ratio_interval(faster, slower)
            lines.append(f"{LABELS[mode]} ({mode}), {name}: speed ratio {'new/base' if more_is_faster else 'base/new'} "
                         f"{mean:.3f}, 95% interval [{low:.3f}, {high:.3f}] over {len(ratios)} rounds "
                         f"(ratios {', '.join(f'{x:.3f}' for x in ratios)}); tolerance {tolerance:.2f}: "
                         f"{verdict((low, high), tolerance)}")
        paths = {tree: sorted({run.get("update_path", {}).get("path", "?") for run in by_tree[tree]})
                 for tree in ("base", "new")}
        if paths["base"] != paths["new"]:
            lines.append(f"{LABELS[mode]} ({mode}): the update paths differ: base {', '.join(paths['base'])}, "
                         f"new {', '.join(paths['new'])}")
    return lines


def new_env(parser: argparse.ArgumentParser, items: Sequence[str]) -> Dict[str, str]:
    """``--new-env``'s NAME=VALUE items as a dict, or the parser's error naming the one that is not."""
    env = {}
    for item in items:
        name, equals, value = item.partition("=")
        if not equals or not name.startswith("HVD_DCASGD_"):
            parser.error(f"--new-env {item!r}: give NAME=VALUE with an HVD_DCASGD_ variable's name")
        if name in OWN_VARIABLES:
            parser.error(f"--new-env {item!r}: {name} is set by this script in both trees' runs")
        env[name] = value
    return env


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the earlier commit (default: the parent of the oldest commit that added "
                        "hvd_dcasgd/serving.py)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["none", "adaptive"], choices=sorted(LABELS))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=200, help="pushes per worker in each run")
    parser.add_argument("--tolerance", type=float, default=0.95, help="the ratio below which the tree is slower")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each mpirun")
    parser.add_argument("--new-env", nargs="+", action="extend", default=[], metavar="NAME=VALUE",
                        help="variables for this tree's runs only (an earlier default, say HVD_DCASGD_BOUND=inf)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the result as this script's section of PATH")
    args = parser.parse_args(argv)
    args.new_env = new_env(parser, args.new_env)
    base = git("rev-parse", "--verify", f"{args.base or default_base()}^{{commit}}")
    head = git("rev-parse", "--short", "HEAD")
    dirty = " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    with tempfile.TemporaryDirectory(prefix="compare-") as scratch:
        base_tree = Path(scratch) / "base"
        git("worktree", "add", "--detach", str(base_tree), base)
        try:
            setting = (f"{args.workers} workers, {args.numel / 1e6:g}M float32 parameters, {args.steps} pushes per "
                       f"worker, {args.rounds} rounds, {os.cpu_count()} cores"
                       + "".join(f", {name}={value} in this tree's runs" for name, value in args.new_env.items()))
            print(f"base {base[:7]} ({base_tree}) against this tree, {head}{dirty} ({ROOT}): {setting}", flush=True)
            runs = compare(base_tree, ROOT, args)
        finally:
            git("worktree", "remove", "--force", str(base_tree))
    lines = [f"The tree at {head}{dirty} against {base[:7]}: {setting}.", "",
             *(f"- {line}" for line in report(runs, args.tolerance))]
    docs_section.publish("compare_commits.py", sys.argv[1:] if argv is None else argv, lines, args.markdown)


if __name__ == "__main__":
    main()

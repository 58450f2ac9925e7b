"""The evidence's page: ``OUT/RESULTS.md`` and the plots in ``OUT/results``,
from ``OUT/results/evidence.json`` alone -- no training, a few seconds.

    python benchmarks/evidence/report.py            # docs/RESULTS.md from docs/results/evidence.json
    python benchmarks/evidence/report.py --out DIR

``run.py`` calls it after its runs; the page is a function of the records (and
of the scale and tasks they name), so running it again writes the same page.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from statistics import mean, stdev
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plan import ASYNC, DELAY_METHODS, LABELS, METHODS, SCALES, STRAGGLER_METHODS, Scale, key_of  # noqa: E402
from plots import plots  # noqa: E402
from records import errors_of, load, mean_staleness, select, wallclock_rows  # noqa: E402
from tasks import TASKS  # noqa: E402


def write_report(out: Path) -> List[str]:
    """Write ``out/RESULTS.md`` and the plots from ``out/results/evidence.json``;
    returns the plots' file names."""
    evidence = load(Path(out) / "results" / "evidence.json")
    scale = SCALES[evidence["scale"]]
    names = plots(evidence["records"], scale, Path(out) / "results")
    (Path(out) / "RESULTS.md").write_text(page(evidence, scale))
    return names


# --- tables -------------------------------------------------------------------
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


# --- the reading --------------------------------------------------------------
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


def wallclock_reading(rows: List[Dict], cores: Optional[int]) -> List[str]:
    """Speed-ups and what the straggler costs, with how far timings on
    ``cores`` shared cores (None: not recorded) can be trusted."""
    cores_text = f"{cores} cores" if cores else "cores"
    lines = []
    rate = {(r["method"], r["straggler"]): sum(n for n, _ in r["per_worker"]) / max(s for _, s in r["per_worker"])
            for r in rows if "failed" not in r}
    sgd = rate.get(("sgd", 1.0))
    if sgd:
        lines.append("- Speed-up in samples/s over sequential SGD, no straggler: " + ", ".join(
            f"{LABELS[m]} {v / sgd:.2f}x" for (m, s), v in rate.items() if s == 1.0 and m != "sgd")
            + f" (every process -- the server and the workers -- shares the machine's {cores_text}).")
    stragglers = sorted({s for _, s in rate} - {1.0})
    seconds = [max(s for _, s in r["per_worker"]) for r in rows if "failed" not in r]
    for s in stragglers:
        kept = {m: rate[(m, s)] / rate[(m, 1.0)] for m in STRAGGLER_METHODS
                if (m, s) in rate and (m, 1.0) in rate}
        lines.append(f"- With one worker {s:g}x slower, the fraction of its own samples/s each method keeps: "
                     + ", ".join(f"{LABELS[m]} {v:.2f}" for m, v in kept.items())
                     + ". Every worker trains the same number of epochs, so the job ends when the straggler does, "
                     f"whatever the method. These runs last {min(seconds):.1f} to {max(seconds):.1f} s on "
                     f"{cores_text} that every process shares, so run-to-run noise is as large as these "
                     "differences" + (" (a fraction above 1 can only be noise)" if max(kept.values(), default=0) > 1
                                      else "")
                     + ": they show that each method runs with a straggler, not which one copes best; the delay "
                     "models above compare the methods under controlled delays.")
    return lines


# --- the page -----------------------------------------------------------------
def page(evidence: Dict, scale: Scale) -> str:
    """RESULTS.md's text: a function of the evidence alone."""
    records, sessions = evidence["records"], evidence["sessions"]
    cores = sessions[-1]["cores"] if sessions else None
    text = ["# Results: DC-ASGD at CPU scale", "", *provenance(evidence["scale"], sessions), "",
            "Quick and tiny scales run fewer epochs and seeds than the full one: their numbers show the shape of "
            "the comparison, not converged errors." if evidence["scale"] != "full" else "", "",
            *setup(scale), *table1_section(records, scale), *sweep_section(records, scale),
            *delay_section(records, scale), *wallclock_section(records, scale, cores),
            *cost_section(records, scale), *failed_section(records),
            "", "## Commands", "", "```bash",
            "python benchmarks/evidence/run.py            # this page, full scale",
            "python benchmarks/evidence/run.py --quick    # a few minutes",
            ".venv/bin/python -m pytest -q tests/test_simulator.py tests/test_evidence.py",
            "```", "", "Every real run's command line and result are in `results/evidence.json`."]
    return "\n".join(text) + "\n"


def provenance(scale_name: str, sessions: List[Dict]) -> List[str]:
    """The command, the time it took, the machine and its load, as ``run.py``
    recorded them in its sessions (a resumed run has several)."""
    if not sessions:
        command = "python benchmarks/evidence/run.py" + ("" if scale_name == "full" else f" --scale {scale_name}")
        return [f"Generated by `{command}` ({scale_name} scale). Its evidence.json predates the recording of "
                "the run's duration, machine and load."]
    first, last = sessions[0], sessions[-1]
    minutes = sum(s["seconds"] for s in sessions) / 60
    timed = sum(s["timed_seconds"] for s in sessions) / 60
    resumed = f" in {len(sessions)} sessions, each resuming the one before," if len(sessions) > 1 else ""
    loads = first["load_before"] + last["load_after"]
    return [
        f"Generated by `{last['command']}` ({scale_name} scale){resumed} in {minutes:.1f} minutes "
        f"({timed:.1f} of them the real runs whose timings are reported, one at a time; the other "
        "real runs shared the cores with the simulator runs, which changes their order of pushes as any load "
        "would, and nothing else).",
        f"Machine: {last['machine']}. Load average (1, 5, 15 min) before the run "
        f"{', '.join(f'{x:.1f}' for x in first['load_before'])}, after "
        f"{', '.join(f'{x:.1f}' for x in last['load_after'])}"
        + (": the machine was shared with other work during the run, so absolute timings are noisy; "
           "ratios come from runs made minutes apart." if max(loads) > last["cores"] else "."),
    ]


def setup(scale: Scale) -> List[str]:
    return [
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
            [t, "{} train / {} test".format(*TASKS[t].sizes), TASKS[t].model.__name__, scale.epochs_of(t),
             TASKS[t].batch_size, TASKS[t].lr, f"{TASKS[t].lambda_constant:g} / {TASKS[t].lambda_adaptive:g}"]
            for t in scale.tasks]),
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
    ]


def table1_section(records: List[Dict], scale: Scale) -> List[str]:
    text = ["## Table 1 at CPU scale: final test error (%), mean ± std over seeds", "",
            f"Simulator: {scale.seeds} seeds; real MPI runs: {scale.mpi_seeds} seed(s). Paper (CIFAR-10, ResNet-20): "
            "M=4 ASGD 9.27, SSGD 9.17, DC-ASGD-c 8.67, DC-ASGD-a 8.19; M=8 10.26, 10.10, 9.27, 8.57; sequential 8.65.",
            ""]
    for task in scale.tasks:
        text += [f"### {task}", "", table1(records, task, scale), "", f"![error vs epoch](results/error_vs_epoch_{task}.png)", ""]
    return text + ["### Reading, computed from the numbers above", "", *reading(records, scale), ""]


def sweep_section(records: List[Dict], scale: Scale) -> List[str]:
    text = ["## lambda_0 sweep (simulator, round-robin)", ""]
    for task in scale.tasks:
        text += [f"### {task}, M={scale.sweep_workers}", "", sweep_table(records, task, scale.sweep_workers, {
            m: sorted({TASKS[task].lambda_0(m), *v}) for m, v in scale.lambdas.items()}), ""]
    return text + ["![lambda sweep](results/lambda_sweep.png)", ""]


def delay_section(records: List[Dict], scale: Scale) -> List[str]:
    workers = scale.mpi_workers[0]
    text = ["## Delay models against the real system", "",
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
    return text


def wallclock_section(records: List[Dict], scale: Scale, cores: Optional[int]) -> List[str]:
    workers = scale.mpi_workers[0]
    text = ["## Wall-clock and throughput (real MPI runs, one each)", ""]
    for task in scale.tasks:
        rows = wallclock_rows(records, task, workers)
        if not any(r["straggler"] != 1.0 for r in rows) and task != scale.tasks[0]:
            continue
        text += [f"### {task}, M={workers}", "", wallclock_table(rows, task), "",
                 "samples/s: all workers' samples over the job's time (until the last worker finishes). "
                 "Sum of workers' samples/s: each worker's samples over its own training time. "
                 "Seconds to the target: the first of worker 0's evaluations (after each of its epochs) at or "
                 "below it. The straggler is the last worker: after each step it sleeps (factor - 1) times "
                 "that step's measured compute.", "", *wallclock_reading(rows, cores), "",
                 f"![error vs seconds](results/error_vs_seconds_{task}.png)", ""]
    return text


def cost_section(records: List[Dict], scale: Scale) -> List[str]:
    """Server updates/s of the timed runs, and of the server-bound benchmark."""
    workers, text = scale.mpi_workers[0], ["## The compensation's cost", ""]
    rates = {r["method"]: r.get("server_updates_per_s") for r in wallclock_rows(records, scale.tasks[0], workers)
             if "failed" not in r and r["straggler"] == 1.0 and r["method"] in ASYNC}
    if rates.get("none") and rates.get("adaptive"):
        text.append(f"- The timed {scale.tasks[0]} runs above, M={workers}: server updates/s "
                    + ", ".join(f"{LABELS[m]} {v:.1f}" for m, v in rates.items())
                    + f" (DC-ASGD-a / ASGD {rates['adaptive'] / rates['none']:.2f}); there the workers' compute, "
                    "not the server, sets the rate.")
    for bench in select(records, source="bench"):
        rates = bench["updates_per_s"]
        if rates:
            text.append(f"- Server-bound (`{in_repository(bench['command'])}`: 4 workers push precomputed "
                        "gradients of a 1M-parameter model as fast as the server answers), updates/s and ratio to "
                        "ASGD (`none`) in the same setting: "
                        + ", ".join(f"{m} {v:.1f} ({v / rates['none' + m[len(m.split()[0]):]]:.2f})"
                                    for m, v in rates.items()) + ".")
    return text


def in_repository(command: str) -> str:
    """``command`` with the repository it ran in (the folder holding
    ``benchmarks/``) left out of its paths, as if run from there."""
    root = re.search(r"(\S*/)benchmarks/", command)
    return command.replace(root.group(1), "") if root else command


def failed_section(records: List[Dict]) -> List[str]:
    failed = [r for r in records if "failed" in r]
    return ["", "## Runs that failed", "", *([
        f"- {key_of(r)}" + (f": `{r['command']}`" if "command" in r else "")
        + f" ended with: {' / '.join(r['failed'][-3:])}" for r in failed] or ["None."])]


def main() -> None:
    parser = argparse.ArgumentParser(description="RESULTS.md and the plots from the recorded evidence.")
    parser.add_argument("--out", default="docs", help="reads OUT/results/evidence.json, writes OUT/RESULTS.md")
    out = Path(parser.parse_args().out)
    names = write_report(out)
    print(f"wrote {out / 'RESULTS.md'} and {len(names)} plots", flush=True)


if __name__ == "__main__":
    main()

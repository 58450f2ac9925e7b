"""Every ``HVD_DCASGD_*`` environment variable, read and validated here.

The package (:func:`resolve`, :func:`setting`) and the launcher
(:func:`check_environment`) use this one table, so they accept and refuse the
same values, and a misspelt variable name is an error with the list of known
ones instead of a setting silently ignored.  Each setting is resolved in one
way, by :func:`resolve`: the environment over the script's argument over the
table's one default.  Standard library only: the launcher imports it without
torch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from .errors import HvdDcasgdValueError

__all__ = ["VARIABLES", "Variable", "check_environment", "resolve", "setting"]

PREFIX = "HVD_DCASGD_"


def _text(raw: str) -> str:
    return raw


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"use {', '.join(choices)}")
        return value

    return parse


def _non_negative_number(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("it is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError("use a finite number >= 0")
    return value


def _positive_number(raw: str) -> float:
    value = _non_negative_number(raw)
    if value == 0:
        raise ValueError("use a number > 0")
    return value


def _positive_integer(raw: str) -> int:
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError("use a whole number >= 1")
    return int(raw)


def _bound(raw: str) -> float:
    if raw.strip().lower() in ("inf", "infinity", "none"):
        return math.inf
    value = _positive_number(raw)
    return value


def _fraction(raw: str) -> float:
    value = _non_negative_number(raw)
    if value >= 1:
        raise ValueError("use a number in [0, 1)")
    return value


def _non_negative_integer(raw: str) -> int:
    if not raw.strip().isdigit():
        raise ValueError("use a whole number >= 0")
    return int(raw)


@dataclass(frozen=True)
class Variable:
    """One environment variable: what it does, and how its value is read
    (``parse`` raises ``ValueError`` with what to use instead)."""

    name: str
    meaning: str
    parse: Callable[[str], Any] = _text
    where: str = "package"  # "package" (every rank reads it) or "scripts" (slurm/ and .ci/ scripts)
    default: Any = None  # the value when neither the environment nor the script sets it (None: unset)


VARIABLES: Dict[str, Variable] = {v.name: v for v in (
    Variable("HVD_DCASGD_COMPENSATION", "the compensation: none (ASGD), constant (DC-ASGD-c), adaptive (DC-ASGD-a), "
             "staleness (the rate divided by the staleness), gap_aware (Gap-Aware) or a registered one; or the "
             "shorthands sync and horovod; overrides DistributedOptimizer(compensation=...)", default='adaptive'),
    Variable("HVD_DCASGD_SCHEDULE", "async or sync; overrides DistributedOptimizer(schedule=...)", _choice("async", "sync")),
    Variable("HVD_DCASGD_BACKEND", "server (the parameter server) or horovod (Horovod's own allreduce); overrides "
             "DistributedOptimizer(backend=...)", _choice("server", "horovod")),
    Variable("HVD_DCASGD_LR_SCALING", "horovod (a worker's rate is for the average of size() gradients: applied "
             "at lr / size() per asynchronous gradient) or none (as given); overrides "
             "DistributedOptimizer(lr_scaling=...)", _choice("horovod", "none"), default='horovod'),
    Variable("HVD_DCASGD_LAMBDA", "DC-ASGD's lambda_0 (constant and adaptive; by default 0.04 for constant, 2 for "
             "adaptive); overrides DistributedOptimizer(lambda_0=...)", _non_negative_number),
    Variable("HVD_DCASGD_BOUND", "DC-ASGD's bound on its correction, element by element, as a multiple of the "
             "gradient (constant and adaptive): 1 keeps the correction no larger than the gradient, so it never "
             "reverses it; inf is the paper's unbounded rule; overrides DistributedOptimizer(bound=...)",
             _bound, default=1.0),
    Variable("HVD_DCASGD_MEAN_SQUARE_MOMENTUM", "DC-ASGD-a's MeanSquare momentum (adaptive); overrides "
             "DistributedOptimizer(mean_square_momentum=...)", _fraction, default=0.95),
    Variable("HVD_DCASGD_EPS", "DC-ASGD-a's epsilon inside the square root of MeanSquare (adaptive); overrides "
             "DistributedOptimizer(eps=...)", _positive_number, default=1e-7),
    Variable("HVD_DCASGD_GAMMA", "Gap-Aware's momentum of its running average of g * g (gap_aware); overrides "
             "DistributedOptimizer(gamma=...)", _fraction, default=0.999),
    Variable("HVD_DCASGD_GAP_EPS", "Gap-Aware's epsilon added to the square root of that average (gap_aware); "
             "overrides DistributedOptimizer(gap_eps=...)", _positive_number, default=1e-8),
    Variable("HVD_DCASGD_SKIP_BAD_PUSHES", "1: the server skips (and counts) a push whose learning rate is not a "
             "finite number >= 0 or whose gradient is not finite; 0: it ends the job naming the worker",
             _choice("0", "1"), default='0'),
    Variable("HVD_DCASGD_STALL_WARNING", "seconds of silence after which the server names a worker that has not "
             "pushed, and a worker names the server that has not answered (0: never)",
             _non_negative_number, default=60.0),
    Variable("HVD_DCASGD_STALL_TIMEOUT", "seconds of silence after which the server drops a worker (the others "
             "finish without it, then the job ends with status 69 naming it) and a worker ends the job naming a "
             "silent server (status 68); 0: never", _non_negative_number, default=0.0),
    Variable("HVD_DCASGD_STOP_GRACE", "seconds after the first stop signal (SIGTERM, SIGINT, SIGUSR1) from which "
             "another one ends a rank, and hvd-dcasgd-run's job, at once without saving; signals that come sooner "
             "are only counted: the job stops once, with its checkpoint (0: every later signal is only counted)",
             _non_negative_number, default=30.0),
    Variable("HVD_DCASGD_CHECKPOINT_DIR", "a folder: the server writes checkpoints of the whole training state there "
             "(the last two kept) and a job started again with the same folder resumes from the newest; overrides "
             "DistributedOptimizer(checkpoint_dir=...)"),
    Variable("HVD_DCASGD_CHECKPOINT_INTERVAL", "seconds between the server's checkpoints (0: only when "
             "the job is preempted and at the end)", _non_negative_number, default=600.0),
    Variable("HVD_DCASGD_TRACE", "a path: the server writes one JSON line per applied gradient"),
    Variable("HVD_DCASGD_METRICS", "a folder: the server writes its scalars (rates, staleness, each worker's "
             "pushes/s and silence, refused pushes, apply and checkpoint times, the compensation's size) there "
             "every HVD_DCASGD_METRICS_INTERVAL seconds, as TensorBoard event files (a CSV without the tensorboard "
             "package); docs/USAGE.md describes each; overrides DistributedOptimizer(metrics_dir=...)"),
    Variable("HVD_DCASGD_METRICS_INTERVAL", "seconds between two writes of the metrics (default 10)",
             _positive_number),
    Variable("HVD_DCASGD_PROGRESS", "seconds between the server's progress lines (updates, rate, staleness, the "
             "slowest worker, the last checkpoint; default 60; 0: none)", _non_negative_number),
    Variable("HVD_DCASGD_LOG_LEVEL", "the level of the package's messages (logger hvd_dcasgd): debug, info "
             "(default), warning, error or critical", _choice("debug", "info", "warning", "error", "critical")),
    Variable("HVD_DCASGD_SUMMARY", "a path: the server writes its end-of-run summary there as JSON"),
    Variable("HVD_DCASGD_FUSION_THRESHOLD", "the most bytes of gradient in one bucket a worker sends during "
             "backward, as soon as backward has finished it (64 MiB, as Horovod's "
             "HOROVOD_FUSION_THRESHOLD); 0: the whole gradient goes with step(), after backward; overrides "
             "DistributedOptimizer(fusion_threshold=...)", _non_negative_integer,
             default=64 << 20),
    Variable("HVD_DCASGD_SERVERS", "how many server ranks: world ranks 0..S-1 serve one slice of the "
             "parameters each, the rest are workers; overrides init(servers=...)", _positive_integer, default=1),
    Variable("HVD_DCASGD_SERVER_DEVICE", "the server's torch device (default: CUDA when it has one, else the CPU)"),
    Variable("HVD_DCASGD_HOROVOD", "auto, 0 or 1: start Horovod among the workers", _choice("auto", "0", "1"), default='auto'),
    Variable("HVD_DCASGD_THREAD_LEVEL", "the MPI thread level mpi4py asks for",
             _choice("single", "funneled", "serialized", "multiple")),
    Variable("HVD_DCASGD_NATIVE", "0 turns the C kernel off (1 builds it)", _choice("0", "1"), default='1'),
    Variable("HVD_DCASGD_CACHE", "where the C kernel is built (default ~/.cache/hvd_dcasgd)"),
    Variable("HVD_DCASGD_WITHOUT_HOROVOD", "1: .ci/setup.sh does not build Horovod", _choice("0", "1"), "scripts"),
    Variable("HVD_DCASGD_LAUNCHER", "srun or mpirun: how the SLURM batch scripts start the ranks",
             _choice("srun", "mpirun"), "scripts"),
    Variable("HVD_DCASGD_REPO", "the checkout the SLURM batch scripts run from", where="scripts"),
    Variable("HVD_DCASGD_VENV", "the virtual environment the SLURM batch scripts use", where="scripts"),
    Variable("HVD_DCASGD_SLURM_DIR", "where slurm/local_cluster.sh keeps its cluster", where="scripts"),
    Variable("HVD_DCASGD_SLURM_CPUS", "the CPUs slurm/local_cluster.sh gives its node", _positive_integer, "scripts"),
    Variable("HVD_DCASGD_HOSTS_DIR", "where tests/cluster/hosts.sh keeps its emulated hosts' keys, state and logs",
             where="scripts"),
    Variable("HVD_DCASGD_HOSTS_PREFIX", "the prefix of the network namespaces of tests/cluster/hosts.sh",
             where="scripts"),
    Variable("HVD_DCASGD_HOSTS_NET", "the first three numbers of the emulated hosts' private addresses (a /24)",
             where="scripts"),
)}


def _parse(variable: Variable, raw: str) -> Any:
    try:
        return variable.parse(raw)
    except ValueError as exc:
        raise HvdDcasgdValueError(f"hvd_dcasgd: {variable.name}={raw!r} is not valid: {exc}.") from None


def setting(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The value of variable ``name``, parsed; ``None`` when it is unset or
    empty.  A value that cannot be used raises a sentence naming it."""
    raw = (os.environ if environ is None else environ).get(name, "")
    if raw.strip() == "":
        return None
    return _parse(VARIABLES[name], raw)


def resolve(name: str, argument: Any = None, environ: Optional[Mapping[str, str]] = None) -> Any:
    """Setting ``name``, resolved: its environment variable when set, else
    ``argument`` (what the script passed) when not ``None``, else the
    table's one default.  Every setting of the package is read this way."""
    value = setting(name, environ)
    if value is not None:
        return value
    return argument if argument is not None else VARIABLES[name].default


def check_environment(environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """One sentence for each ``HVD_DCASGD_*`` variable in ``environ`` that
    is unknown or has a value that cannot be used."""
    environ = os.environ if environ is None else environ
    problems = []
    for name in sorted(n for n in environ if n.startswith(PREFIX)):
        if name not in VARIABLES:
            problems.append(f"hvd_dcasgd: {name} is not a variable of hvd_dcasgd (a misspelling?); known: "
                            f"{', '.join(sorted(VARIABLES))}.")
            continue
        try:
            setting(name, environ)
        except HvdDcasgdValueError as exc:
            problems.append(str(exc))
    return problems


def table(where: Sequence[str] = ("package", "scripts")) -> str:
    """The variables as a Markdown table (the docs' reference is generated from it)."""
    rows = [f"| `{v.name}` | {v.meaning} | {'' if v.default is None else f'`{v.default:g}`' if isinstance(v.default, float) else f'`{v.default}`'} |"
            for v in VARIABLES.values() if v.where in where]
    return "\n".join(["| variable | meaning | default |", "|---|---|---|", *rows])

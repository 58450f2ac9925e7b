"""Every ``HVD_DCASGD_*`` environment variable, read and validated here.

The package and the launcher (:func:`check_environment`) use this one table,
so they accept and refuse the same values, and a misspelt variable name is an
error with the list of known ones instead of a setting silently ignored.
Every variable of the process is read and checked once, into one frozen
:class:`Settings` (:func:`settings`); whatever reads a setting reads that
object, through :func:`resolve` (the environment over the script's argument
over the table's one default) or :func:`setting` (the environment alone).
Every default is the table's.  Standard library only: the launcher imports
it without torch.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import HvdDcasgdValueError

__all__ = ["LAUNCHER_SIZE_VARIABLES", "VARIABLES", "Settings", "Variable", "check_environment", "launched_size",
           "resolve", "resolve_at_import", "setting", "settings"]

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


def _name(raw: str) -> str:
    """A compensation's name, in its form only: a script may register its own,
    so whether it is known is checked where the optimizer is made."""
    value = raw.strip()
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", value):
        raise ValueError("use a compensation's name, such as adaptive, none, gap_aware, sync or horovod")
    return value


def _device(raw: str) -> str:
    """A torch device's name: a type with an optional index (cpu, cuda, cuda:1)."""
    value = raw.strip()
    if not re.fullmatch(r"[a-z]+(:[0-9]+)?", value):
        raise ValueError("use a torch device such as cpu, cuda or cuda:1")
    return value


def _gpus(raw: str) -> Any:
    """``auto``, ``none``, ``keep``, or GPU ids (numbers or UUIDs, each once) as a tuple."""
    value = raw.strip()
    if value.lower() in ("auto", "none", "keep"):
        return value.lower()
    ids = tuple(part.strip() for part in value.split(","))
    if not all(ids) or any(len(i.split()) != 1 or i.lower() in ("auto", "none", "keep") for i in ids) \
            or len(set(ids)) != len(ids):
        raise ValueError("use auto, none, keep, or GPU ids such as 0,1,2 (numbers or UUIDs, each once)")
    return ids


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
    shown: Optional[str] = None  # the docs' default where it is not one value (the method's, the scripts')


VARIABLES: Dict[str, Variable] = {v.name: v for v in (
    Variable("HVD_DCASGD_COMPENSATION", "the compensation: none (ASGD), constant (DC-ASGD-c), adaptive (DC-ASGD-a), "
             "staleness (the rate divided by the staleness), gap_aware (Gap-Aware) or a registered one; or the "
             "shorthands sync and horovod; overrides DistributedOptimizer(compensation=...)", _name,
             default="adaptive"),
    Variable("HVD_DCASGD_SCHEDULE", "async or sync (the compensation shorthand sync implies sync); overrides "
             "DistributedOptimizer(schedule=...)", _choice("async", "sync"), default="async"),
    Variable("HVD_DCASGD_BACKEND", "server (the parameter server) or horovod (Horovod's own allreduce; the "
             "compensation shorthand horovod implies it); overrides DistributedOptimizer(backend=...)",
             _choice("server", "horovod"), default="server"),
    Variable("HVD_DCASGD_LR_SCALING", "horovod (a worker's rate is for the average of size() gradients: applied "
             "at lr / size() per asynchronous gradient) or none (as given); overrides "
             "DistributedOptimizer(lr_scaling=...)", _choice("horovod", "none"), default='horovod'),
    Variable("HVD_DCASGD_LAMBDA", "DC-ASGD's lambda_0 (constant and adaptive); overrides "
             "DistributedOptimizer(lambda_0=...)", _non_negative_number, shown="0.04 (constant), 8 (adaptive)"),
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
             "DistributedOptimizer(checkpoint_dir=...)", shown="none: no checkpoints"),
    Variable("HVD_DCASGD_CHECKPOINT_INTERVAL", "seconds between the server's checkpoints (0: only when "
             "the job is preempted and at the end)", _non_negative_number, default=600.0),
    Variable("HVD_DCASGD_TRACE", "a path: the server writes one JSON line per applied gradient", shown="none: no trace"),
    Variable("HVD_DCASGD_METRICS", "a folder: the server writes its scalars (rates, staleness, each worker's "
             "pushes/s and silence, refused pushes, apply and checkpoint times, the compensation's size) there "
             "every HVD_DCASGD_METRICS_INTERVAL seconds, as TensorBoard event files (a CSV without the tensorboard "
             "package); docs/USAGE.md describes each; overrides DistributedOptimizer(metrics_dir=...)",
             shown="none: no metrics"),
    Variable("HVD_DCASGD_METRICS_INTERVAL", "seconds between two writes of the metrics", _positive_number,
             default=10.0),
    Variable("HVD_DCASGD_PROGRESS", "seconds between the server's progress lines (updates, rate, staleness, the "
             "slowest worker, the last checkpoint; 0: none)", _non_negative_number, default=60.0),
    Variable("HVD_DCASGD_LOG_LEVEL", "the level of the package's messages (logger hvd_dcasgd): debug, info, "
             "warning, error or critical; unset, a level the script set on the logger stays",
             _choice("debug", "info", "warning", "error", "critical"), default="info"),
    Variable("HVD_DCASGD_SUMMARY", "a path: the server writes its end-of-run summary there as JSON",
             shown="none: logged only"),
    Variable("HVD_DCASGD_FUSION_THRESHOLD", "the most bytes of gradient in one bucket a worker sends during "
             "backward, as soon as backward has finished it (64 MiB, as Horovod's "
             "HOROVOD_FUSION_THRESHOLD); 0: the whole gradient goes with step(), after backward; overrides "
             "DistributedOptimizer(fusion_threshold=...)", _non_negative_integer,
             default=64 << 20),
    Variable("HVD_DCASGD_SERVERS", "how many server ranks: world ranks 0..S-1 serve one slice of the "
             "parameters each, the rest are workers; overrides init(servers=...)", _positive_integer, default=1),
    Variable("HVD_DCASGD_SERVER_DEVICE", "the server's torch device", _device,
             shown="its GPU when it sees one (cuda:N, N its hvd.local_rank() modulo the GPUs it sees), else the CPU"),
    Variable("HVD_DCASGD_GPUS", "the GPUs init() places the ranks of each node on, by setting CUDA_VISIBLE_DEVICES "
             "before CUDA starts (docs/GPU.md): auto (the ids in CUDA_VISIBLE_DEVICES if it is set, else one per "
             "line of nvidia-smi -L, else none and nothing is pinned), none (CPU only: CUDA_VISIBLE_DEVICES set "
             "empty), keep (CUDA_VISIBLE_DEVICES left as it is) or GPU ids such as 0,1,2 (numbers or UUIDs); the "
             "node's servers take the first GPUs, its workers the others", _gpus, default="auto"),
    Variable("HVD_DCASGD_HOROVOD", "auto, 0 or 1: start Horovod among the workers", _choice("auto", "0", "1"), default='auto'),
    Variable("HVD_DCASGD_THREAD_LEVEL", "the MPI thread level mpi4py asks for (auto: multiple when Horovod "
             "starts on the workers, else serialized)", _choice("auto", "single", "funneled", "serialized", "multiple"),
             default="auto"),
    Variable("HVD_DCASGD_NATIVE", "0 turns the C kernel off (1 builds it)", _choice("0", "1"), default='1'),
    Variable("HVD_DCASGD_CACHE", "where the C kernel is built", default="~/.cache/hvd_dcasgd"),
    Variable("HVD_DCASGD_WITHOUT_HOROVOD", "1: .ci/setup.sh does not build Horovod (.ci/example's default; "
             ".ci/run's is 0)", _choice("0", "1"), "scripts", shown="0 (.ci/run), 1 (.ci/example)"),
    Variable("HVD_DCASGD_LAUNCHER", "srun or mpirun: how the SLURM batch scripts start the ranks",
             _choice("srun", "mpirun"), "scripts", shown="srun"),
    Variable("HVD_DCASGD_REPO", "the checkout the SLURM batch scripts run from", where="scripts",
             shown="the submit directory"),
    Variable("HVD_DCASGD_VENV", "the virtual environment the SLURM batch scripts use", where="scripts",
             shown="REPO/.venv"),
    Variable("HVD_DCASGD_SLURM_DIR", "where slurm/local_cluster.sh keeps its cluster", where="scripts",
             shown="/tmp/hvd_dcasgd_slurm"),
    Variable("HVD_DCASGD_SLURM_CPUS", "the CPUs slurm/local_cluster.sh gives its node", _positive_integer, "scripts",
             shown="8"),
    Variable("HVD_DCASGD_HOSTS_DIR", "the test suite only: where tests/cluster/hosts.sh keeps its emulated "
             "hosts' keys, state and logs",
             where="scripts", shown="/tmp/hvd_dcasgd_hosts"),
    Variable("HVD_DCASGD_HOSTS_PREFIX", "the test suite only: the prefix of the network namespaces of "
             "tests/cluster/hosts.sh",
             where="scripts", shown="hvd24"),
    Variable("HVD_DCASGD_HOSTS_NET", "the test suite only: the first three numbers of the emulated "
             "hosts' private addresses (a /24)",
             where="scripts", shown="10.213.24"),
)}


def _parse(variable: Variable, raw: str) -> Any:
    try:
        return variable.parse(raw)
    except ValueError as exc:
        raise HvdDcasgdValueError(f"hvd_dcasgd: {variable.name}={raw!r} is not valid: {exc}.") from None


@dataclass(frozen=True)
class Settings:
    """Every variable of the table as this process's environment sets it,
    parsed and checked once (``environment``: the parsed values of those
    set).  ``settings().stall_timeout`` is ``HVD_DCASGD_STALL_TIMEOUT``'s value
    or the table's default; :meth:`value` adds the script's argument."""

    environment: Mapping[str, Any] = field(default_factory=dict)

    def value(self, name: str, argument: Any = None) -> Any:
        """``name``'s variable when set, else ``argument`` when not ``None``, else the table's default."""
        found = self.environment.get(name)
        if found is not None:
            return found
        return argument if argument is not None else VARIABLES[name].default

    def __getattr__(self, attribute: str) -> Any:
        name = PREFIX + attribute.upper()
        if name not in VARIABLES:
            raise AttributeError(f"no setting {attribute!r} ({name} is not a variable of hvd_dcasgd)")
        return self.value(name)


def _snapshot(environ: Mapping[str, str]) -> Tuple[Tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in environ.items() if k.startswith(PREFIX) and k in VARIABLES))


_resolved: Dict[Tuple[Tuple[str, str], ...], Settings] = {}


def settings(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """This process's settings, read from the environment once (a changed
    environment -- a test's -- is read again).  A value that cannot be used
    raises a sentence naming it."""
    snapshot = _snapshot(os.environ if environ is None else environ)
    found = _resolved.get(snapshot)
    if found is None:
        parsed = {name: _parse(VARIABLES[name], raw) for name, raw in snapshot if raw.strip() != ""}
        found = _resolved[snapshot] = Settings(MappingProxyType(parsed))
    return found


def setting(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The value of variable ``name`` as the environment sets it, parsed;
    ``None`` when it is unset or empty."""
    VARIABLES[name]  # an unknown name is a KeyError here, not a silent None
    return settings(environ).environment.get(name)


def resolve(name: str, argument: Any = None, environ: Optional[Mapping[str, str]] = None) -> Any:
    """Setting ``name``, resolved: its environment variable when set, else
    ``argument`` (what the script passed) when not ``None``, else the
    table's one default."""
    return settings(environ).value(name, argument)


#: Where launchers put the number of ranks of the job, first match wins.
LAUNCHER_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS")


def launched_size(environ: Optional[Mapping[str, str]] = None) -> int:
    """The number of ranks the launcher started this process among (1 outside a launcher)."""
    environ = os.environ if environ is None else environ
    for name in LAUNCHER_SIZE_VARIABLES:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 1


def resolve_at_import(name: str) -> Any:
    """Setting ``name`` for code run while the package is imported (the log
    level, MPI's thread level), before MPI starts.  In one process a value
    that cannot be used raises here, as :func:`resolve` does.  In a rank of
    a multi-process job it does not fail the import on each rank with a
    traceback of its own: ``init()`` says it once for the job
    (``roles._settings_agreed``), and this variable's own bad value gives
    its default here."""
    try:
        return resolve(name)
    except HvdDcasgdValueError:
        if launched_size() <= 1:
            raise
        raw = os.environ.get(name, "")
        try:
            return _parse(VARIABLES[name], raw) if raw.strip() else VARIABLES[name].default
        except HvdDcasgdValueError:
            return VARIABLES[name].default


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
        if environ[name].strip() == "":
            continue
        try:
            _parse(VARIABLES[name], environ[name])
        except HvdDcasgdValueError as exc:
            problems.append(str(exc))
    return problems


def table(where: Sequence[str] = ("package", "scripts")) -> str:
    """The variables as a Markdown table (the docs' reference is generated from it)."""
    def shown(v: Variable) -> str:
        if v.default is None:
            return v.shown or ""
        return f"`{v.default:g}`" if isinstance(v.default, float) else f"`{v.default}`"

    rows = [f"| `{v.name}` | {v.meaning} | {shown(v)} |" for v in VARIABLES.values() if v.where in where]
    return "\n".join(["| variable | meaning | default |", "|---|---|---|", *rows])

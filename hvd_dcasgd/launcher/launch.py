"""``hvd-dcasgd-run``: start S parameter servers (one unless ``--servers``) and N workers under the MPI it finds.

    hvd-dcasgd-run -n 4 examples/train_digits.py --epochs 5

runs ``mpirun`` (Open MPI) or ``mpiexec`` (MPICH's Hydra) with N+S ranks and the
options this project needs there: the one-sided component, asynchronous
progress, oversubscription, running as root, the environment, and one GPU per
rank. ``docs/LAUNCH.md`` is the reference.

The module uses the standard library only. Each rank may start through it
(``python .../launch.py --rank-exec GPUS SCRIPT ARGS...``) to pin its GPU
before it replaces itself with the training script; it is run by path so that
this step does not import the package (and torch) a second time.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # Run by path as the per-rank step: this folder holds the package's modules,
    # which must not shadow the standard library's for the imports below.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]

import argparse
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

PROG = "hvd-dcasgd-run"
OPEN_MPI, MPICH = "openmpi", "mpich"
INSTALL_HINT = "install Open MPI (Debian: `apt-get install openmpi-bin libopenmpi-dev`) or MPICH"
RANK_EXEC = "--rank-exec"
NO_GPU = "none"
#: ``--rank-exec visible``: pin among the GPUs in this process's own ``CUDA_VISIBLE_DEVICES``.
VISIBLE = "visible"
# Open MPI parameters that together choose how one-sided operations travel.
ONE_SIDED_MCA = ("pml", "btl", "osc")
#: What this launcher does with the signals that stop a job: the first one
#: reaches the ranks at once as SIGUSR1 (mpirun forwards SIGUSR1 straight
#: away), and so do later ones, unless HVD_DCASGD_STOP_GRACE seconds have passed.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
# Where launchers put a rank's index on its node and in the job, first match wins.
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID")
WORLD_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
# Environment variables whose caller's value every rank gets, besides HVD_DCASGD_*.
PASSED_VARIABLES = ("PYTHONPATH",)
PT2PT_NOTE = (
    "note: several nodes without an RDMA network: one-sided operations use Open MPI's osc/pt2pt over TCP, "
    "which refuses MPI_THREAD_MULTIPLE, so the ranks run at thread level serialized with the Horovod "
    "integration off (HVD_DCASGD_THREAD_LEVEL=serialized, HVD_DCASGD_HOROVOD=0)"
)


class LaunchError(Exception):
    """A launch that cannot go ahead; the message is one sentence for the user."""


@dataclass(frozen=True)
class Host:
    """One host of the job and its number of slots (None: the MPI decides)."""

    name: str
    slots: Optional[int]


@dataclass(frozen=True)
class Machine:
    """What the launcher found here: the MPI launcher, the user, the cores, the GPUs, the fabric."""

    flavour: str
    mpirun: str
    is_root: bool = False
    cores: int = 1
    gpus: tuple[str, ...] = ()
    ucx_rdma: bool = False


@dataclass
class Plan:
    """The command to run, notes every user should see, and the reasons behind each choice."""

    command: list[str]
    notes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def parser() -> argparse.ArgumentParser:
    """The command-line interface; everything after the script goes to the script."""
    cli = argparse.ArgumentParser(
        prog=PROG,
        description="Run a DC-ASGD training script as S parameter servers (ranks 0..S-1; one by default) + N "
                    "workers under MPI.",
        epilog="Example: hvd-dcasgd-run -n 4 examples/train_digits.py --epochs 5. Reference: docs/LAUNCH.md.",
    )
    cli.add_argument("-n", "--workers", type=int, required=True, help="number of workers; N+S ranks are started")
    cli.add_argument("--servers", type=int, default=None,
                     help="number of parameter servers S, each holding a slice of the parameters (default: "
                          "HVD_DCASGD_SERVERS, else 1); on several hosts they are spread one per host first")
    where = cli.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", help="hosts and slots, host[:slots],...; the server runs on the first")
    where.add_argument("--hostfile", help="a hostfile in the syntax of the MPI found (Open MPI: `host slots=N`; "
                                          "MPICH: `host:N`); the server runs on the first host")
    cli.add_argument("--oversubscribe", action="store_true",
                     help="allow more ranks than slots (automatic on one node with more ranks than cores)")
    cli.add_argument("--gpus", default="auto",
                     help="auto (default), none, or GPU ids 0,1,...: the server takes the first, workers the rest")
    cli.add_argument("--python", default=sys.executable,
                     help="the Python interpreter of every rank (default: the one running this launcher)")
    cli.add_argument("--mpirun", help="the MPI launcher to use (default: mpirun, else mpiexec, on PATH)")
    cli.add_argument("--mpi-arg", action="append", default=[], metavar="ARGS",
                     help="extra arguments for mpirun, split like a shell, e.g. --mpi-arg='--bind-to none' "
                          "(repeatable)")
    cli.add_argument("--dry-run", action="store_true", help="print the command and run nothing")
    cli.add_argument("-v", "--verbose", action="store_true", help="print the command and why, then run it")
    cli.add_argument("script", help="the training script")
    cli.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return cli


def parse_hosts(spec: str) -> list[Host]:
    """``host[:slots],...`` as Hosts; the syntax both ``mpirun --host`` and ``mpiexec -hosts`` take."""
    hosts = []
    for entry in spec.split(","):
        name, _, slots = entry.strip().partition(":")
        if not name or (slots and not (slots.isdigit() and int(slots) > 0)):
            raise LaunchError(f"{entry!r} in --hosts is not host or host:slots with slots a positive number.")
        hosts.append(Host(name, int(slots) if slots else None))
    return hosts


def read_hostfile(path: str, flavour: str) -> list[Host]:
    """The hosts of a hostfile written for ``flavour``'s launcher, which gets the file itself."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise LaunchError(f"cannot read the hostfile {path} ({exc.strerror}).") from exc
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        name, _, count = words[0].partition(":")
        slots = next((word.split("=", 1)[1] for word in words[1:] if word.startswith("slots=")), None)
        if count and flavour == OPEN_MPI:
            raise LaunchError(f"{path} line {number} uses MPICH's `host:N`; Open MPI's hostfile wants "
                              f"`{name} slots={count}`.")
        if slots is not None and flavour == MPICH:
            raise LaunchError(f"{path} line {number} uses Open MPI's `slots=`; MPICH's hostfile wants "
                              f"`{name}:{slots}`.")
        text = count or slots
        if text is not None and not (text.isdigit() and int(text) > 0):
            raise LaunchError(f"{path} line {number} gives {text!r} slots where a positive number belongs.")
        hosts.append(Host(name, int(text) if text else None))
    if not hosts:
        raise LaunchError(f"the hostfile {path} names no host.")
    return hosts


def hosts_of(args: argparse.Namespace, flavour: str) -> list[Host]:
    """The hosts named by ``--hosts`` or ``--hostfile``; none means this machine alone."""
    if args.hosts:
        return parse_hosts(args.hosts)
    if args.hostfile:
        return read_hostfile(args.hostfile, flavour)
    return []


def parse_gpus(value: str) -> Optional[tuple[str, ...]]:
    """``--gpus`` as a tuple of GPU ids, ``()`` for none, or None for auto."""
    if value == "auto":
        return None
    if value == NO_GPU:
        return ()
    ids = tuple(part.strip() for part in value.split(","))
    if not all(ids):
        raise LaunchError(f"--gpus {value!r} is not auto, none, or a list of GPU ids such as 0,1,2.")
    return ids


def user_mca(mpi_args: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The Open MPI MCA parameters the user set, in ``--mca`` arguments or as ``OMPI_MCA_*`` variables."""
    chosen = {name[len("OMPI_MCA_"):]: value for name, value in environ.items() if name.startswith("OMPI_MCA_")}
    for i, arg in enumerate(mpi_args[:-2]):
        if arg in ("--mca", "-mca", "--gmca", "-gmca"):
            chosen[mpi_args[i + 1]] = mpi_args[i + 2]
    return chosen


def host_list(hosts: Sequence[Host]) -> str:
    """Hosts as ``host[:slots],...``, the syntax of both ``mpirun --host`` and ``mpiexec -hosts``."""
    return ",".join(host.name + (f":{host.slots}" if host.slots else "") for host in hosts)


def open_mpi_ranks(ranks: int, is_root: bool) -> list[str]:
    """Open MPI's options for ``ranks`` ranks, as root where this is root."""
    return [*(["--allow-run-as-root"] if is_root else []), "-np", str(ranks)]


def local_command(ranks: int, program: Sequence[str], mca: Sequence[str] = (), python: str = sys.executable,
                  mpirun: str = "mpirun") -> list[str]:
    """``mpirun`` of ``python program`` with ``ranks`` ranks on this host,
    oversubscribed, as the tests and the benchmarks run their jobs: Open
    MPI's rank options as :func:`build` writes them, and exactly the MCA
    options ``mca`` (the transport under test; nothing chosen for it)."""
    return [mpirun, *open_mpi_ranks(ranks, os.geteuid() == 0), "--oversubscribe", *mca, python, *map(str, program)]


def open_mpi_options(args: argparse.Namespace, machine: Machine, hosts: Sequence[Host], mpi_args: Sequence[str],
                     environ: Mapping[str, str], plan: Plan) -> None:
    """Append Open MPI's options: root, ranks, hosts, oversubscription, the one-sided component, ``-x``."""
    ranks = args.workers + args.servers
    if machine.is_root:
        plan.reasons.append("running as root: --allow-run-as-root")
    plan.command += open_mpi_ranks(ranks, machine.is_root)
    if args.hosts:
        plan.command += ["--host", host_list(hosts)]
    elif args.hostfile:
        plan.command += ["--hostfile", args.hostfile]
    if args.oversubscribe:
        plan.command.append("--oversubscribe")
        plan.reasons.append("--oversubscribe asked for")
    elif not hosts and ranks > machine.cores:
        plan.command.append("--oversubscribe")
        plan.reasons.append(f"{ranks} ranks on {machine.cores} core(s): --oversubscribe")
    if args.servers > 1 and (len({host.name for host in hosts}) > 1 or args.hostfile):
        plan.command += ["--map-by", "node"]
        plan.reasons.append("several servers on several hosts: --map-by node (ranks round-robin over the hosts, "
                            "so the servers, ranks 0..S-1, go one per host first)")

    theirs = user_mca(mpi_args, environ)
    if any(name in theirs for name in ONE_SIDED_MCA):
        osc = theirs.get("osc")
        plan.reasons.append("MCA pml/btl/osc set by the user: the launcher adds none of them")
    elif len({host.name for host in hosts}) <= 1:
        osc = "sm"
        plan.command += ["--mca", "osc", "sm"]
        plan.reasons.append("one node: --mca osc sm (shared-memory windows, the fastest Get)")
    elif machine.ucx_rdma:
        osc = "ucx"
        plan.command += ["--mca", "pml", "ucx", "--mca", "osc", "ucx"]
        plan.reasons.append("several nodes, an RDMA device and Open MPI's osc/ucx: --mca pml ucx --mca osc ucx")
    else:
        osc = "pt2pt"
        plan.command += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,vader,self", "--mca", "osc", "pt2pt"]
        plan.notes.append(PT2PT_NOTE)

    exported = passed_variables(environ, args.servers)
    if "pt2pt" in (osc or "").split(","):
        for name, value in (("HVD_DCASGD_THREAD_LEVEL", "serialized"), ("HVD_DCASGD_HOROVOD", "0")):
            exported.setdefault(name, value)
    for name, value in exported.items():
        plan.command += ["-x", name if value is None else f"{name}={value}"]


def mpich_options(args: argparse.Namespace, hosts: Sequence[Host], environ: Mapping[str, str], plan: Plan) -> None:
    """Append MPICH Hydra's options: ranks, hosts, asynchronous progress, the environment."""
    plan.command += ["-n", str(args.workers + args.servers)]
    if args.hosts:
        plan.command += ["-hosts", host_list(hosts)]
    elif args.hostfile:
        plan.command += ["-f", args.hostfile]
    if args.servers > 1 and (len({host.name for host in hosts}) > 1 or args.hostfile):
        plan.command += ["-ppn", "1"]
        plan.reasons.append("several servers on several hosts: -ppn 1 (ranks round-robin over the hosts, so the "
                            "servers, ranks 0..S-1, go one per host first)")
    if "MPIR_CVAR_ASYNC_PROGRESS" not in environ:
        plan.command += ["-genv", "MPIR_CVAR_ASYNC_PROGRESS", "1"]
        plan.reasons.append("MPICH: asynchronous progress, so a worker's Put completes while the server computes")
    exported = passed_variables(environ, args.servers)
    if exported.get("HVD_DCASGD_SERVERS"):
        plan.command += ["-genv", "HVD_DCASGD_SERVERS", exported.pop("HVD_DCASGD_SERVERS")]
    if exported:
        plan.command += ["-genvlist", ",".join(exported)]


def passed_variables(environ: Mapping[str, str], servers: int = 1) -> dict[str, Optional[str]]:
    """The variables every rank gets: the caller's (HVD_DCASGD_*, PYTHONPATH), each with None (its own
    value), and ``HVD_DCASGD_SERVERS`` with the number of servers where that is not the caller's."""
    exported: dict[str, Optional[str]] = {
        name: None for name in sorted(environ) if name.startswith("HVD_DCASGD_") or name in PASSED_VARIABLES}
    if servers != 1 and environ.get("HVD_DCASGD_SERVERS") != str(servers):
        exported["HVD_DCASGD_SERVERS"] = str(servers)
    return exported


def rank_command(args: argparse.Namespace, machine: Machine, plan: Plan) -> None:
    """Append what each rank runs: the script, through the GPU-pinning step when there is a GPU to set."""
    gpus = parse_gpus(args.gpus)
    if gpus is None:
        gpus = machine.gpus
        plan.reasons.append(f"--gpus auto: {len(gpus)} GPU(s) found" + ("" if gpus else ", no pinning"))
    if gpus or args.gpus == NO_GPU:
        pinned = ",".join(gpus) if gpus else NO_GPU
        plan.command += [args.python, str(Path(__file__).resolve()), RANK_EXEC, pinned]
        plan.reasons.append(f"GPUs {pinned}: each rank sets CUDA_VISIBLE_DEVICES, then runs the script")
    else:
        plan.command.append(args.python)
    plan.command += [args.script, *args.script_args]


def build(args: argparse.Namespace, machine: Machine, environ: Mapping[str, str]) -> Plan:
    """The MPI command for ``args`` on ``machine``; reads nothing but a hostfile, runs nothing."""
    args.servers = servers_of(args.servers, environ)
    mpi_args = [word for chunk in args.mpi_arg for word in shlex.split(chunk)]
    hosts = hosts_of(args, machine.flavour)
    plan = Plan([machine.mpirun])
    if args.servers == 1:
        plan.reasons.append(f"{args.workers + 1} ranks: the server (rank 0) and {args.workers} worker(s)")
    else:
        plan.reasons.append(f"{args.workers + args.servers} ranks: {args.servers} servers (ranks 0..{args.servers - 1}, "
                            f"each a slice of the parameters) and {args.workers} worker(s)")
    if machine.flavour == OPEN_MPI:
        open_mpi_options(args, machine, hosts, mpi_args, environ, plan)
    else:
        mpich_options(args, hosts, environ, plan)
    plan.command += mpi_args
    rank_command(args, machine, plan)
    return plan


def find_launcher(requested: Optional[str], environ: Mapping[str, str]) -> tuple[str, str]:
    """The MPI launcher's path and flavour: ``requested``, else ``mpirun``, else ``mpiexec`` on PATH."""
    names = [requested] if requested else ["mpirun", "mpiexec"]
    found = [path for path in (shutil.which(name, path=environ.get("PATH", os.defpath)) for name in names) if path]
    if not found:
        if requested:
            raise LaunchError(f"the MPI launcher {requested} does not exist or is not executable.")
        raise LaunchError(f"no MPI launcher (mpirun or mpiexec) is on PATH; {INSTALL_HINT}.")
    for path in found:
        try:
            version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = version.stdout + version.stderr
        if "Open MPI" in text or "OpenRTE" in text:
            return path, OPEN_MPI
        if "HYDRA" in text or "MPICH" in text:
            return path, MPICH
    raise LaunchError(f"{found[0]} is neither Open MPI's nor MPICH's launcher (by its --version); {INSTALL_HINT}, "
                      f"or name one with --mpirun.")


def physical_cores() -> int:
    """Cores this process may run on, hyperthreads counted once (Open MPI's default slots on one node)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def local_gpus(environ: Mapping[str, str]) -> tuple[str, ...]:
    """GPU ids for ``--gpus auto``: CUDA_VISIBLE_DEVICES if set, else one per line of ``nvidia-smi -L``."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return tuple(part.strip() for part in environ["CUDA_VISIBLE_DEVICES"].split(",") if part.strip())
    nvidia_smi = shutil.which("nvidia-smi", path=environ.get("PATH", os.defpath))
    if not nvidia_smi:
        return ()
    try:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if listing.returncode != 0:
        return ()
    return tuple(str(i) for i, _ in enumerate(line for line in listing.stdout.splitlines() if line.startswith("GPU ")))


def has_ucx_rdma(mpirun: str, environ: Mapping[str, str]) -> bool:
    """Whether Open MPI has osc/ucx and this node an RDMA device (InfiniBand, RoCE) for it to use."""
    rdma = Path("/sys/class/infiniband")
    if not (rdma.is_dir() and any(rdma.iterdir())):
        return False
    ompi_info = shutil.which("ompi_info", path=os.pathsep.join([str(Path(mpirun).parent), environ.get("PATH", "")]))
    if not ompi_info:
        return False
    try:
        listing = subprocess.run([ompi_info], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.split()[:3] == ["MCA", "osc:", "ucx"] for line in listing.splitlines())


def probe(args: argparse.Namespace, environ: Mapping[str, str]) -> Machine:
    """Look at this machine: the MPI, root or not, cores, GPUs (for ``--gpus auto``), RDMA (for several nodes)."""
    mpirun, flavour = find_launcher(args.mpirun, environ)
    several_nodes = len({host.name for host in hosts_of(args, flavour)}) > 1
    return Machine(
        flavour=flavour,
        mpirun=mpirun,
        is_root=hasattr(os, "geteuid") and os.geteuid() == 0,
        cores=physical_cores(),
        gpus=local_gpus(environ) if args.gpus == "auto" else (),
        ucx_rdma=flavour == OPEN_MPI and several_nodes and has_ucx_rdma(mpirun, environ),
    )


def servers_of(requested: Optional[int], environ: Mapping[str, str]) -> int:
    """The number of servers: ``--servers``, else ``HVD_DCASGD_SERVERS`` (already checked), else 1."""
    servers = requested if requested is not None else int(environ.get("HVD_DCASGD_SERVERS", "").strip() or 1)
    if servers < 1:
        raise LaunchError(f"--servers must be at least 1 (got {servers}).")
    return servers


def gpu_for_rank(world_rank: int, local_rank: int, gpus: Sequence[str]) -> str:
    """The GPU id of one rank: with one GPU every rank shares it; else the server (rank 0) takes the first,
    the workers on its node the others in turn, and the workers on other nodes all of them in turn.

    A rank is on the server's node when its world rank equals its node-local rank: the launcher lets
    the MPI fill the first host first, so that node holds ranks 0..k-1.
    """
    if len(gpus) == 1:
        return gpus[0]
    if world_rank != local_rank:
        return gpus[local_rank % len(gpus)]
    if local_rank == 0:
        return gpus[0]
    return gpus[1 + (local_rank - 1) % (len(gpus) - 1)]


def visible_devices(world_rank: int, local_rank: int, gpus: Sequence[str], servers: int = 1) -> str:
    """``CUDA_VISIBLE_DEVICES`` of one rank: every GPU of ``gpus``, turned so that the rank's own
    (:func:`gpu_for_rank`) stands at the index ``hvd.local_rank()`` returns in it -- its place among the ranks
    of its role (servers, or workers) on its node -- so that Horovod's ``torch.cuda.set_device(hvd.local_rank())``
    selects it unchanged (and a server, which takes the device of its index among the servers on its node,
    too).  Where a node holds more ranks of a role than GPUs, that index does not exist in any list: the rank
    sees its own GPU alone, as ``cuda:0`` (``hvd.local_rank() % torch.cuda.device_count()`` finds it).

    The ranks are placed in blocks: a node whose world ranks start at 0 holds the servers first.
    """
    own = gpu_for_rank(world_rank, local_rank, gpus)
    index = local_rank - servers if world_rank == local_rank and world_rank >= servers else local_rank
    if index >= len(gpus):
        return own
    start = (list(gpus).index(own) - index) % len(gpus)
    return ",".join([*gpus[start:], *gpus[:start]])


def rank_number(names: Sequence[str], environ: Mapping[str, str]) -> int:
    """The first of ``names`` set in ``environ``, as a number."""
    for name in names:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    raise LaunchError(f"{RANK_EXEC} runs inside an MPI job, but none of {', '.join(names)} is set.")


def rank_exec(argv: Sequence[str]) -> int:
    """Per rank: set CUDA_VISIBLE_DEVICES from the rank's place (:func:`visible_devices`), then become
    ``python SCRIPT ARGS``."""
    if len(argv) < 2:
        raise LaunchError(f"{RANK_EXEC} takes the GPU list (or none, or visible), the script and its arguments.")
    pinned, script, script_args = argv[0], argv[1], list(argv[2:])
    if pinned == VISIBLE:  # the GPUs this process was given (a SLURM step's on this node)
        pinned = ",".join(part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                          if part.strip()) or NO_GPU
    if pinned == NO_GPU:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    else:
        world_rank = rank_number(WORLD_RANK_VARIABLES, os.environ)
        local_rank = rank_number(LOCAL_RANK_VARIABLES, os.environ)
        servers = os.environ.get("HVD_DCASGD_SERVERS", "1")
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices(world_rank, local_rank, pinned.split(","),
                                                             int(servers) if servers.isdigit() else 1)
    os.execv(sys.executable, [sys.executable, script, *script_args])


def launch(argv: Sequence[str]) -> int:
    """Parse, check, build the command; print it (dry run) or run it."""
    from ..common.config import check_environment  # here: the per-rank step runs this file by path, outside the package

    args = parser().parse_args(argv)
    problems = check_environment(os.environ)
    if problems:
        raise LaunchError(" ".join(p.removeprefix("hvd_dcasgd: ") for p in problems))
    if args.workers < 1:
        raise LaunchError(f"-n/--workers must be at least 1 (got {args.workers}).")
    if not Path(args.script).is_file():
        raise LaunchError(f"the training script {args.script} does not exist.")
    parse_gpus(args.gpus)
    plan = build(args, probe(args, os.environ), os.environ)
    for note in plan.notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    if args.verbose:
        for reason in plan.reasons:
            print(f"{PROG}: {reason}", file=sys.stderr)
    if args.dry_run:
        print(shlex.join(plan.command))
        return 0
    if args.verbose:
        print(f"{PROG}: {shlex.join(plan.command)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    return run_relaying_stops(plan.command)


def run_relaying_stops(command: Sequence[str]) -> int:
    """Run the MPI launcher and return its exit status.  The first SIGTERM,
    SIGINT or SIGUSR1 this process gets is sent to it as SIGUSR1, which it
    forwards to every rank at once: the ranks stop after their current step,
    the server writes a checkpoint, and the job ends with status 75.  (Told
    SIGTERM itself, Open MPI's mpirun would first wait, then give the ranks
    ``odls_base_sigkill_timeout`` seconds.)  Later ones are relayed the same
    way (the ranks only count them: the job stops once), unless one comes
    ``HVD_DCASGD_STOP_GRACE`` seconds or more after the first: that one goes
    on as it is, and mpirun ends the job at once."""
    import signal
    import time

    from ..common.config import resolve

    grace = resolve("HVD_DCASGD_STOP_GRACE") or None
    child = subprocess.Popen(list(command))
    first: List[float] = []  # when the first stop signal came

    def relay(number, frame):
        now = time.monotonic()
        if not first:
            first.append(now)
        at_once = grace is not None and now - first[0] >= grace
        child.send_signal(number if at_once else signal.SIGUSR1)

    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), relay)
    status = child.wait()
    return 128 - status if status < 0 else status


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``hvd-dcasgd-run``: the MPI job's exit status, or 2 with one sentence on a bad launch."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == [RANK_EXEC]:
            return rank_exec(argv[1:])
        return launch(argv)
    except LaunchError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: cannot start {exc.filename or 'the command'} ({exc.strerror}).", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

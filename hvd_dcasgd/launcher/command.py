"""The MPI command ``hvd-dcasgd-run`` runs: hosts, ranks, the one-sided
component, the environment every rank gets (``HVD_DCASGD_GPUS`` from
``--gpus`` among it) and what each rank runs, for Open MPI's ``mpirun`` or
MPICH's ``mpiexec``, with the reason for each choice (:func:`build`; it reads
nothing but a hostfile and runs nothing)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

if TYPE_CHECKING:
    from .probe import Machine

OPEN_MPI, MPICH = "openmpi", "mpich"


class LaunchError(Exception):
    """A launch that cannot go ahead; the message is one sentence for the user."""


# Open MPI parameters that together choose how one-sided operations travel.
ONE_SIDED_MCA = ("pml", "btl", "osc")
# Environment variables whose caller's value every rank gets, besides HVD_DCASGD_*.
PASSED_VARIABLES = ("PYTHONPATH",)
PT2PT_NOTE = (
    "note: several nodes without an RDMA network: one-sided operations use Open MPI's osc/pt2pt over TCP, "
    "which refuses MPI_THREAD_MULTIPLE, so the ranks run at thread level serialized with the Horovod "
    "integration off (HVD_DCASGD_THREAD_LEVEL=serialized, HVD_DCASGD_HOROVOD=0)"
)


@dataclass(frozen=True)
class Host:
    """One host of the job and its number of slots (None: the MPI decides)."""

    name: str
    slots: Optional[int]


@dataclass
class Plan:
    """The command to run, notes every user should see, and the reasons behind each choice."""

    command: list[str]
    notes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


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


def parse_gpus(value: Optional[str]) -> Optional[str]:
    """``--gpus`` checked as ``HVD_DCASGD_GPUS`` is, written as every rank gets it (None: not given)."""
    from ..common.config import VARIABLES

    if value is None:
        return None
    try:
        parsed = VARIABLES["HVD_DCASGD_GPUS"].parse(value)
    except ValueError as exc:
        raise LaunchError(f"--gpus {value!r} is not valid: {exc}.") from None
    return parsed if isinstance(parsed, str) else ",".join(parsed)


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

    exported = passed_variables(environ, args.servers, parse_gpus(args.gpus))
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
    exported = passed_variables(environ, args.servers, parse_gpus(args.gpus))
    for name, value in exported.items():
        if value is not None:
            plan.command += ["-genv", name, value]
    if any(value is None for value in exported.values()):
        plan.command += ["-genvlist", ",".join(name for name, value in exported.items() if value is None)]


def passed_variables(environ: Mapping[str, str], servers: int = 1, gpus: Optional[str] = None
                     ) -> dict[str, Optional[str]]:
    """The variables every rank gets: the caller's (HVD_DCASGD_*, PYTHONPATH), each with None (its own
    value); ``HVD_DCASGD_SERVERS`` with the number of servers and ``HVD_DCASGD_GPUS`` with ``--gpus``
    (None: not given) where those are not the caller's."""
    exported: dict[str, Optional[str]] = {
        name: None for name in sorted(environ) if name.startswith("HVD_DCASGD_") or name in PASSED_VARIABLES}
    if servers != 1 and environ.get("HVD_DCASGD_SERVERS") != str(servers):
        exported["HVD_DCASGD_SERVERS"] = str(servers)
    if gpus is not None and environ.get("HVD_DCASGD_GPUS") != gpus:
        exported["HVD_DCASGD_GPUS"] = gpus
    return exported


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
    gpus = parse_gpus(args.gpus)
    if gpus is not None:
        plan.reasons.append(f"--gpus {gpus}: every rank gets HVD_DCASGD_GPUS={gpus}, and hvd.init() places it")
    plan.command += [args.python, args.script, *args.script_args]
    return plan


def servers_of(requested: Optional[int], environ: Mapping[str, str]) -> int:
    """The number of servers: ``--servers``, else ``HVD_DCASGD_SERVERS`` (already checked), else 1."""
    servers = requested if requested is not None else int(environ.get("HVD_DCASGD_SERVERS", "").strip() or 1)
    if servers < 1:
        raise LaunchError(f"--servers must be at least 1 (got {servers}).")
    return servers

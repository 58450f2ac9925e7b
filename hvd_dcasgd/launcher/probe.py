"""What ``hvd-dcasgd-run`` finds on this machine before it builds a
command: the MPI launcher and its flavour, root or not, the cores and an RDMA
fabric (for several nodes).  The GPUs are each rank's to find, on its own
node (``hvd_dcasgd/runtime/gpus.py``)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from .command import MPICH, OPEN_MPI, LaunchError, hosts_of

INSTALL_HINT = "install Open MPI (Debian: `apt-get install openmpi-bin libopenmpi-dev`) or MPICH"


@dataclass(frozen=True)
class Machine:
    """What the launcher found here: the MPI launcher, the user, the cores, the fabric."""

    flavour: str
    mpirun: str
    is_root: bool = False
    cores: int = 1
    ucx_rdma: bool = False


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
    """Look at this machine: the MPI, root or not, cores, RDMA (for several nodes)."""
    mpirun, flavour = find_launcher(args.mpirun, environ)
    several_nodes = len({host.name for host in hosts_of(args, flavour)}) > 1
    return Machine(
        flavour=flavour,
        mpirun=mpirun,
        is_root=hasattr(os, "geteuid") and os.geteuid() == 0,
        cores=physical_cores(),
        ucx_rdma=flavour == OPEN_MPI and several_nodes and has_ucx_rdma(mpirun, environ),
    )

"""The per-rank step of ``hvd-dcasgd-run`` with GPUs: set the rank's
``CUDA_VISIBLE_DEVICES`` from its place in the job, then become the training
script.

    python .../hvd_dcasgd/launcher/rank.py --rank-exec GPUS SCRIPT ARGS...

Each rank runs this file by path, before anything else loads, so that this
step does not import the package (and torch) a second time: it uses the
standard library only and imports nothing of the package.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # Run by path: this folder holds the launcher's modules, which must not
    # shadow the standard library's for the imports below.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]

from typing import Mapping, Sequence

RANK_EXEC = "--rank-exec"
NO_GPU = "none"
#: ``--rank-exec visible``: pin among the GPUs in this process's own ``CUDA_VISIBLE_DEVICES``.
VISIBLE = "visible"
# Where launchers put a rank's index on its node and in the job, first match wins.
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID")
WORLD_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


class LaunchError(Exception):
    """A launch that cannot go ahead; the message is one sentence for the user."""


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


if __name__ == "__main__":
    if sys.argv[1:2] != [RANK_EXEC]:
        sys.exit(f"usage: {sys.argv[0]} {RANK_EXEC} GPUS SCRIPT ARGS...")
    try:
        sys.exit(rank_exec(sys.argv[2:]))
    except LaunchError as exc:
        print(f"hvd-dcasgd-run: {exc}", file=sys.stderr)
        sys.exit(2)

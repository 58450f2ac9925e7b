"""Which GPUs a rank sees, decided in ``init()`` from the ranks really on
its node: the GPU ids ``HVD_DCASGD_GPUS`` names (:func:`gpu_ids`), each
node rank's own GPU given the roles of the node's ranks (:func:`assign`), and
the ``CUDA_VISIBLE_DEVICES`` that puts a rank's own GPU at the index
``hvd.local_rank()`` returns (:func:`visible`; :func:`decide` puts them
together for one rank).  Pure functions of their arguments, but for
:func:`nvidia_smi_ids`, which asks ``nvidia-smi``, and :func:`cuda_started`,
which asks whether CUDA has read ``CUDA_VISIBLE_DEVICES`` already.

The rule, on each node with k GPUs: the node's servers take the first GPUs,
one each in server order; its workers spread over the others in turn -- over
all k where the node has no server, or where its servers took them all (then
they share, round-robin).  One GPU: every rank shares it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["AUTO", "KEEP", "NONE", "NodeRank", "assign", "cuda_started", "decide", "gpu_ids", "listed",
           "nvidia_smi_ids", "visible"]

AUTO, NONE, KEEP = "auto", "none", "keep"
#: ``HVD_DCASGD_GPUS`` as :mod:`..common.config` parses it: one of the words above, or GPU ids.
Choice = Union[str, Tuple[str, ...]]


@dataclass(frozen=True)
class NodeRank:
    """What one rank of a node tells the others: its role, its ``HVD_DCASGD_GPUS``
    and its ``CUDA_VISIBLE_DEVICES`` as ids (``None``: unset)."""

    server: bool
    choice: Choice = AUTO
    visible: Optional[Tuple[str, ...]] = None

    @property
    def needs_listing(self) -> bool:
        """Whether its GPUs are ``nvidia-smi``'s (``auto`` with no ``CUDA_VISIBLE_DEVICES``)."""
        return self.choice == AUTO and self.visible is None


def listed(text: Optional[str]) -> Optional[Tuple[str, ...]]:
    """The ids of a ``CUDA_VISIBLE_DEVICES`` value (``None``: unset)."""
    if text is None:
        return None
    return tuple(part.strip() for part in text.split(",") if part.strip())


def nvidia_smi_ids(environ: Mapping[str, str]) -> Tuple[str, ...]:
    """One id per GPU line of ``nvidia-smi -L`` (0, 1, ...); none without ``nvidia-smi`` or when it fails."""
    found = shutil.which("nvidia-smi", path=environ.get("PATH", os.defpath))
    if not found:
        return ()
    try:
        listing = subprocess.run([found, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if listing.returncode != 0:
        return ()
    return tuple(str(i) for i, _ in enumerate(line for line in listing.stdout.splitlines() if line.startswith("GPU ")))


#: What CUDA's driver answers a call made before it started (``cuInit``).
CUDA_ERROR_NOT_INITIALIZED = 3


def cuda_started(driver: str = "libcuda.so.1") -> bool:
    """Whether CUDA has started in this process, and so read ``CUDA_VISIBLE_DEVICES`` for good: torch says
    so (``torch.cuda.is_initialized()``, asked only if the script imported torch), or CUDA's driver, already
    loaded in the process, answers other than "not initialized" (``torch.cuda.is_available()`` starts it
    without torch counting CUDA as initialized).  Loads nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    if not hasattr(os, "RTLD_NOLOAD"):
        return False
    try:
        loaded = ctypes.CDLL(driver, mode=os.RTLD_NOLOAD)
    except OSError:  # not loaded: nothing in this process has called CUDA
        return False
    context = ctypes.c_void_p()
    return loaded.cuCtxGetCurrent(ctypes.byref(context)) != CUDA_ERROR_NOT_INITIALIZED


def gpu_ids(rank: NodeRank, listing: Tuple[str, ...] = ()) -> Optional[Tuple[str, ...]]:
    """The GPUs a rank places itself among: the ids named, none (``none``), its
    ``CUDA_VISIBLE_DEVICES`` or else ``listing`` (``auto``); ``None`` for ``keep``."""
    if rank.choice == KEEP:
        return None
    if rank.choice == NONE:
        return ()
    if rank.choice == AUTO:
        return rank.visible if rank.visible is not None else tuple(listing)
    return tuple(rank.choice)


def assign(servers: Sequence[bool], gpus: Sequence[str]) -> List[str]:
    """The own GPU of each rank of a node (``servers``: whether each is a
    server, in the order of their world ranks) among ``gpus`` (at least one)."""
    count = sum(servers)
    free = list(gpus[count:]) or list(gpus)  # the workers': what the servers left, else all of them
    own, server, worker = [], 0, 0
    for is_server in servers:
        if is_server:
            own.append(gpus[server % len(gpus)])
            server += 1
        else:
            own.append(free[worker % len(free)])
            worker += 1
    return own


def visible(own: str, index: int, gpus: Sequence[str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a rank whose GPU is ``own`` and whose
    ``hvd.local_rank()`` is ``index``: every GPU of ``gpus``, turned so that
    ``own`` stands at ``index``; ``own`` alone (``cuda:0``) where ``index`` is
    past the list."""
    if index >= len(gpus):
        return own
    start = (list(gpus).index(own) - index) % len(gpus)
    return ",".join([*gpus[start:], *gpus[:start]])


def decide(node: Sequence[NodeRank], me: int, listing: Tuple[str, ...] = ()) -> Optional[str]:
    """The ``CUDA_VISIBLE_DEVICES`` rank ``me`` of ``node`` (every rank of its
    node, in world-rank order) sets, or ``None`` to leave it as it is:
    ``keep``; ``auto`` with no GPU found; or another rank of the node placing
    itself among other GPUs (each was given its own, by the cluster)."""
    gpus = gpu_ids(node[me], listing)
    if gpus is None or (not gpus and node[me].choice == AUTO):
        return None
    if not gpus:
        return ""
    if any(gpu_ids(rank, listing) not in (None, gpus) for rank in node):
        return None
    roles = [rank.server for rank in node]
    index = sum(1 for rank in node[:me] if rank.server == node[me].server)  # its hvd.local_rank()
    return visible(assign(roles, gpus)[me], index, gpus)

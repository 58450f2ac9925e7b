"""The agreement at a session's start: every rank describes its model and
settings (:class:`.messages.Description`), the server checks that they agree,
and a mismatch is the same sentence on every rank, never a hang."""

from __future__ import annotations

from typing import Any, List, Tuple

import torch

from ..algorithm.compensation import Compensation
from ..common.errors import HvdDcasgdError
from ..protocol.layout import ModelLayout
from ..runtime.roles import SERVER, Runtime
from .messages import Description


def _disagreements(server: Description, descriptions: List[Description]) -> List[str]:
    problems = []
    for m, worker in enumerate(descriptions):
        theirs, mine = worker.compensation, server.compensation
        if theirs["mode"] != mine["mode"]:
            problems.append(
                f"hvd_dcasgd: the server runs compensation {mine['mode']!r} but worker {m} asks for "
                f"{theirs['mode']!r}; every rank must use the same mode (check HVD_DCASGD_COMPENSATION)."
            )
        elif theirs["schedule"] != mine["schedule"]:
            problems.append(
                f"hvd_dcasgd: the server runs the {mine['schedule']!r} schedule but worker {m} asks for "
                f"{theirs['schedule']!r}; every rank must use the same (check HVD_DCASGD_SCHEDULE)."
            )
        elif theirs != mine:
            problems.append(
                f"hvd_dcasgd: worker {m}'s compensation settings {theirs} differ from the server's {mine}; "
                f"every rank must use the same (check HVD_DCASGD_LAMBDA, HVD_DCASGD_BOUND and the other constants' "
                f"variables)."
            )
        elif worker.lr_scaling != server.lr_scaling:
            problems.append(
                f"hvd_dcasgd: the server applies lr_scaling {server.lr_scaling!r} but worker {m} asks for "
                f"{worker.lr_scaling!r}; every rank must use the same (check HVD_DCASGD_LR_SCALING)."
            )
        if worker.wire != server.wire:
            problems.append(
                f"hvd_dcasgd: worker {m} compresses gradients to {worker.wire}, the server expects "
                f"{server.wire}; every rank must use the same compression."
            )
        difference = server.layout.mismatch(worker.layout)
        if difference:
            problems.append(f"hvd_dcasgd: worker {m}'s model does not match the server's: {difference}.")
    return problems


def agree(rt: Runtime, comm: Any, layout: ModelLayout, compensation: Compensation, wire_dtype: torch.dtype,
          check_finite: bool = False, *, lr_scaling: str) -> List[Tuple[str, Description]]:
    """Raise the same clear error on every rank of ``comm`` (a server's
    session) unless all its ranks agree.  Returns (on the server) each
    worker's name for messages (index, MPI rank, host) and description."""
    mine = Description.of(layout, compensation, wire_dtype, rt.mpi.Get_processor_name(), check_finite, lr_scaling)
    gathered = comm.gather(mine, root=0)
    problems = _disagreements(gathered[0], gathered[1:]) if rt.role == SERVER else None
    problems = comm.bcast(problems, root=0)
    if problems:
        raise HvdDcasgdError("\n".join(problems), collective=True, speaks=comm.Get_rank() == 0)
    if rt.role != SERVER:
        return []
    return [(f"worker {m} (MPI rank {m + rt.servers}, host {d.host})", d) for m, d in enumerate(gathered[1:])]

"""Helpers shared by the benchmarks: a flat model and a server on real windows."""

from __future__ import annotations

import torch

from hvd_dcasgd.algorithm.compensation import Compensation
from hvd_dcasgd.algorithm.endpoints import open_server
from hvd_dcasgd.protocol.layout import ModelLayout
from hvd_dcasgd.runtime.mpi import load_mpi
from hvd_dcasgd.algorithm.server import ParameterServer


def flat_model(numel: int) -> torch.nn.Module:
    """A model with one flat parameter of ``numel`` elements."""
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(numel))
    return model


def single_rank_server(model: torch.nn.Module, optimizer: torch.optim.Optimizer, mode: str, workers: int,
                       device: torch.device) -> ParameterServer:
    """A ParameterServer over real MPI windows on this rank alone (COMM_SELF)."""
    layout = ModelLayout.of(optimizer, model.named_parameters())
    server = open_server(load_mpi().COMM_SELF, optimizer, layout, Compensation(mode), num_workers=workers,
                         device=device, checked_by_workers=[True] * workers)  # as in a job: workers check_finite
    for message in server.messages:
        message.gradient.normal_()
        message.lrs.fill_(1e-3)
    return server

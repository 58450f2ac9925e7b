"""Helpers shared by the benchmarks: a flat model and a server on real windows."""

from __future__ import annotations

import torch

from hvd_dcasgd.channel import ServerChannel, control_words
from hvd_dcasgd.compensation import Compensation
from hvd_dcasgd.layout import ModelLayout, PushMessage
from hvd_dcasgd.mpi import load_mpi
from hvd_dcasgd.server import ParameterServer
from hvd_dcasgd.telemetry import Telemetry
from hvd_dcasgd.transport import ControlWords, Mailboxes


def flat_model(numel: int) -> torch.nn.Module:
    """A model with one flat parameter of ``numel`` elements."""
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(numel))
    return model


def single_rank_server(model: torch.nn.Module, optimizer: torch.optim.Optimizer, mode: str, workers: int,
                       device: torch.device) -> ParameterServer:
    """A ParameterServer over real MPI windows on this rank alone (COMM_SELF)."""
    mpi = load_mpi()
    layout = ModelLayout.of(optimizer, model.named_parameters())
    control = ControlWords(mpi, mpi.COMM_SELF, control_words(workers))
    inbox = PushMessage.size(layout, layout.dtype)
    mailboxes = Mailboxes(mpi, mpi.COMM_SELF, workers, inbox, layout.numel * layout.dtype.itemsize)
    channel = ServerChannel(control, mailboxes, workers)
    server = ParameterServer(optimizer, layout, Compensation(mode), mailboxes, channel, layout.dtype, device,
                             Telemetry(workers))
    for message in server.messages:
        message.gradient.normal_()
        message.lrs.fill_(1e-3)
    return server

"""A worker's exchange with the server: push the gradient, pull the weights.

Gradients are packed into one contiguous message (learning rates, then the
gradient in the wire dtype): one Put.  The server's answer, its new weights,
arrives in one host buffer: one Get.  CPU parameters are views of that buffer,
so the next forward pass runs on the server's weights with no copy; others
(a worker's GPU) are loaded from it.
"""

from __future__ import annotations

from typing import List

import torch

from .channel import WorkerChannel
from .errors import HvdDcasgdError
from .layout import ModelLayout, PushMessage, trained_parameters
from .tensors import byte_view, copy_checked_


class Worker:
    """Packs, checks and exchanges one worker's gradients."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        layout: ModelLayout,
        channel: WorkerChannel,
        wire_dtype: torch.dtype,
        check_finite: bool = True,
    ):
        self.optimizer = optimizer
        self.layout = layout
        self.channel = channel
        self.check_finite = check_finite
        self.params: List[torch.Tensor] = trained_parameters(optimizer)
        self.message = PushMessage(layout, wire_dtype)
        self.gradient_views = layout.views(self.message.gradient)
        self.weights = torch.empty(layout.numel, dtype=layout.dtype)
        self.weight_views = layout.views(self.weights)
        # CPU parameters become views of the receive buffer: the server's
        # weights then land in the model directly, with no copy.
        for p, view in zip(self.params, self.weight_views):
            if p.device.type == "cpu" and p.dtype == view.dtype:
                view.copy_(p.detach())
                p.data = view
        self._message_bytes = self.message.bytes.numpy()
        self.weight_bytes = byte_view(self.weights)

    def pack(self) -> None:
        """Copy gradients (zeros where a parameter has none) and learning rates
        into the message; refuse non-finite gradients before anything is sent.
        Copy and check are one pass over each gradient (``copy_checked_``)."""
        finite = True
        for view, p in zip(self.gradient_views, self.params):
            if p.grad is None:
                view.zero_()
            elif self.check_finite:
                finite &= copy_checked_(view, p.grad)
            else:
                view.copy_(p.grad)
        if not finite:
            raise HvdDcasgdError(f"hvd_dcasgd: worker {self.channel.worker}: {self._what_is_not_finite()} at push "
                                 f"{self.channel.pushes}; nothing was pushed and the server's weights are unchanged "
                                 "(lower the learning rate, clip gradients, or catch this error to skip the batch).")
        for i, group in enumerate(self.optimizer.param_groups):
            self.message.lrs[i] = float(group["lr"])

    def _what_is_not_finite(self) -> str:
        """Which gradient is not finite on the wire, and why: a NaN or Inf of
        its own, or finite values the wire dtype cannot hold."""
        wire = self.message.gradient.dtype
        for spec, view, p in zip(self.layout.params, self.gradient_views, self.params):
            if bool(torch.isfinite(view).all()):
                continue
            if wire != self.layout.dtype and p.grad is not None and bool(torch.isfinite(p.grad).all()):
                largest = torch.finfo(wire).max
                name = str(wire).replace("torch.", "")
                return f"the gradient of {spec.name!r} holds finite values beyond {name}'s range (largest {largest:.0f})"
            cast = "" if wire == self.layout.dtype else f" (as {wire})"
            return f"the gradient of {spec.name!r}{cast} holds NaN or Inf"
        return "the gradient holds NaN or Inf"

    def load_weights(self) -> None:
        """Copy the weights last received into the model's parameters."""
        with torch.no_grad():
            for p, view in zip(self.params, self.weight_views):
                if p.data_ptr() != view.data_ptr():  # not (or no longer) a view of the buffer
                    p.copy_(view)

    def exchange(self) -> None:
        """Push this step's gradient and load the weights the server answers with."""
        self.pack()
        self.channel.push(self._message_bytes)
        self.channel.pull(self.weight_bytes)
        self.load_weights()

    def free(self) -> None:
        """Free the channel's windows (collective, with the server's ``free()``)."""
        self.channel.free()

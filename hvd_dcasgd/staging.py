"""Moving tensors between MPI window memory (host) and the server's device.

Open MPI 4.1 cannot expose GPU memory as window memory, so a CUDA server keeps
its model on the GPU and stages every message through page-locked buffers.
Copies go in chunks: the host copy of chunk i+1 overlaps the DMA of chunk i.
On a CPU device the same code runs with plain synchronous copies, which is how
the staged path is tested on machines without a GPU.
"""

from __future__ import annotations

from typing import List

import torch

CHUNKS = 8


def _chunks(numel: int) -> List[slice]:
    step = max(1, -(-numel // CHUNKS))
    return [slice(s, min(s + step, numel)) for s in range(0, numel, step)]


class _NoEvent:
    """Stands in for ``torch.cuda.Event`` on the CPU, where copies are synchronous."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


class Staging:
    """Page-locked bounce buffers between window memory and ``device``."""

    def __init__(self, numel: int, upload_dtype: torch.dtype, download_dtype: torch.dtype, device: torch.device):
        cuda = device.type == "cuda"
        self.upload_buffer = torch.empty(numel, dtype=upload_dtype, pin_memory=cuda)
        self.download_buffer = torch.empty(numel, dtype=download_dtype, pin_memory=cuda)
        self.parts = _chunks(numel)
        event = torch.cuda.Event if cuda else _NoEvent
        self.uploaded = [event() for _ in self.parts]
        self.downloaded = [event() for _ in self.parts]

    def upload(self, host: torch.Tensor, device_out: torch.Tensor) -> None:
        """``device_out <- host``; later work on the current stream sees it."""
        for part, event in zip(self.parts, self.uploaded):
            event.synchronize()  # the previous upload from this chunk is done
            self.upload_buffer[part].copy_(host[part])
            device_out[part].copy_(self.upload_buffer[part], non_blocking=True)
            event.record()

    def download(self, device_in: torch.Tensor, host_out: torch.Tensor) -> None:
        """``host_out <- device_in``, complete on return."""
        for part, event in zip(self.parts, self.downloaded):
            self.download_buffer[part].copy_(device_in[part], non_blocking=True)
            event.record()
        for part, event in zip(self.parts, self.downloaded):
            event.synchronize()
            host_out[part].copy_(self.download_buffer[part])

"""Moving tensors between MPI window memory (host) and the server's device.

Where the MPI library cannot expose GPU memory as window memory (Open MPI
without CUDA support, or without a one-sided component that takes device
memory), a CUDA server keeps its model on the GPU and stages every message
through page-locked host memory.  :func:`choose_staging` decides, in one
place, and says why.

The window memory itself is page-locked (registered with CUDA), so the
device reads the inbox and writes the outbox by DMA, with no host copy;
where registering fails, page-locked bounce buffers stand between.  Copies
go in chunks on lanes of their own (CUDA streams): :func:`pipeline` copies
chunk k+1 in while chunk k is updated and chunk k-1 copied out, each stage
waiting for the event of the stage before it on the same chunk.  On a CPU
device the same code runs on :class:`RecordedLanes`, which does each stage
at once, in the order issued, and records that order, so the chunking and
the order are tested on machines without a GPU.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Callable, Dict, List, Optional, Tuple

import torch

#: Chunks each copy is split into (fewer where a chunk would hold under MIN_CHUNK elements).
CHUNKS = 8
MIN_CHUNK = 1 << 16
IN, UPDATE, OUT = "in", "update", "out"


def chunks(numel: int, count: int = CHUNKS, minimum: int = 1) -> List[slice]:
    """``numel`` elements in at most ``count`` consecutive slices of at least
    ``minimum`` elements (the last may be shorter; one slice when ``numel``
    is smaller), covering them once."""
    if numel <= 0:
        return []
    step = max(minimum, -(-numel // count), 1)
    return [slice(s, min(s + step, numel)) for s in range(0, numel, step)]


class RecordedLanes:
    """Lanes on the CPU: each stage runs at once, in the order issued, and
    ``log`` records ``(lane, chunk, [(lane, chunk) waited for])``."""

    def __init__(self) -> None:
        self.log: List[Tuple[str, int, List[Tuple[str, int]]]] = []

    def begin(self) -> None:
        """A new pipeline: the log holds its stages only."""
        self.log = []

    def run(self, lane: str, chunk: int, after: List[Tuple[str, int]], work: Callable[[], None]) -> None:
        self.log.append((lane, chunk, list(after)))
        work()

    def wait(self, lane: str, chunk: int) -> None:
        """Block the host until ``lane``'s stage of ``chunk`` is done (it is)."""


class CudaLanes:
    """One CUDA stream per lane; each stage records an event that the stages
    after it wait for."""

    def __init__(self, device: torch.device):
        self.device = device
        self.streams = {lane: torch.cuda.Stream(device) for lane in (IN, UPDATE, OUT)}
        self.events: Dict[Tuple[str, int], torch.cuda.Event] = {}

    def begin(self) -> None:
        """A new pipeline: every lane first waits for the work already on
        the current stream (the update that wrote what goes out)."""
        current = torch.cuda.current_stream(self.device)
        for stream in self.streams.values():
            stream.wait_stream(current)
        self.events = {}

    def run(self, lane: str, chunk: int, after: List[Tuple[str, int]], work: Callable[[], None]) -> None:
        stream = self.streams[lane]
        for key in after:
            stream.wait_event(self.events[key])
        with torch.cuda.stream(stream):
            work()
            event = torch.cuda.Event()
            event.record(stream)
        self.events[(lane, chunk)] = event

    def wait(self, lane: str, chunk: int) -> None:
        self.events[(lane, chunk)].synchronize()


def pipeline(count: int, copy_in: Optional[Callable[[int], None]], update: Callable[[int], None],
             copy_out: Optional[Callable[[int], None]], lanes, chunked_update: bool = True) -> None:
    """Run ``copy_in(k)``, ``update(k)``, ``copy_out(k)`` for chunks k =
    0..count-1 on their lanes, issued so that chunk k+1 is copied in while
    chunk k is updated and chunk k-1 copied out; each stage waits for the
    stage before it on its chunk.  Without ``chunked_update`` the update is
    one stage (chunk 0, ``update(-1)``: all of it) after every copy in, and
    the copies out follow it.  Complete on return."""
    lanes.begin()
    if not chunked_update:
        for k in range(count):
            if copy_in is not None:
                lanes.run(IN, k, [], lambda k=k: copy_in(k))
        lanes.run(UPDATE, 0, [(IN, k) for k in range(count)] if copy_in is not None else [], lambda: update(-1))
        for k in range(count):
            if copy_out is not None:
                lanes.run(OUT, k, [(UPDATE, 0)], lambda k=k: copy_out(k))
        _wait_last(lanes, count, copy_out, chunked_update)
        return
    for t in range(count + 2):
        if t < count and copy_in is not None:
            lanes.run(IN, t, [], lambda k=t: copy_in(k))
        k = t - 1
        if 0 <= k < count:
            lanes.run(UPDATE, k, [(IN, k)] if copy_in is not None else [], lambda k=k: update(k))
        k = t - 2
        if 0 <= k < count and copy_out is not None:
            lanes.run(OUT, k, [(UPDATE, k)], lambda k=k: copy_out(k))
    _wait_last(lanes, count, copy_out, chunked_update)


def _wait_last(lanes, count: int, copy_out, chunked_update: bool) -> None:
    if count == 0:
        return
    if copy_out is not None:
        for k in range(count):
            lanes.wait(OUT, k)
    else:
        lanes.wait(UPDATE, count - 1 if chunked_update else 0)


def cuda_aware_mpi() -> Tuple[bool, str]:
    """Whether this Open MPI was built with CUDA support and has a one-sided
    component (osc/ucx) that can take device memory, and how that was told."""
    ompi_info = shutil.which("ompi_info")
    if ompi_info is None:
        return False, "no ompi_info here to ask whether MPI is CUDA-aware"
    try:
        out = subprocess.run([ompi_info, "--parsable", "--all"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"ompi_info could not be run ({exc})"
    if "mpi_built_with_cuda_support:value:true" not in out:
        return False, "Open MPI was built without CUDA support (ompi_info: mpi_built_with_cuda_support false)"
    if "mca:osc:ucx:" not in out:
        return False, "Open MPI is CUDA-aware but has no osc/ucx component for windows in device memory"
    return True, "Open MPI is CUDA-aware with osc/ucx"


def choose_staging(device: torch.device, cuda_aware: Optional[Tuple[bool, str]] = None) -> Tuple[str, str]:
    """How the server's messages reach ``device``, and why, in a few words:
    ``"none"`` (the model is in window memory: a CPU server), or
    ``"pinned"`` (through page-locked host memory).  Windows in device memory
    would skip the staging where MPI is CUDA-aware; the windows are
    allocated in host memory (``MPI.Win.Allocate``), so a CUDA-aware MPI is
    reported and staged through pinned memory all the same."""
    if device.type == "cpu":
        return "none", "the server's model lives in the windows' host memory"
    aware, how = cuda_aware_mpi() if cuda_aware is None else cuda_aware
    if aware:
        return "pinned", f"{how}, but the windows are allocated in host memory: staged through page-locked memory"
    return "pinned", f"{how}: staged through page-locked host memory"


def page_lock(host: torch.Tensor, registered: Dict[int, int]) -> bool:
    """Register the whole storage under ``host`` (window memory) with CUDA
    once, so copies to and from it are DMA, noting it in ``registered``
    (start address -> bytes) for :func:`page_unlock`; False where that
    fails (the caller then uses page-locked bounce buffers)."""
    if host.is_pinned():
        return True
    storage = host.untyped_storage()
    start, size = storage.data_ptr(), storage.nbytes()
    if registered.get(start) == size:
        return True
    try:
        from torch.cuda._pin_memory_utils import pin_memory

        pin_memory(start, size)
    except (ImportError, RuntimeError):
        return False
    registered[start] = size
    return True


def page_unlock(registered: Dict[int, int]) -> None:
    """Unregister what :func:`page_lock` registered (before MPI frees the
    window memory under it), and forget it."""
    from torch.cuda._pin_memory_utils import unpin_memory

    while registered:
        start, _ = registered.popitem()
        unpin_memory(start)


class Staging:
    """Moves a gradient from window memory to ``device`` and weights back, in
    chunks, on lanes (CUDA streams; :class:`RecordedLanes` on the CPU)."""

    def __init__(self, numel: int, upload_dtype: torch.dtype, download_dtype: torch.dtype, device: torch.device):
        self.cuda = device.type == "cuda"
        self.parts = chunks(numel, CHUNKS, MIN_CHUNK if self.cuda else 1)
        self.lanes = CudaLanes(device) if self.cuda else RecordedLanes()
        self.upload_dtype, self.download_dtype = upload_dtype, download_dtype
        self.numel = numel
        self._bounce: Dict[str, torch.Tensor] = {}  # page-locked buffers, where the window cannot be registered
        self._registered: Dict[int, int] = {}  # window memory this staging registered with CUDA
        self.path, self.why = choose_staging(device)

    def _host_side(self, host: torch.Tensor, name: str) -> Tuple[torch.Tensor, bool]:
        """The host tensor the device copies from or to: ``host`` itself
        when it is (or could be made) page-locked, else a page-locked bounce
        buffer (whether one is used)."""
        if not self.cuda or page_lock(host, self._registered):
            return host, False
        if name not in self._bounce:
            self._bounce[name] = torch.empty(self.numel, dtype=host.dtype, pin_memory=True)
        return self._bounce[name], True

    def upload(self, host: torch.Tensor, device_out: torch.Tensor) -> None:
        """``device_out <- host``; complete on return."""
        self.run(host, device_out, None, None, None)

    def download(self, device_in: torch.Tensor, host_out: torch.Tensor) -> None:
        """``host_out <- device_in``, complete on return."""
        self.run(None, None, lambda k: None, device_in, host_out, chunked_update=True)

    def run(self, host_in: Optional[torch.Tensor], device_in: Optional[torch.Tensor],
            update: Optional[Callable[[int], None]], device_out: Optional[torch.Tensor],
            host_out: Optional[torch.Tensor], chunked_update: bool = True) -> None:
        """Copy ``host_in`` to ``device_in``, run ``update(k)`` on each chunk
        k (or ``update(-1)`` once, without ``chunked_update``), copy
        ``device_out`` to ``host_out``, pipelined (:func:`pipeline`);
        complete on return.  Any of the three may be left out."""
        parts = self.parts
        copy_in: Optional[Callable[[int], None]] = None
        copy_out: Optional[Callable[[int], None]] = None
        if host_in is not None:
            source, bounced = self._host_side(host_in, "in")

            def copy_chunk_in(k: int) -> None:
                if bounced:
                    source[parts[k]].copy_(host_in[parts[k]])
                device_in[parts[k]].copy_(source[parts[k]], non_blocking=self.cuda)
            copy_in = copy_chunk_in
        if host_out is not None:
            target, bounced_out = self._host_side(host_out, "out")

            def copy_chunk_out(k: int) -> None:
                target[parts[k]].copy_(device_out[parts[k]], non_blocking=self.cuda)
            copy_out = copy_chunk_out
        pipeline(len(parts), copy_in, update or (lambda k: None), copy_out, self.lanes, chunked_update)
        if host_out is not None and bounced_out:
            host_out.copy_(target)
        if self.cuda and update is None and host_out is None:  # an upload: later work sees it
            torch.cuda.current_stream(device_in.device).wait_stream(self.lanes.streams[UPDATE])

    def close(self) -> None:
        """Wait for every copy, then unregister the window memory this
        staging registered with CUDA (the windows are freed after it)."""
        if self.cuda:
            torch.cuda.synchronize(self.lanes.device)
            page_unlock(self._registered)
        self._bounce.clear()

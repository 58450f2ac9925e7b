"""A worker's exchange with the server: push the gradient, pull the weights.

With S servers (:mod:`.shards`) the worker talks to each over its own
channel: server s's inbox holds the learning rates and s's slice of the
gradient, its outbox s's slice of the weights.  A push issues every
server's Puts before any flush completes them, then announces itself to
each; a pull waits for every server's answer, then issues every Get before
completing them.

A push message is learning rates, then the gradient in the wire dtype, laid
out in one contiguous inbox.  Small gradients are packed into the worker's
copy of the message, checked for NaN and Inf as they are copied; a large one
already in the wire dtype (contiguous, on the CPU) is checked where it lies
and Put from there, with no copy.  The Puts -- one per packed run, one per
large gradient -- are all issued before one flush completes them.  The server's answer, its new weights,
arrives in one host buffer: one Get.  CPU parameters are views of that buffer,
so the next forward pass runs on the server's weights with no copy; others
(a worker's GPU) are loaded from it.

Overlap with backward, as Horovod's fusion buffers do: the parameters are split
into buckets (:func:`buckets`: runs of parameters in the message's order, at
most ``fusion_threshold`` bytes on the wire each, split from the end since
backward produces the last layers' gradients first).  When the optimizer's
gradient hook reports that every gradient of a bucket is final
(:meth:`Worker.gradient_final`), the bucket is packed, checked and Put into
the servers' inboxes at once, without a flush; ``step()`` packs and Puts the
rest (the learning rates, and buckets whose gradients were set by hand or
never computed), completes every Put with one flush and announces the push.
The server sees one push, applied whole, exactly as without buckets: what
``p.grad`` holds when ``step()`` runs is what the server gets.  A bucket
whose gradient was replaced or changed in place after it was sent (clipped,
unscaled: torch's version counter tells) is sent again by ``step()``, and
``synchronize()`` (Horovod's idiom before clipping) completes the Puts issued
and forgets them all (:meth:`Worker.restart`).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..common.errors import HvdDcasgdError
from ..common.tensors import all_finite, byte_view, copy_checked_
from .channel import WorkerChannel
from .layout import ModelLayout, PushMessage, flatten_into, trained_parameters

#: A gradient of at least this many bytes, already in the wire dtype on the
#: CPU, is Put from its own memory; smaller ones are packed together, so that
#: a model of many small tensors still makes few Puts.
DIRECT_PUT_BYTES = 1 << 16



def buckets(sizes: Sequence[int], threshold: int) -> List[Tuple[int, int]]:
    """Runs ``(first, end)`` of consecutive parameters whose wire bytes
    (``sizes``) add up to at most ``threshold`` (a larger parameter is a
    bucket alone), in the message's order, split from the last parameter back;
    ``threshold`` 0: one bucket of them all, sent by ``step()`` alone."""
    if not sizes:
        return []
    if threshold <= 0:
        return [(0, len(sizes))]
    runs, end, total = [], len(sizes), 0
    for i in range(len(sizes) - 1, -1, -1):
        if total and total + sizes[i] > threshold:
            runs.append((i + 1, end))
            end, total = i + 1, 0
        total += sizes[i]
    runs.append((0, end))
    return runs[::-1]


class Worker:
    """Packs, checks and exchanges one worker's gradients."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        layout: ModelLayout,
        channels: Sequence[WorkerChannel],
        wire_dtype: torch.dtype,
        check_finite: bool = True,
        slices: Optional[Sequence[Tuple[int, int]]] = None,
    ):
        """``channels[s]`` leads to the server of ``slices[s]`` (elements of
        the flat vector; default: one server holding all of it)."""
        self.optimizer = optimizer
        self.layout = layout
        self.channels = list(channels)
        self.slices = list(slices) if slices is not None else [(0, layout.numel)]
        if len(self.slices) != len(self.channels):
            raise HvdDcasgdError(f"hvd_dcasgd: {len(self.channels)} channels for {len(self.slices)} slices")
        for channel in self.channels:  # waiting for one server, the worker tells the others it is alive
            channel.peers = [other for other in self.channels if other is not channel]
        self.check_finite = check_finite
        self.params: List[torch.Tensor] = trained_parameters(optimizer)
        # a model on a GPU copies its gradients into the message and its weights out of the receive
        # buffer by DMA: both page-locked, so no copy goes through an extra host buffer
        pinned = any(p.device.type == "cuda" for p in self.params)
        self.message = PushMessage(layout, wire_dtype, torch.zeros(PushMessage.size(layout, wire_dtype),
                                                                   dtype=torch.uint8, pin_memory=pinned))
        self.gradient_views = layout.views(self.message.gradient)
        self.weights = torch.empty(layout.numel, dtype=layout.dtype, pin_memory=pinned)
        self.weight_views = layout.views(self.weights)
        # CPU parameters become views of the receive buffer: the server's
        # weights then land in the model directly, with no copy.
        for p, view in zip(self.params, self.weight_views):
            if p.device.type == "cpu" and p.dtype == view.dtype:
                view.copy_(p.detach())
                p.data = view
        self._message_bytes = self.message.bytes.numpy()
        size = self.message.gradient.element_size()
        self._spans = [(self.message.header_bytes + size * a, self.message.header_bytes + size * b)
                       for a, b in zip(layout.offsets, layout.offsets[1:])]  # each gradient's bytes in the message
        self.weight_bytes = byte_view(self.weights)
        header, weight_size = self.message.header_bytes, self.weights.element_size()
        self._shard_spans = [(header + size * a, header + size * b) for a, b in self.slices]  # in the message
        self.weight_slices = [self.weight_bytes[weight_size * a:weight_size * b] for a, b in self.slices]
        self.overlapped = 0  # buckets Put from a gradient hook, during backward
        self.set_fusion_threshold(0)

    def set_fusion_threshold(self, threshold: int) -> None:
        """Split the gradient into buckets of at most ``threshold`` bytes, each
        sent as soon as backward has finished it (0: all sent by ``step()``)."""
        if threshold and any(p.device.type != "cpu" for p in self.params) and not self._threads_may_call_mpi():
            threshold = 0  # a GPU's gradient hooks run on autograd's device thread
        self.fusion_threshold = threshold
        size = self.message.gradient.element_size()
        self.buckets = buckets([spec.numel * size for spec in self.layout.params], threshold)
        self._bucket_of: Dict[int, int] = {id(p): b for b, (first, end) in enumerate(self.buckets)
                                           for p in self.params[first:end]}
        self._hooked = [sum(p.requires_grad for p in self.params[first:end]) for first, end in self.buckets]
        self.restart()

    @staticmethod
    def _threads_may_call_mpi() -> bool:
        """Whether MPI runs at a thread level that lets another thread call
        it (``serialized`` or ``multiple``, as hvd_dcasgd asks by default)."""
        from ..runtime.mpi import load_mpi

        mpi = load_mpi()
        return mpi.Query_thread() >= mpi.THREAD_SERIALIZED

    def restart(self) -> None:
        """Complete the Puts of buckets sent so far and forget them: the
        next ``step()`` sends every bucket (again)."""
        if any(sent is not None for sent in getattr(self, "_sent", ())):
            self._flush()
        # per bucket: None, or, once sent, (its gradients with their versions, whether they were finite)
        self._sent: List[Optional[Tuple[List[Tuple[Optional[torch.Tensor], int]], bool]]] = [None] * len(self.buckets)
        # gradients each bucket still waits for (none to wait for: it goes with step())
        self._waiting = list(self._hooked) if self.fusion_threshold > 0 else [0] * len(self.buckets)

    def _flush(self) -> None:
        for channel in self.channels:
            channel.mailboxes.flush()

    def gradient_final(self, param: torch.Tensor) -> None:
        """``param``'s gradient is final for this step (its last backward
        pass is done): when it is its bucket's last, send the bucket."""
        b = self._bucket_of.get(id(param))
        if b is None or self._waiting[b] <= 0:
            return
        self._waiting[b] -= 1
        if self._waiting[b] == 0:
            first, end = self.buckets[b]
            pieces, finite = self._pack_params(first, end, self._spans[first][0])
            for channel, own in zip(self.channels, self.per_server(pieces)):
                channel.send(own)  # a server that stops answering is watched from here on
            self._sent[b] = (self._gradients(b), finite)
            self.overlapped += 1

    def _gradients(self, b: int) -> List[Tuple[Optional[torch.Tensor], int]]:
        """Bucket ``b``'s gradients as they are now: each tensor and its
        version (torch counts every change made in place)."""
        first, end = self.buckets[b]
        return [(p.grad, -1 if p.grad is None else p.grad._version) for p in self.params[first:end]]

    def _changed_since_sent(self) -> List[int]:
        """The buckets sent during backward whose gradients were replaced or
        changed in place since (a script that clips or scales them)."""
        return [b for b, sent in enumerate(self._sent)
                if sent is not None and any(g is not now or v != version
                                            for (g, v), (now, version) in zip(sent[0], self._gradients(b)))]

    @property
    def index(self) -> int:
        """This worker's index among the workers."""
        return self.channels[0].worker

    @property
    def pushes(self) -> int:
        """Pushes made (every server gets each one)."""
        return self.channels[0].pushes

    @property
    def stopping(self) -> bool:
        """A server's last answer said: stop after this step."""
        return any(channel.stopping for channel in self.channels)

    def per_server(self, pieces: List[Tuple[int, np.ndarray]]) -> List[List[Tuple[int, np.ndarray]]]:
        """The message's ``(offset, bytes)`` pieces as each server's inbox
        holds them: the learning rates, then its slice of the gradient."""
        if len(self._shard_spans) == 1:  # one server: its inbox holds the whole message
            return [pieces]
        header = self.message.header_bytes
        shards = []
        for start, end in self._shard_spans:
            own = []
            for offset, data in pieces:
                stop = offset + len(data)
                if offset < header:
                    own.append((offset, data[: min(stop, header) - offset]))
                lo, hi = max(offset, start), min(stop, end)
                if lo < hi:
                    own.append((header + lo - start, data[lo - offset:hi - offset]))
            shards.append(own)
        return shards

    def pack(self) -> List[Tuple[int, np.ndarray]]:
        """The message, less the buckets already sent, as ``(offset, bytes)``
        pieces: learning rates and small gradients (zeros where a parameter
        has none) copied into the message, large ones as they lie.
        Non-finite gradients are refused before the push is announced; each
        gradient is read once by the check (``copy_checked_`` copies and
        checks in the same pass)."""
        for i, group in enumerate(self.optimizer.param_groups):
            self.message.lrs[i] = float(group["lr"])
        header = self.message.header_bytes
        changed = self._changed_since_sent()
        if changed:  # complete their Puts before Putting the same bytes again
            self._flush()
            for b in changed:
                self._sent[b] = None
        pieces, finite = [], all(sent[1] for sent in self._sent if sent is not None)
        for b, (first, end) in enumerate(self.buckets):
            if self._sent[b] is not None:
                continue
            own, ok = self._pack_params(first, end, 0 if b == 0 else self._spans[first][0])
            pieces += own
            finite &= ok
        if not self.buckets or self._sent[0] is not None:  # the learning rates go alone
            pieces.insert(0, (0, self._message_bytes[:header]))
        if not finite:
            self.restart()
            flatten_into(self.message.gradient, self.gradient_views, [p.grad for p in self.params])
            raise HvdDcasgdError(f"hvd_dcasgd: worker {self.index}: {self._what_is_not_finite()} at push "
                                 f"{self.pushes}; nothing was pushed and the server's weights are unchanged "
                                 "(the weights likely diverged: lower the learning rate; with DC-ASGD, lower lambda_0 "
                                 "(HVD_DCASGD_LAMBDA) or keep its correction bounded (HVD_DCASGD_BOUND, 1 by default, "
                                 "inf is the paper's unbounded rule); clip gradients; or catch this error to skip the "
                                 "batch; docs/USAGE.md, \"Choosing the constants\").")
        return pieces

    def _pack_params(self, first: int, last: int, run: int) -> Tuple[List[Tuple[int, np.ndarray]], bool]:
        """Parameters ``first`` to ``last`` (exclusive) as ``(offset, bytes)``
        pieces of the message, from byte ``run`` (the start of their
        gradients, or 0 to take the learning rates along), and whether they
        are finite (always, without the check)."""
        pieces, finite = [], True  # run: where the packed bytes not yet in a piece start
        stop = self._spans[last - 1][1]
        for view, p, (start, end) in zip(self.gradient_views[first:last], self.params[first:last],
                                          self._spans[first:last]):
            grad = p.grad
            if grad is None:
                view.zero_()
            elif self._sent_as_it_lies(grad, view):
                finite = finite and (not self.check_finite or all_finite(grad))
                pieces += [(run, self._message_bytes[run:start])] if run < start else []
                pieces.append((start, byte_view(grad.detach())))
                run = end
            elif self.check_finite:
                finite &= copy_checked_(view, grad)
            else:
                view.copy_(grad)
        if run < stop:
            pieces.append((run, self._message_bytes[run:stop]))
        return pieces, finite

    @staticmethod
    def _sent_as_it_lies(grad: torch.Tensor, view: torch.Tensor) -> bool:
        """Whether ``grad`` goes from its own memory: large enough for a Put
        of its own to pay, and already what the message would hold."""
        return (grad.nbytes >= DIRECT_PUT_BYTES and grad.device.type == "cpu" and grad.dtype == view.dtype
                and grad.shape == view.shape and grad.is_contiguous())

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
        apart = [(p, view) for p, view in zip(self.params, self.weight_views)
                 if p.data_ptr() != view.data_ptr()]  # not (or no longer) views of the buffer
        if apart:
            with torch.no_grad():
                for p, view in apart:
                    p.copy_(view)

    def exchange(self) -> None:
        """Push this step's gradient (what no bucket sent yet) and load the
        weights the servers answer with."""
        for channel, pieces in zip(self.channels, self.per_server(self.pack())):
            channel.send(pieces)
        for channel in self.channels:
            channel.announce()
        self._sent = [None] * len(self.buckets)  # announce() completed every Put
        self.restart()
        self.pull()

    def pull(self) -> None:
        """Wait for every server's answer to the last push, read them all, and
        load them into the model."""
        for channel in self.channels:
            channel.await_answer()
        self.read()

    def read(self) -> None:
        """Read every server's outbox (every Get issued before any completes)
        and load the weights into the model."""
        for channel, out in zip(self.channels, self.weight_slices):
            channel.read(out, flush=False)
        for channel in self.channels:
            channel.mailboxes.flush()
        self.load_weights()

    def free(self) -> None:
        """Free the channels' windows (collective, with the servers' ``free()``)."""
        for channel in self.channels:
            channel.free()

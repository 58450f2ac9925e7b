"""The order of memory synchronisation in the server's loop, checked with a
recording stand-in for the window layer: on x86 shared memory a missing
``Win.Sync`` goes unnoticed, so no end-to-end run can show it.

The MPI memory model asks the owner of a window to synchronise its memory
(``Win.Sync``) between seeing a worker's flag and reading the inbox it
announces, and between writing an outbox and publishing the flag that
announces it."""

import numpy as np
import torch

from hvd_dcasgd.protocol.channel import GLOBAL_WORDS, WORDS_PER_WORKER, ServerChannel, control_words
from hvd_dcasgd.algorithm.compensation import Compensation
from hvd_dcasgd.protocol.layout import ModelLayout, PushMessage
from hvd_dcasgd.algorithm.server import ParameterServer
from hvd_dcasgd.serving.loop import serve
from hvd_dcasgd.observability.telemetry import Telemetry

WORKERS = 2


class RecordingControl:
    """Control words whose reads follow a script; every call is logged."""

    def __init__(self, log, script):
        self.log, self.script, self.count = log, list(script), control_words(WORKERS)

    def load_all(self, out):
        self.log.append("flags read")
        out[:] = self.script.pop(0) if self.script else self.last
        self.last = out.copy()
        return out

    def store(self, index, value):
        if index >= self.count - GLOBAL_WORDS:  # stop, heartbeat, closed
            if index != self.count - 2:  # the heartbeat says nothing about the order of data and flags
                self.log.append(("stop", None, "closed")[index - self.count + GLOBAL_WORDS])
            return
        worker, field = divmod(index, WORDS_PER_WORKER)
        self.log.append(f"flag {('pushed', 'replied', 'left')[field]}[{worker}]")

    def free(self):
        self.log.append("free")


class RecordingMailboxes:
    """Mailboxes in plain memory; synchronisations are logged."""

    def __init__(self, log, inbox_bytes, outbox_bytes):
        self.log = log
        self.inboxes = [torch.zeros(inbox_bytes, dtype=torch.uint8) for _ in range(WORKERS)]
        self.outboxes = [torch.zeros(outbox_bytes, dtype=torch.uint8) for _ in range(WORKERS)]

    def inbox(self, worker):
        return self.inboxes[worker]

    def outbox(self, worker):
        return self.outboxes[worker]

    def sync(self):
        self.log.append("sync")

    def free(self):
        self.log.append("free")


def words(pushed, left):
    w = np.zeros(control_words(WORKERS), dtype=np.int64)
    for m in range(WORKERS):
        w[m * WORDS_PER_WORKER] = pushed[m]
        w[m * WORDS_PER_WORKER + 2] = left[m]
    return w


def test_the_server_syncs_after_a_flag_before_an_inbox_and_before_publishing():
    log = []
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    layout = ModelLayout.of(optimizer, model.named_parameters())
    control = RecordingControl(log, [words([1, 0], [0, 0]), words([1, 0], [1, 1])])
    mailboxes = RecordingMailboxes(log, PushMessage.size(layout, layout.dtype), layout.numel * 4)
    server = ParameterServer(optimizer, layout, Compensation("constant"), ServerChannel(control, mailboxes, WORKERS),
                             layout.dtype, torch.device("cpu"), Telemetry(WORKERS))
    read_inbox = server._wire_gradient
    server._wire_gradient = lambda m: (log.append(f"inbox read[{m}]"), read_inbox(m))[1]
    fill_outbox = server._fill_outbox
    server._fill_outbox = lambda m, **kw: (fill_outbox(m, **kw), log.append(f"outbox written[{m}]"))
    log.clear()

    serve(server)

    assert log == ["flags read", "sync", "inbox read[0]", "outbox written[0]", "sync", "flag replied[0]",
                   "flags read", "closed"], log

"""A worker's wait for a server whose reads stop completing, as a read of a
frozen server does over TCP (Open MPI's osc/pt2pt moves a one-sided
operation only while its target calls MPI).  A stand-in for the control
window plays that server, so the wait's clock is checked in one process;
the jobs in test_reliability.py and test_sharded_training.py check the
whole over shared memory and TCP, with servers frozen by SIGSTOP or slowed
by a slow disk."""

import re
import threading
import time

import numpy as np
import pytest

from hvd_dcasgd.protocol.channel import HEARTBEAT, REPLIED, WAITING, WRITING_BIT, WorkerChannel, control_words
from hvd_dcasgd.common.errors import HvdDcasgdError
from hvd_dcasgd.runtime.exits import SERVER_SILENT
from hvd_dcasgd.runtime.lifecycle import Lifecycle


class StoppingServer:
    """One worker's control words at a server that answers reads until
    ``frozen_from`` seconds after it was made, answers none until
    ``frozen_until`` (a read under way waits, running ``meanwhile``), then
    answers push 1.  Stores are counted per word."""

    def __init__(self, heartbeat, frozen_from=0.0, frozen_until=float("inf")):
        self.owner, self.count = 0, control_words(1)
        self.words = np.zeros(self.count, dtype=np.int64)
        self.words[self.count + HEARTBEAT] = heartbeat
        start = time.monotonic()
        self.frozen = (start + frozen_from, start + frozen_until)
        self.stores = {}

    def _answer(self):
        if time.monotonic() >= self.frozen[1]:
            self.words[REPLIED] = max(self.words[REPLIED], 1)

    def load(self, index):
        self._answer()
        return int(self.words[index])

    def load_meanwhile(self, index, meanwhile):
        meanwhile()  # over TCP even a quick read takes a round trip: the first test of it fails
        while self.frozen[0] <= time.monotonic() < self.frozen[1]:
            meanwhile()
            time.sleep(1e-3)
        return self.load(index)

    def post_add(self, index, value):
        self.store(index, self.words[index] + value)
        return True

    def store(self, index, value):
        self.stores[index] = self.stores.get(index, 0) + 1
        self.words[index] = value


def worker_of(server, peer_server):
    """Worker 0's channel to ``server``, its peer channel to ``peer_server``."""
    channel, peer = WorkerChannel(server, None, 0), WorkerChannel(peer_server, None, 0)
    channel.peers, channel.pushes = [peer], 1  # push 1 is out, its answer awaited
    return channel


def test_a_server_frozen_before_its_heartbeat_was_read_is_silent_after_the_timeout(monkeypatch):
    """No word from the server yet, and its reads hang: the wait ends after
    the timeout with the silent-server sentence and status, and meanwhile
    the worker told the other server it is waiting."""
    monkeypatch.setenv("HVD_DCASGD_STALL_TIMEOUT", "1")
    peer_server = StoppingServer(heartbeat=0)
    channel = worker_of(StoppingServer(heartbeat=5, frozen_until=10.0), peer_server)  # then it answers
    started = time.monotonic()
    with pytest.raises(HvdDcasgdError, match="has not answered for 1 s") as raised:
        channel.await_answer()
    assert raised.value.status == SERVER_SILENT
    assert 1.0 <= time.monotonic() - started < 3.0
    assert peer_server.stores.get(WAITING, 0) >= 2  # told at once, then about twice a second


def test_a_server_frozen_while_it_writes_a_checkpoint_is_waited_for(monkeypatch):
    """The server's last word said it writes a checkpoint; then its reads
    hang for 2.5 s, past the 1 s timeout: the worker waits (busy is not
    silent), tells the other server meanwhile, and takes the answer."""
    monkeypatch.setenv("HVD_DCASGD_STALL_TIMEOUT", "1")
    peer_server = StoppingServer(heartbeat=0)
    channel = worker_of(StoppingServer(heartbeat=7 | WRITING_BIT, frozen_from=0.2, frozen_until=2.7), peer_server)
    channel.await_answer()
    assert peer_server.stores.get(WAITING, 0) >= 4
    assert not channel.stopping


def test_quick_answers_for_longer_than_the_timeout_are_no_silence(monkeypatch):
    """Every push answered at once (each read a round trip) for 2.5 s, past
    the 1 s timeout: no wait raises, since each one's silence counts from
    its start."""
    monkeypatch.setenv("HVD_DCASGD_STALL_TIMEOUT", "1")
    server = StoppingServer(heartbeat=3, frozen_until=0.0)  # never frozen
    channel = worker_of(server, StoppingServer(heartbeat=0))
    started = time.monotonic()
    waits = 0
    while time.monotonic() - started < 2.5:
        server.words[REPLIED] = channel.pushes
        channel.await_answer()
        channel.pushes += 1
        waits += 1
        time.sleep(0.01)  # the step
    assert waits > 50


def test_a_writing_mark_from_an_earlier_wait_is_no_news(monkeypatch):
    """The server said it was writing during an earlier wait; in this wait
    its reads hang from the start: it is silent after the timeout (a server
    frozen on its own after a checkpoint does not hang the worker)."""
    monkeypatch.setenv("HVD_DCASGD_STALL_TIMEOUT", "1")
    channel = worker_of(StoppingServer(heartbeat=9 | WRITING_BIT, frozen_until=10.0), StoppingServer(heartbeat=0))
    channel._beat = 9 | WRITING_BIT  # read in an earlier wait
    with pytest.raises(HvdDcasgdError, match="has not answered") as raised:
        channel.await_answer()
    assert raised.value.status == SERVER_SILENT


def test_the_watchdog_tells_the_lifecycle_which_ends_the_rank(monkeypatch):
    """Blocked inside MPI (the wait looks at no clock) with the server silent
    past the timeout: the watchdog thread hands the sentence and status 68
    to the rank's lifecycle, which is the one that ends the process."""
    monkeypatch.setenv("HVD_DCASGD_STALL_TIMEOUT", "1")
    told = []

    class Recording(Lifecycle):
        def end_now(self, sentence, status):
            told.append((sentence, status))
            threading.Event().wait()  # never returns, as the lifecycle's own does not

    channel = WorkerChannel(StoppingServer(heartbeat=0), None, 0, lifecycle=Recording())
    channel._waiting_since = time.monotonic() - 10  # a push sent 10 s ago, its answer not in
    deadline = time.monotonic() + 10
    while not told and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(told) == 1, told
    sentence, status = told[0]
    assert status == SERVER_SILENT
    assert re.fullmatch(r"hvd_dcasgd: worker 0: the server \(MPI rank 0\) has not answered for 1\d s "
                        r"\(HVD_DCASGD_STALL_TIMEOUT=1\); ending the job\.", sentence), sentence


def test_a_channel_given_no_lifecycle_has_one_of_its_own():
    assert isinstance(WorkerChannel(StoppingServer(heartbeat=0), None, 0).lifecycle, Lifecycle)

"""Admitting a process of another launch into a running job: MPI's
``MPI_Comm_join`` on a socket whose address Open MPI's name service
(``ompi-server``) publishes.

The running side (:class:`JoinDoor`) listens on a TCP socket and publishes
``HOST:PORT/TOKEN`` under the job's name, ``hvd_dcasgd-<job>``.  A joining
process (:func:`join`) looks the name up, connects, sends the token, and
both sides call ``MPI_Comm_join`` on the connected socket, then merge the
two sides into one communicator: the running side is its rank 0, the
joiner its last rank.  The running side then runs the collective set-up
both sides share on it (the joiner's windows) through its ``admit``
callable, as the joiner does after :func:`join` returns.

Why this way, measured on Open MPI 4.1 (``docs/PERFORMANCE.md``, "Admitting
a worker of another launch"):

* Several processes connecting to one port at once is not safe there: of
  three joiners that ``MPI_Comm_connect`` to one published port at the same
  time, one waited for good.  A listening socket queues its connections, so
  joiners are taken one at a time, in the order they came.
* The name service keeps every record until its owner withdraws it, even
  after the owner died, and a connect to a dead process's port never
  returns.  Here a joiner only ever connects to the running job's socket,
  which refuses at once when the job is gone.
* ``MPI_Comm_join`` and every step after it block their caller until the
  other side has taken part: tens of milliseconds each.  The door runs them
  in a thread of its own, so that the serving loop goes on answering
  meanwhile.  That takes MPI's thread level ``multiple``
  (:func:`check_thread_level`), and a one-sided component that opens
  windows over a merged communicator at that level (``--mca osc ucx``;
  Open MPI's ``pt2pt`` refuses ``multiple``).

The token (random, published with the address) keeps a stray connection to
the socket from reaching ``MPI_Comm_join``: a connection that does not send
it within :data:`TOKEN_SECONDS` is closed.  The socket is the door only: no
training data goes through it.

The door owns its socket, its published name and its thread, and refuses
use after :meth:`JoinDoor.close`.  Both sides take an ``info=`` keyword for
the name service, as mpi4py's own primitives do.
"""

from __future__ import annotations

import queue
import re
import secrets
import select
import socket
import threading
from typing import Any, Callable, List, Optional, Tuple

from ..common.errors import HvdDcasgdError

__all__ = ["service_name", "check_thread_level", "Joined", "JoinDoor", "join", "Admitted"]

#: Seconds a connection to the door has to send the token.
TOKEN_SECONDS = 5.0

#: What the door publishes: ``host:port/token``.
_RECORD = re.compile(r"^(?P<host>[A-Za-z0-9_.:\[\]-]{1,255}):(?P<port>[0-9]{1,5})/(?P<token>[0-9a-f]{32})$")


def service_name(job: str) -> str:
    """The name under which the running job ``job`` publishes its door."""
    return f"hvd_dcasgd-{job}"


def check_thread_level(mpi: Any) -> None:
    """Raise a sentence unless MPI runs at ``MPI_THREAD_MULTIPLE``, which a
    join running beside the serving loop needs."""
    if mpi.Query_thread() < mpi.THREAD_MULTIPLE:
        raise HvdDcasgdError(
            "hvd_dcasgd: admitting workers into a running job needs MPI's thread level 'multiple' (the join "
            "runs beside the serving loop); set HVD_DCASGD_THREAD_LEVEL=multiple, with a one-sided component "
            "that allows it (--mca osc ucx; Open MPI's osc pt2pt refuses it).")


class Joined:
    """A joiner and the running side, connected: :attr:`comm` is the two
    sides merged into one communicator (the running side its rank 0, the
    joiner its last rank) until :meth:`disconnect`.

    Open MPI 4.1 disconnects two launches through the communicator the join
    made, not the merged one (a disconnect of the merged one never returned
    here), so this keeps both.
    """

    def __init__(self, inter: Any, high: bool):
        self._inter = inter
        self.comm = inter.Merge(high=high)

    def disconnect(self) -> None:
        """Free the merged communicator and disconnect the two sides
        (collective: both sides call it); a second call does nothing."""
        if self._inter is None:
            return
        inter, self._inter = self._inter, None
        self.comm.Free()
        inter.Disconnect()


#: What the door hands over: the connection, the joiner's address, and
#: what ``admit`` returned for it.
Admitted = Tuple[Joined, str, Any]


class JoinDoor:
    """The running side: a listening socket, published under ``job``'s
    name, and a thread that admits whoever comes through it.

    For each connection that sends the token, the thread joins it
    (``MPI_Comm_join``, :class:`Joined`), and calls ``admit(joined.comm)`` -- the
    collective set-up both sides run on the new communicator -- then
    queues the result for :meth:`admitted`.  An error in a join ends the
    door's admissions and is raised by the next :meth:`admitted`.

    Arguments:
        mpi: mpi4py's ``MPI`` module, initialised at thread level ``multiple``.
        job: the job's name, which joiners give to :func:`join`.
        admit: called in the door's thread with each merged communicator.
        host: the name or address joiners reach this host by (default: its host name).
        info: an ``MPI.Info`` for the name service (default: none).
    """

    def __init__(self, mpi: Any, job: str, admit: Callable[[Any], Any], *, host: Optional[str] = None,
                 info: Any = None):
        check_thread_level(mpi)
        self._mpi = mpi
        self.job = job
        self._admit = admit
        self._info = mpi.INFO_NULL if info is None else info
        self._token = secrets.token_hex(16)
        self._socket: Optional[socket.socket] = socket.create_server(("", 0), backlog=16)
        self.address = f"{host or socket.gethostname()}:{self._socket.getsockname()[1]}"
        self.name = service_name(job)
        try:
            mpi.Publish_name(self.name, f"{self.address}/{self._token}", self._info)
        except BaseException:
            self._socket.close()
            raise
        self.refused = 0  # connections that did not send the token
        self._ready: "queue.Queue[Admitted]" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._closing = threading.Event()
        self._thread: Optional[threading.Thread] = threading.Thread(
            target=self._run, name="hvd_dcasgd join door", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                readable, _, _ = select.select([self._socket], [], [], 0.1)
                if not readable:
                    continue
                connection, peer = self._socket.accept()
                with connection:
                    if not self._has_token(connection):
                        self.refused += 1
                        continue
                    joined = Joined(self._mpi.Comm.Join(connection.fileno()), high=False)
                self._ready.put((joined, f"{peer[0]}:{peer[1]}", self._admit(joined.comm)))
        except BaseException as exc:  # told to the owner at its next look
            self._error = exc

    def _has_token(self, connection: socket.socket) -> bool:
        connection.settimeout(TOKEN_SECONDS)
        expected = self._token.encode()
        received = b""
        try:
            while len(received) < len(expected):
                chunk = connection.recv(len(expected) - len(received))
                if not chunk:
                    return False
                received += chunk
        except OSError:  # a timeout, a reset
            return False
        connection.settimeout(None)
        return secrets.compare_digest(received, expected)

    def admitted(self) -> List[Admitted]:
        """What was admitted since the last call (never waits)."""
        if self._thread is None:
            raise HvdDcasgdError("hvd_dcasgd: a join door was used after close()")
        taken = []
        while True:
            try:
                taken.append(self._ready.get_nowait())
            except queue.Empty:
                break
        if self._error is not None and not taken:
            error, self._error = self._error, None
            raise HvdDcasgdError(f"hvd_dcasgd: admitting a worker into job {self.job!r} failed: {error}") from error
        return taken

    def close(self, timeout: float = 30.0) -> List[Admitted]:
        """Withdraw the name, close the socket and wait (up to ``timeout``
        seconds) for a join under way to end; what was admitted and not
        taken yet.  A second call does nothing."""
        if self._thread is None:
            return []
        self._closing.set()
        try:
            self._mpi.Unpublish_name(self.name, f"{self.address}/{self._token}", self._info)
        finally:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise HvdDcasgdError(f"hvd_dcasgd: a join into job {self.job!r} did not end within {timeout:g} s "
                                     "of the door's close (its joiner stopped halfway?)")
            self._socket.close()
        left = self.admitted()
        self._thread = None
        return left


def join(mpi: Any, job: str, *, info: Any = None, timeout: float = 30.0) -> Joined:
    """Join the running job ``job``: the connection, whose ``comm`` is the
    two sides merged (this process its last rank).  Raises a sentence when no
    job of that name is published, or its door does not answer within
    ``timeout`` seconds.

    Arguments:
        mpi: mpi4py's ``MPI`` module.
        job: the running job's name (:class:`JoinDoor`'s ``job``).
        info: an ``MPI.Info`` for the name service (default: none).
        timeout: seconds to reach the door.
    """
    info = mpi.INFO_NULL if info is None else info
    try:
        record = mpi.Lookup_name(service_name(job), info)
    except mpi.Exception:
        raise HvdDcasgdError(f"hvd_dcasgd: no running job {job!r} is published at Open MPI's name server: is "
                             "it running, as an elastic job, with this ompi-server?") from None
    match = _RECORD.match(record)
    if match is None:
        raise HvdDcasgdError(f"hvd_dcasgd: the name server's record for job {job!r} is not an hvd_dcasgd door "
                             f"({record[:80]!r})")
    try:
        connection = socket.create_connection((match["host"], int(match["port"])), timeout=timeout)
    except OSError as exc:
        raise HvdDcasgdError(f"hvd_dcasgd: job {job!r}'s door at {match['host']}:{match['port']} does not answer "
                             f"({exc.strerror or exc}): the job has ended, or this host cannot reach it") from None
    with connection:
        connection.sendall(match["token"].encode())
        connection.settimeout(None)
        return Joined(mpi.Comm.Join(connection.fileno()), high=True)

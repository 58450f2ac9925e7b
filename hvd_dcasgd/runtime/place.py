"""Where a server stands among the job's servers, asked by whatever names,
files or counts differ with their number, so that none of them branches on
it: :class:`OnlyServer` (one server holds the whole model) and
:class:`OneOfServers` (server ``index`` of ``count`` holds a slice).
:func:`place_of` is the one branch on their number here; the serving layer's
coordination (``coordination_for``) makes the one it needs, with its slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

__all__ = ["OneOfServers", "OnlyServer", "ServerPlace", "place_of"]


@dataclass(frozen=True)
class ServerPlace:
    """A server's place: ``index`` of ``count`` servers, holding ``numel``
    elements of the flat parameter vector from ``offset`` (``None``: all)."""

    index: int = 0
    count: int = 1
    offset: int = 0
    numel: Optional[int] = None

    @property
    def name(self) -> str:
        """How its messages name it."""
        raise NotImplementedError

    @property
    def rank_name(self) -> str:
        """How a sentence about the whole rank names it ("rank 0 (the server)")."""
        raise NotImplementedError

    @property
    def short_name(self) -> str:
        """How a one-line list of the job's ranks names it ("server", "s1")."""
        raise NotImplementedError


    @property
    def first_worker_rank(self) -> int:
        """The MPI rank of worker 0: the servers come first."""
        return self.count

    @property
    def owner(self) -> str:
        """How a sentence about one of its files names it ("" or "server 1's ")."""
        raise NotImplementedError

    @property
    def speaks_for_all(self) -> bool:
        """Whether it says what every server would say (one notice, not one per server)."""
        return self.index == 0

    def trace_tag(self) -> Dict[str, Any]:
        """What each of its trace lines carries besides the update."""
        raise NotImplementedError

    def trace_header(self) -> Optional[Dict[str, Any]]:
        """The first line it writes into a new trace (``None``: none)."""
        raise NotImplementedError

    @property
    def shares_the_trace(self) -> bool:
        """Whether other servers append to the same trace (a line at a time; truncating it is not its own call)."""
        raise NotImplementedError

    @property
    def metrics_folder(self) -> str:
        """Its subfolder of the metrics folder."""
        raise NotImplementedError

    @property
    def checkpoint_folder(self) -> Optional[str]:
        """Its subfolder of the checkpoint folder (``None``: the folder itself)."""
        raise NotImplementedError


@dataclass(frozen=True)
class OnlyServer(ServerPlace):
    """The job's one server."""

    name = "hvd_dcasgd server"
    rank_name = "rank 0 (the server)"
    short_name = "server"
    owner = ""
    shares_the_trace = False
    metrics_folder = "server"
    checkpoint_folder = None

    def trace_tag(self) -> Dict[str, Any]:
        return {}

    def trace_header(self) -> Optional[Dict[str, Any]]:
        return None


@dataclass(frozen=True)
class OneOfServers(ServerPlace):
    """Server ``index`` of several, each holding a slice of the parameters."""

    shares_the_trace = True

    @property
    def name(self) -> str:
        return f"hvd_dcasgd server {self.index}"

    @property
    def rank_name(self) -> str:
        return f"rank {self.index} (server {self.index})"

    @property
    def short_name(self) -> str:
        return f"s{self.index}"


    @property
    def owner(self) -> str:
        return f"server {self.index}'s "

    def trace_tag(self) -> Dict[str, Any]:
        return {"shard": self.index}

    def trace_header(self) -> Optional[Dict[str, Any]]:
        return {"shard": self.index, "offset": self.offset, "numel": self.numel}

    @property
    def metrics_folder(self) -> str:
        return f"server-{self.index}"

    @property
    def checkpoint_folder(self) -> Optional[str]:
        return f"server-{self.index}-of-{self.count}"


def place_of(index: int, count: int, offset: int = 0, numel: Optional[int] = None) -> ServerPlace:
    """Server ``index``'s place among ``count`` servers (holding ``numel``
    elements from ``offset``; ``None``: all)."""
    return OnlyServer() if count == 1 else OneOfServers(index, count, offset, numel)

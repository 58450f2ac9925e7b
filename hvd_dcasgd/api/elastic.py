"""Horovod's elastic mode has no counterpart here: using any of it says why.

Elastic Horovod re-forms a synchronous ring when workers come and go (over
Gloo).  This package's answer to failures is different: an asynchronous
parameter server whose state is checkpointed and resumed; see docs/USAGE.md.
"""

from ..common.errors import HvdDcasgdError

REASON = (
    "hvd_dcasgd: Horovod's elastic mode (hvd.elastic.{name}) is not supported: it re-forms Horovod's synchronous "
    "ring over Gloo, and this package trains through a parameter server instead; for fault tolerance, "
    "checkpoint on worker 0 (the optimizer's state_dict() is the server's) and resume, as docs/USAGE.md shows"
)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise HvdDcasgdError(REASON.format(name=name))

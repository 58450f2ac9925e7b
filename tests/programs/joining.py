"""Joins into a running job, with the package's primitives (hvd_dcasgd.protocol.joining).

``running N OUT``: a job of one process opens a door for job "t" and, while
its main thread keeps calling MPI, admits N joiners: for each, the door's
thread opens a window of control words over the merged pair; the main
thread reads the value the joiner added and writes what it saw to OUT.

``joiner VALUE``: joins job "t", adds VALUE to word 0 of that window, leaves.

``late``: joins job "t" when no job of that name runs (the sentence).
"""

import json
import sys
import time

from hvd_dcasgd.common.errors import HvdDcasgdError
from hvd_dcasgd.protocol.joining import JoinDoor, join
from hvd_dcasgd.protocol.transport import ControlWords
from hvd_dcasgd.runtime.mpi import load_mpi

MPI = load_mpi()
role = sys.argv[1]
if role == "running":
    wanted, out = int(sys.argv[2]), sys.argv[3]
    door = JoinDoor(MPI, "t", lambda merged: ControlWords(MPI, merged, 2, owner=0), host="127.0.0.1")
    print(f"door open {door.address}", flush=True)
    seen, deadline = [], time.monotonic() + 90
    while len(seen) < wanted and time.monotonic() < deadline:
        for joined, peer, control in door.admitted():
            joined.comm.Barrier()  # the joiner's add is in
            seen.append({"value": control.load(0), "size": joined.comm.Get_size(), "rank": joined.comm.Get_rank()})
            print(f"admitted {peer}", flush=True)
            control.free()
            joined.disconnect()
        MPI.COMM_SELF.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)  # the serving loop's progress meanwhile
        time.sleep(0.005)
    door.close()
    try:
        door.admitted()
        seen.append({"error": "admitted() after close() did not raise"})
    except HvdDcasgdError as exc:
        seen.append({"after close": str(exc), "refused": door.refused})
    with open(out, "w") as f:
        json.dump(seen, f)
elif role == "joiner":
    joined = join(MPI, "t")
    control = ControlWords(MPI, joined.comm, 2, owner=0)
    control.add(0, int(sys.argv[2]))
    joined.comm.Barrier()
    control.free()
    joined.disconnect()
    print("joined", flush=True)
else:
    try:
        join(MPI, "t", timeout=5)
    except HvdDcasgdError as exc:
        print(exc, flush=True)

"""Each RMA primitive alone, on every rank at once; prints one line per check.

ControlWords: every rank adds to one word many times (atomicity); Mailboxes:
every worker Puts a pattern into its inbox and Gets a reply from its outbox;
Channel: pushes are seen exactly once, in order, under contention.
"""

import sys
import time

import numpy as np
import torch

from hvd_dcasgd.protocol.channel import ServerChannel, WorkerChannel, control_words
from hvd_dcasgd.runtime.mpi import load_mpi
from hvd_dcasgd.protocol.transport import ControlWords, Mailboxes

MPI = load_mpi()
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
workers = size - 1
ADDS, PUSHES, NBYTES = 200, 50, 100_003


def check(name, ok):
    if not ok:
        print(f"FAIL {name} on rank {rank}", flush=True)
        comm.Abort(1)
    if rank == 0:
        print(f"ok {name}", flush=True)


# 1. atomic counter: every rank adds 1, ADDS times, to word 0, and rank r stores r+1 to word r
words = ControlWords(MPI, comm, size + 1)
for _ in range(ADDS):
    words.add(0, 1)
words.store(rank + 1, rank + 1)
comm.Barrier()
check("control words: atomic add", words.load(0) == ADDS * size)
check("control words: store/load_all", list(words.load_all()[1:]) == list(range(1, size + 1)))
# the request-based read gives the same atomic value, also while the owner computes without calling MPI
# (over TCP the read then waits for it, and the reader goes on with ``meanwhile`` instead of blocking)
comm.Barrier()
if rank == 0:
    time.sleep(0.3)
looks = []
value = words.load_meanwhile(0, lambda: looks.append(1))
check("control words: load_meanwhile", value == ADDS * size)
# a post is not waited for; a later atomic read of the same word from the same rank comes after it
words.post_add(rank + 1, 100)
check("control words: post", words.load(rank + 1) == rank + 101)
words.free()

# 2. mailboxes: worker j puts a pattern, the owner echoes it doubled into j's outbox
boxes = Mailboxes(MPI, comm, workers, NBYTES, NBYTES)
if rank > 0:
    pattern = ((np.arange(NBYTES) * rank) % 251).astype(np.uint8)
    boxes.put_inbox(rank - 1, pattern)
comm.Barrier()
if rank == 0:
    boxes.sync()
    for j in range(workers):
        boxes.outbox(j).copy_(boxes.inbox(j) * 2)  # uint8 wraps modulo 256
    boxes.sync()
comm.Barrier()
if rank > 0:
    reply = np.empty(NBYTES, dtype=np.uint8)
    boxes.get_outbox(rank - 1, reply)
    check("mailboxes: put then get", np.array_equal(reply, (pattern.astype(np.int64) * 2 % 256).astype(np.uint8)))
else:
    check("mailboxes: put then get", True)
boxes.free()

# 3. channel: each worker pushes PUSHES numbered messages; the server sees each once, in order
control = ControlWords(MPI, comm, control_words(workers))
boxes = Mailboxes(MPI, comm, workers, 64, 64)
if rank == 0:
    channel = ServerChannel(control, boxes, workers)
    seen = [[] for _ in range(workers)]
    while True:
        ready, left = channel.poll()
        for j in ready:
            value = int(boxes.inbox(j)[:8].view(torch.int64)[0])
            seen[j].append(value)
            boxes.outbox(j)[:8].view(torch.int64)[0] = value * 10
            channel.reply(j)
        if not ready and all(left):
            break
    channel.close()
    check("channel: exactly once, in order", all(s == list(range(PUSHES)) for s in seen))
else:
    channel = WorkerChannel(control, boxes, rank - 1)
    message, reply = np.zeros(8, dtype=np.int64), np.zeros(8, dtype=np.int64)
    for k in range(PUSHES):
        message[0] = k
        channel.push([(0, message.view(np.uint8))])
        channel.pull(reply.view(np.uint8))
        if reply[0] != 10 * k:
            check(f"channel: reply to push {k}", False)
    channel.leave()
    channel.wait_closed()
control.free()
boxes.free()
sys.stdout.flush()

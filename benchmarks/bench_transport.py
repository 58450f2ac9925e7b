"""(b) One worker's push + pull round trip against raw mpi4py Put + Get.

Run with two ranks: rank 0 owns the windows, rank 1 is the worker.

    mpirun -np 2 python benchmarks/bench_transport.py [--numel 25000000]

Three figures, all for the same bytes (a float32 gradient out, float32
weights back) and windows allocated the same way (``MPI.Win.Allocate`` on
rank 0, ``Lock_all`` for the run):
* raw: ``Put`` + ``Flush`` + ``Get`` + ``Flush``, nothing else;
* channel: the protocol (Put, flush, publish the sequence word, wait for the
  server's answer, Get), the server answering at once;
* exchange: what ``optimizer.step()`` costs a worker beyond the server's
  update -- packing and checking the gradient, the channel round trip, loading
  the weights into the model.
Ratios raw / protocol are printed; 1.0 means no overhead over raw RMA.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from hvd_dcasgd.channel import ServerChannel, WorkerChannel, control_words
from hvd_dcasgd.layout import ModelLayout, PushMessage
from hvd_dcasgd.mpi import load_mpi
from hvd_dcasgd.transport import ControlWords, Mailboxes
from hvd_dcasgd.worker import Worker

MPI = load_mpi()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        sys.exit("run with exactly two ranks: mpirun -np 2 python benchmarks/bench_transport.py")
    rank = comm.Get_rank()
    model = torch.nn.Linear(1, args.numel, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    layout = ModelLayout.of(optimizer, model.named_parameters())
    message_bytes = PushMessage.size(layout, torch.float32)
    weight_bytes = layout.numel * 4
    rounds = args.repeats + 2  # the first two are warm-up

    raw_win = MPI.Win.Allocate(message_bytes + weight_bytes if rank == 0 else 0, 1, MPI.INFO_NULL, comm)
    raw_win.Lock_all(MPI.MODE_NOCHECK)
    control = ControlWords(MPI, comm, control_words(1))
    mailboxes = Mailboxes(MPI, comm, 1, message_bytes, weight_bytes)
    send, recv = np.ones(message_bytes, np.uint8), np.empty(weight_bytes, np.uint8)
    if rank == 0:  # answer every push at once: two per round (channel, exchange)
        channel = ServerChannel(control, mailboxes, 1)
        answered = 0
        while answered < 2 * rounds:
            ready, _ = channel.poll()
            for m in ready:
                channel.reply(m)
                answered += 1
    else:
        worker_channel = WorkerChannel(control, mailboxes, 0)
        worker = Worker(optimizer, layout, worker_channel, torch.float32)
        model.weight.grad = torch.randn_like(model.weight)

        def raw_round_trip():
            raw_win.Put(send, 0, (0, message_bytes, MPI.BYTE))
            raw_win.Flush(0)
            raw_win.Get(recv, 0, (message_bytes, weight_bytes, MPI.BYTE))
            raw_win.Flush(0)

        def channel_round_trip():
            worker_channel.push(send)
            worker_channel.pull(recv)

        # interleaved, so that the machine's noise hits all three alike
        times = {"raw": [], "channel": [], "exchange": []}
        for _ in range(rounds):
            for name, fn in (("raw", raw_round_trip), ("channel", channel_round_trip), ("exchange", worker.exchange)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        raw, protocol, exchange = (statistics.median(times[k][2:]) for k in ("raw", "channel", "exchange"))
        mb = (message_bytes + weight_bytes) / 1e6
        print(f"round trip of {mb:.0f} MB ({args.numel / 1e6:.0f}M float32 out and back), one worker, "
              f"median of {args.repeats}, interleaved")
        print(f"  raw Put+Get:        {raw * 1e3:8.1f} ms  ({mb / 1e3 / raw:5.2f} GB/s)")
        print(f"  channel push+pull:  {protocol * 1e3:8.1f} ms  ratio raw/channel  {raw / protocol:4.2f}")
        print(f"  worker exchange:    {exchange * 1e3:8.1f} ms  ratio raw/exchange {raw / exchange:4.2f}")
    comm.Barrier()
    raw_win.Unlock_all()
    raw_win.Free()
    control.free()
    mailboxes.free()


if __name__ == "__main__":
    main()

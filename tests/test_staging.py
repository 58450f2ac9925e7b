"""The GPU server's staging, on the CPU: the chunks, and the order in which
the pipeline issues its stages (recorded), with the data it moves; which
staging a device gets and why."""

import torch

from hvd_dcasgd.staging import (IN, OUT, UPDATE, RecordedLanes, Staging, choose_staging, chunks, pipeline)


def test_chunks_cover_the_elements_once_in_order():
    assert chunks(10, 4) == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
    assert chunks(10, 4, minimum=6) == [slice(0, 6), slice(6, 10)]
    assert chunks(3, 8) == [slice(0, 1), slice(1, 2), slice(2, 3)]
    assert chunks(0, 8) == []
    for numel in (1, 7, 64, 1000):
        parts = chunks(numel, 8)
        assert len(parts) <= 8 and parts[0].start == 0 and parts[-1].stop == numel
        assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))


def test_the_pipeline_copies_in_the_next_chunk_while_updating_this_one_and_copying_out_the_last():
    lanes, done = RecordedLanes(), []
    pipeline(3, lambda k: done.append((IN, k)), lambda k: done.append((UPDATE, k)),
             lambda k: done.append((OUT, k)), lanes)
    assert lanes.log == [
        (IN, 0, []),
        (IN, 1, []), (UPDATE, 0, [(IN, 0)]),
        (IN, 2, []), (UPDATE, 1, [(IN, 1)]), (OUT, 0, [(UPDATE, 0)]),
        (UPDATE, 2, [(IN, 2)]), (OUT, 1, [(UPDATE, 1)]),
        (OUT, 2, [(UPDATE, 2)]),
    ]
    assert done == [(lane, k) for lane, k, _ in lanes.log]  # each stage ran as issued
    issued = {(lane, k): i for i, (lane, k, _) in enumerate(lanes.log)}
    assert all(issued[before] < issued[(lane, k)] for lane, k, after in lanes.log for before in after)


def test_an_update_that_cannot_be_cut_runs_once_between_every_copy_in_and_every_copy_out():
    lanes, updates = RecordedLanes(), []
    pipeline(2, lambda k: None, updates.append, lambda k: None, lanes, chunked_update=False)
    assert lanes.log == [(IN, 0, []), (IN, 1, []), (UPDATE, 0, [(IN, 0), (IN, 1)]),
                         (OUT, 0, [(UPDATE, 0)]), (OUT, 1, [(UPDATE, 0)])]
    assert updates == [-1]


def test_staging_on_the_cpu_moves_the_data_chunk_by_chunk():
    numel = 1000
    staging = Staging(numel, torch.float16, torch.float32, torch.device("cpu"))
    host_in, device_in = torch.randn(numel).half(), torch.zeros(numel, dtype=torch.float16)
    weights, host_out = torch.randn(numel), torch.zeros(numel)

    def update(k):  # weights -= gradient, chunk k
        part = staging.parts[k]
        weights[part] -= device_in[part].float()

    expected = weights - host_in.float()
    staging.run(host_in, device_in, update, weights, host_out)
    assert torch.equal(weights, expected) and torch.equal(host_out, expected)
    assert len(staging.parts) == 8 and [lane for lane, _, _ in staging.lanes.log].count(OUT) == 8
    staging.upload(host_in, device_in := torch.zeros_like(device_in))
    assert torch.equal(device_in, host_in)
    staging.download(weights, host_out := torch.zeros_like(host_out))
    assert torch.equal(host_out, weights)


def test_which_staging_a_device_gets_and_why():
    assert choose_staging(torch.device("cpu"))[0] == "none"
    path, why = choose_staging(torch.device("cuda"), (False, "Open MPI was built without CUDA support"))
    assert path == "pinned" and why.startswith("Open MPI was built without CUDA support")
    path, why = choose_staging(torch.device("cuda"), (True, "Open MPI is CUDA-aware with osc/ucx"))
    assert path == "pinned" and "allocated in host memory" in why


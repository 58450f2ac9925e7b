"""The GPU server's staging, on the CPU: the chunks, and the order in which
the pipeline issues its stages (recorded), with the data it moves; which
staging a device gets and why."""

import pytest
import torch

from hvd_dcasgd.protocol.staging import (IN, OUT, UPDATE, RecordedLanes, Staging, choose_staging, chunks, pipeline)


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


def test_an_update_that_cannot_be_split_runs_once_between_every_copy_in_and_every_copy_out():
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



def _servers_weights(staged, mode, make_optimizer, wire, pushes=10, workers=3):
    from hvd_dcasgd.algorithm.compensation import Compensation
    from hvd_dcasgd.algorithm.endpoints import open_server
    from hvd_dcasgd.protocol.layout import ModelLayout
    from hvd_dcasgd.runtime.mpi import load_mpi

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Linear(200, 10))
    optimizer = make_optimizer(model)
    layout = ModelLayout.of(optimizer, model.named_parameters())
    server = open_server(load_mpi().COMM_SELF, optimizer, layout, Compensation(mode), num_workers=workers,
                         wire_dtype=wire, staged=staged)
    generator = torch.Generator().manual_seed(1)
    for k in range(pushes):
        worker = (k * 7) % workers
        server.messages[worker].gradient.copy_(torch.randn(layout.numel, generator=generator))
        server.messages[worker].lrs.copy_(torch.tensor([0.05 / (1 + k), 0.02], dtype=torch.float64))
        server.apply(worker)
        assert torch.equal(server.outboxes[worker], server.weights), "the outbox holds w_bak(m) = w"
    return server, server.weights.clone(), optimizer.state_dict()


@pytest.mark.parametrize("mode", ["none", "constant", "adaptive"])
@pytest.mark.parametrize("name,make", [
    ("sgd", lambda m: torch.optim.SGD([{"params": m[0].parameters()}, {"params": m[1].parameters()}], lr=0.1)),
    ("nesterov-wd", lambda m: torch.optim.SGD([{"params": m[0].parameters()}, {"params": m[1].parameters(),
                                                "momentum": 0.5}], lr=0.1, momentum=0.9, nesterov=True,
                                              weight_decay=1e-2)),
    ("dampening", lambda m: torch.optim.SGD([{"params": m[0].parameters()}, {"params": m[1].parameters()}],
                                            lr=0.1, momentum=0.9, dampening=0.3)),
])
@pytest.mark.parametrize("wire", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_a_staged_sgd_server_pipelines_its_update_and_gives_the_window_servers_weights(mode, name, make, wire):
    """The staged server (the GPU server's code, the CPU as its device) runs
    the C kernel's arithmetic chunk by chunk (8 chunks, split across the two
    param groups) in torch operations, pipelined with its copies."""
    staged, staged_weights, staged_state = _servers_weights(True, mode, make, wire)
    window, window_weights, window_state = _servers_weights(False, mode, make, wire)
    assert staged.pipelined is not None, staged.pipelined_why
    assert window.pipelined is None and window.update.path == "fused_sgd"
    assert len(staged.staging.parts) == 8 and staged.staging.parts[1].start < 300 * 200  # a chunk boundary inside group 0
    assert torch.allclose(staged_weights, window_weights, rtol=0, atol=1e-6)
    for p, q in zip(staged_state["state"].values(), window_state["state"].values()):  # the momentum buffers
        assert torch.allclose(p["momentum_buffer"], q["momentum_buffer"], rtol=0, atol=1e-5)
    assert [g["lr"] for g in staged_state["param_groups"]] == [g["lr"] for g in window_state["param_groups"]]


def test_adam_on_a_staged_server_is_not_pipelined_and_says_why():
    staged, *_ = _servers_weights(True, "adaptive", lambda m: torch.optim.Adam([{"params": m[0].parameters()}, {"params": m[1].parameters()}]),
                                  torch.float32,
                                  pushes=1)
    assert staged.pipelined is None and staged.pipelined_why.startswith("Adam is not torch.optim.SGD")


def test_the_summary_names_the_update_path_and_for_a_staged_model_its_staging_and_why():
    from hvd_dcasgd.observability.telemetry import Telemetry

    window, *_ = _servers_weights(False, "adaptive", lambda m: torch.optim.SGD([{"params": m[0].parameters()}, {"params": m[1].parameters()}], lr=0.1), torch.float32,
                                  pushes=1)
    said = window.telemetry.summary().splitlines()[-1]
    assert said == f"{window.telemetry.name}: update path fused_sgd ({window.update.why})", said
    adam, *_ = _servers_weights(True, "adaptive", lambda m: torch.optim.Adam([{"params": m[0].parameters()}, {"params": m[1].parameters()}]),
                               torch.float32, pushes=1)
    recorded = adam.telemetry.summary_dict()["update_path"]
    assert recorded == {"path": adam.update.path, "why": adam.update.why, "staging": adam.staging.path,
                        "staging_why": adam.staging.why, "pipelined": "not pipelined: " + adam.pipelined_why}
    line = Telemetry.describe_update_path({**recorded, "staging": "pinned", "staging_why": "no CUDA-aware MPI"})
    assert line.endswith("; staging pinned (no CUDA-aware MPI); not pipelined: " + adam.pipelined_why), line

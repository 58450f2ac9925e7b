"""hvd_dcasgd's Horovod-style calls among the workers, checked against
Horovod's own answers (with ``compare``) or on their own (without Horovod).

    mpirun -np 3 python horovod_agreement.py METHOD compare|alone
"""

import json
import sys
import time

import torch

import hvd_dcasgd as hvd

method, mode = sys.argv[1], sys.argv[2]
hvd.init()
if hvd.is_server() and mode == "compare":
    import horovod.torch as horovod

    assert not horovod.is_initialized(), "the server rank must stay out of Horovod"

model = torch.nn.Linear(4, 3)
torch.manual_seed(hvd.rank())  # different on every worker, until broadcast
with torch.no_grad():
    for p in model.parameters():
        p.normal_()
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), named_parameters=model.named_parameters(), compensation=method
)
assert optimizer.method == method

results = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size()}
values = torch.arange(6.0).view(2, 3) * (hvd.rank() + 1)
for op in ("Average", "Sum", "Min", "Max"):
    results[f"allreduce_{op}"] = hvd.allreduce(values, op=getattr(hvd, op), name=f"r{op}").tolist()
results["allgather"] = hvd.allgather(values[: hvd.rank() + 1], name="g").tolist()
results["broadcast"] = hvd.broadcast(values, root_rank=1, name="b").tolist()
results["broadcast_object"] = hvd.broadcast_object({"from": hvd.rank()}, root_rank=1)


def calls(h, tag):
    """The rest of Horovod's API, the same lines for either module ``h``."""
    out = {}
    rows = torch.arange(20.0).view(5, 4) * (h.rank() + 1)
    out["allreduce_Product"] = h.allreduce(values + 1, op=h.Product, name=f"{tag}p").tolist()
    out["allreduce_scaled"] = h.allreduce(values, op=h.Sum, prescale_factor=0.5, postscale_factor=3.0,
                                          name=f"{tag}s").tolist()
    out["allreduce_fp16"] = h.allreduce(values / 3, compression=h.Compression.fp16, name=f"{tag}c").tolist()
    out["allreduce_int"] = h.allreduce(torch.tensor([7, 8]) * (h.rank() + 1), name=f"{tag}i").tolist()
    inplace = values.clone()
    h.allreduce_(inplace, op=h.Max, name=f"{tag}m_")
    out["allreduce_"] = inplace.tolist()
    out["grouped_allreduce"] = [t.tolist() for t in h.grouped_allreduce([values, values * 2], name=f"{tag}ga")]
    out["grouped_allgather"] = [t.tolist() for t in h.grouped_allgather([values[:1], rows], name=f"{tag}gg")]
    out["allgather_object"] = h.allgather_object({"rank": h.rank()}, name=f"{tag}go")
    out["reducescatter"] = h.reducescatter(rows, name=f"{tag}rs").tolist()
    out["reducescatter_sum"] = h.reducescatter(rows, op=h.Sum, name=f"{tag}rss").tolist()
    out["grouped_reducescatter"] = [t.tolist() for t in h.grouped_reducescatter([rows], name=f"{tag}grs")]
    sent = torch.arange(4.0 * h.size()).view(-1, 1) + 100 * h.rank()
    out["alltoall"] = h.alltoall(sent, name=f"{tag}a").tolist()
    splits = torch.tensor([1] * (h.size() - 1) + [2 * h.size() - (h.size() - 1)], dtype=torch.int32)
    received, received_splits = h.alltoall(torch.arange(2.0 * h.size()) + 100 * h.rank(), splits=splits,
                                           name=f"{tag}as")
    out["alltoall_splits"] = [received.tolist(), received_splits.tolist()]
    handle = h.allreduce_async(values, name=f"{tag}async")
    out["allreduce_async"] = [h.poll(handle) in (True, False), h.synchronize(handle).tolist()]
    out["allgather_async"] = h.synchronize(h.allgather_async(values[: h.rank() + 1], name=f"{tag}gasync")).tolist()
    target = values.clone()
    h.synchronize(h.broadcast_async_(target, root_rank=1, name=f"{tag}basync_"))
    out["broadcast_async_"] = target.tolist()
    target = values.clone()
    h.broadcast_(target, root_rank=0, name=f"{tag}b_")
    out["broadcast_"] = target.tolist()
    h.barrier()
    out["cross"] = [h.cross_rank(), h.cross_size()]
    out["built"] = [h.mpi_built(), h.mpi_enabled(), bool(h.gloo_built()), h.gloo_enabled()]
    evens = h.ProcessSet([r for r in range(h.size()) if r % 2 == 0])
    evens = h.add_process_set(evens)
    if evens.included():
        out["process_set"] = [evens.rank(), evens.size(),
                              h.allreduce(values, op=h.Sum, name=f"{tag}ps", process_set=evens).tolist()]
    h.remove_process_set(evens)
    return out


results.update(calls(hvd, "d"))

hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.ones(2, 4) * (hvd.rank() + 1)).sum().backward()
    optimizer.step()
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

time.sleep(0.3 * hvd.rank())  # the last worker joins last
results["join"] = hvd.join()

if mode == "compare":
    import horovod.torch as horovod

    expected = {"rank": horovod.rank(), "size": horovod.size(), "local_rank": horovod.local_rank(),
                "local_size": horovod.local_size()}
    for op in ("Average", "Sum", "Min", "Max"):
        expected[f"allreduce_{op}"] = horovod.allreduce(values, op=getattr(horovod, op), name=f"h{op}").tolist()
    expected["allgather"] = horovod.allgather(values[: hvd.rank() + 1], name="hg").tolist()
    expected["broadcast"] = horovod.broadcast(values, root_rank=1, name="hb").tolist()
    expected["broadcast_object"] = horovod.broadcast_object({"from": hvd.rank()}, root_rank=1)
    expected.update(calls(horovod, "h"))
    time.sleep(0.3 * hvd.rank())
    expected["join"] = horovod.join()
    mismatches = {k: (results[k], expected[k]) for k in expected if results[k] != expected[k]}
    assert not mismatches, f"worker {hvd.rank()}: hvd_dcasgd and Horovod disagree: {mismatches}"
else:  # the answers in closed form: worker r holds base * (r + 1)
    base, n = torch.arange(6.0).view(2, 3), hvd.size()
    expected = {"allreduce_Sum": base * n * (n + 1) / 2, "allreduce_Average": base * (n + 1) / 2,
                "allreduce_Min": base, "allreduce_Max": base * n, "broadcast": base * 2,
                "allgather": torch.cat([base[: r + 1] * (r + 1) for r in range(n)])}
    mismatches = {k: (results[k], v.tolist()) for k, v in expected.items() if results[k] != v.tolist()}
    assert not mismatches, f"worker {hvd.rank()}: wrong collective answers: {mismatches}"
    assert results["broadcast_object"] == {"from": 1}, results["broadcast_object"]
    assert results["join"] == n - 1, results["join"]
    product = torch.ones(2, 3)
    for r in range(n):
        product *= base * (r + 1) + 1
    rows = torch.arange(20.0).view(5, 4) * n * (n + 1) / 2
    mine = [5 // n + (1 if r < 5 % n else 0) for r in range(n)]
    sent = [torch.arange(4.0 * n).view(-1, 1) + 100 * s for s in range(n)]
    closed_form = {"allreduce_Product": product, "reducescatter_sum": torch.split(rows, mine)[hvd.rank()],
                   "alltoall": torch.cat([s[4 * hvd.rank(): 4 * hvd.rank() + 4] for s in sent])}
    mismatches = {k: (results[k], v.tolist()) for k, v in closed_form.items() if results[k] != v.tolist()}
    assert not mismatches, f"worker {hvd.rank()}: wrong collective answers: {mismatches}"

if method == "horovod":  # synchronous: every worker holds the same weights
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).unsqueeze(0)
    gathered = hvd.allgather(flat)
    assert torch.equal(gathered.min(0).values, gathered.max(0).values), "Horovod's workers diverged"
# a short record, one write: MPI's forwarding may split a long line and interleave ranks
sys.stdout.write("AGREE " + json.dumps({"rank": results["rank"], "answers": len(results)}) + "\n")
sys.stdout.flush()

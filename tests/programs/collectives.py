"""Horovod's helpers among the workers, next to a running parameter server,
and the checkpoint-restore idiom (load on one worker, then broadcast) without
named_parameters."""

import json
import os
import sys

import torch

import hvd_dcasgd as hvd

hvd.init()
model = torch.nn.Linear(3, 2)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
rank, size = hvd.rank(), hvd.size()
result = {
    "rank": rank,
    "size": size,
    "average": hvd.allreduce(torch.tensor(float(rank))).item(),
    "sum": hvd.allreduce(torch.tensor([rank, 1]), op=hvd.Sum).tolist(),
    "object": hvd.broadcast_object({"from": rank}, root_rank=1),
    "gathered": hvd.allgather(torch.tensor([rank])).tolist(),
    "broadcast": hvd.broadcast(torch.tensor([10 * rank]), root_rank=2).tolist(),
    "max": hvd.allreduce(torch.tensor(float(rank)), op=hvd.Max).item(),
}
model.weight.grad = torch.full_like(model.weight, float(rank))
model.bias.grad = torch.zeros_like(model.bias)
optimizer.step()
hvd.barrier()  # every push is applied: the snapshots below are all of one server state
# worker 1 "restores a checkpoint": weights of its own and momentum 0.5
state = optimizer.state_dict()  # the server's state: it is the optimizer that steps
result["server_state_entries"] = len(state["state"])
if rank == 0:  # a checkpoint the server cannot apply: an error here, and nothing changes
    broken = {**state, "state": {k: {**v, "momentum_buffer": torch.zeros(7)} for k, v in state["state"].items()}}
    try:
        optimizer.load_state_dict(broken)
        result["broken_restore"] = "accepted"
    except hvd.HvdDcasgdError as error:
        result["broken_restore"] = str(error)
    result["state_after_broken_restore"] = optimizer.state_dict()["state"][0]["momentum_buffer"].tolist() == \
        state["state"][0]["momentum_buffer"].tolist()
if rank == 1:
    with torch.no_grad():
        model.weight.fill_(7.0)
    state["param_groups"][0]["momentum"] = 0.5
    optimizer.load_state_dict(state)
hvd.broadcast_parameters(model.state_dict(), root_rank=1)
hvd.broadcast_optimizer_state(optimizer, root_rank=1)
result["weight_after_broadcast"] = model.weight.sum().item()
hvd.shutdown()  # no step since the broadcast: the server's final weights are worker 1's
result["final_weight"] = model.weight.sum().item()
final_state = optimizer.state_dict()
result["final_momentum"] = final_state["param_groups"][0]["momentum"]
result["final_state_entries"] = len(final_state["state"])
with open(os.path.join(sys.argv[1], f"result{rank}.json"), "w") as f:
    json.dump(result, f)

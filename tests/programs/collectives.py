"""Horovod's helpers among the workers, next to a running parameter server."""

import json
import os
import sys

import torch

import hvd_dcasgd as hvd

hvd.init()
model = torch.nn.Linear(3, 2)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                     named_parameters=model.named_parameters())
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
# after a step the workers hold different weights; broadcasting makes them worker 1's
model.weight.grad = torch.full_like(model.weight, float(rank))
model.bias.grad = torch.zeros_like(model.bias)
optimizer.step()
with torch.no_grad():
    model.weight.add_(rank)  # make them differ for sure
hvd.broadcast_parameters(model.state_dict(), root_rank=1)
result["weight"] = model.weight.sum().item()
optimizer.state[model.weight]["marker"] = torch.tensor(float(rank))
hvd.broadcast_optimizer_state(optimizer, root_rank=1)
result["marker"] = optimizer.state[model.weight]["marker"].item()
with open(os.path.join(sys.argv[1], f"result{rank}.json"), "w") as f:
    json.dump(result, f)
hvd.shutdown()
sys.exit(0)

"""SyncBatchNorm among the workers against torch's BatchNorm on the union of
their batches, computed in one process: outputs, input gradients, running
statistics; weight and bias gradients stay each worker's own."""

import json
import sys

import torch

import hvd_dcasgd as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()


def batch(r):
    g = torch.Generator().manual_seed(100 + r)
    return torch.randn(3 + r, 4, 5, 5, generator=g) * (1 + r), torch.randn(3 + r, 4, 5, 5, generator=g)


def layer(cls):
    torch.manual_seed(0)
    bn = cls(4, momentum=0.3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn


ours = layer(hvd.SyncBatchNorm)
x, upstream = batch(rank)
x.requires_grad_(True)
y = ours(x)
(y * upstream).sum().backward()

reference = layer(torch.nn.BatchNorm2d)
batches = [batch(r) for r in range(size)]
xs = torch.cat([b[0] for b in batches]).requires_grad_(True)
ys = reference(xs)
(ys * torch.cat([b[1] for b in batches])).sum().backward()
mine = slice(sum(3 + r for r in range(rank)), sum(3 + r for r in range(rank + 1)))
local = layer(torch.nn.BatchNorm2d)
xl = x.detach().clone().requires_grad_(True)
(local(xl) * upstream).sum().backward()  # the same weights, this worker's batch alone: the local parameter gradients

report = {
    "rank": rank,
    "output": (y - ys[mine]).abs().max().item(),
    "input_grad": (x.grad - xs.grad[mine]).abs().max().item(),
    "running_mean": (ours.running_mean - reference.running_mean).abs().max().item(),
    "running_var": (ours.running_var - reference.running_var).abs().max().item(),
    "weight_grad_sum": (hvd.allreduce(ours.weight.grad, op=hvd.Sum) - reference.weight.grad).abs().max().item(),
    "bias_grad_sum": (hvd.allreduce(ours.bias.grad, op=hvd.Sum) - reference.bias.grad).abs().max().item(),
    "bias_grad_local": (ours.bias.grad - local.bias.grad).abs().max().item(),
}
ours.eval()
report["eval"] = (ours(x.detach()) - torch.nn.functional.batch_norm(
    x.detach(), ours.running_mean, ours.running_var, ours.weight, ours.bias, False)).abs().max().item()
if not hvd.is_server():
    with open(f"{sys.argv[1]}/bn{rank}.json", "w") as f:
        json.dump(report, f)

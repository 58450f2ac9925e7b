"""A Horovod user's habits beyond the optimizer, as the same lines under
plain Horovod and under hvd_dcasgd (the module is the first argument):

    mpirun -np N python habits.py horovod.torch|hvd_dcasgd OUT_DIR

broadcast_object, allgather_object, join with uneven data, metric averaging
through allreduce, local_rank for device pinning, DistributedSampler,
checkpointing on rank 0, clipping through synchronize()/skip_synchronize(),
AMP's GradScaler with an overflowing step, backward_passes_per_step."""

import importlib
import json
import os
import sys
import time

import torch
from torch.utils.data import DistributedSampler, TensorDataset

hvd = importlib.import_module(sys.argv[1])
out_dir = sys.argv[2]
hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=2)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

outcome = {"rank": hvd.rank(), "size": hvd.size()}
outcome["device"] = f"cuda:{hvd.local_rank()}"  # what a script pins
outcome["local"] = [hvd.local_rank(), hvd.local_size()]
outcome["object"] = hvd.broadcast_object({"config": [1, 2]} if hvd.rank() == 0 else {}, root_rank=0, name="config")
outcome["gathered"] = hvd.allgather_object(("worker", hvd.rank()))

data = TensorDataset(torch.arange(40.0).view(10, 4), torch.arange(10.0).view(10, 1))
sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=3)
sampler.set_epoch(1)
outcome["sampler"] = list(sampler)

scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
steps = skipped = 0
for i, index in enumerate(list(sampler)[: 2 + hvd.rank()]):  # uneven: worker r has 2 + r batches
    x, y = data[index]
    optimizer.zero_grad()
    for _ in range(2):  # backward_passes_per_step=2
        loss = ((model(x / 40) - y / 10) ** 2).mean()
        if i == 1:
            loss = loss * float("inf")  # an overflow: GradScaler must skip this step, nothing is applied
        scaler.scale(loss).backward()
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    before = scaler.get_scale()
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()
    steps += 1
    skipped += int(scaler.get_scale() < before)
outcome["steps"], outcome["skipped"], outcome["scale"] = steps, skipped, scaler.get_scale()
time.sleep(2.0 * hvd.rank())  # the worker with the most data is also slow to finish: it joins last
outcome["last_joined"] = hvd.join()
outcome["metric"] = hvd.allreduce(torch.tensor(float(hvd.rank())), name="metric").item()
outcome["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
if hvd.rank() == 0:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(out_dir, "ckpt.pt"))
    checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=True)
    outcome["checkpoint"] = sorted(checkpoint["model"]) + [len(checkpoint["optimizer"]["param_groups"])]
with open(os.path.join(out_dir, f"{sys.argv[1]}-{hvd.rank()}.json"), "w") as f:
    json.dump(outcome, f)

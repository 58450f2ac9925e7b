"""A script that imports hvd_dcasgd, then mpi4py.MPI itself (to reach
MPI.COMM_WORLD), before hvd.init(): the common order."""

import torch

import hvd_dcasgd as hvd
from mpi4py import MPI

hvd.init(comm=MPI.COMM_WORLD)
model = torch.nn.Linear(2, 2)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
model(torch.ones(1, 2)).sum().backward()
optimizer.step()
hvd.shutdown()
print(f"worker {hvd.rank()} done", flush=True)

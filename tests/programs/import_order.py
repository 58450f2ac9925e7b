"""A script that imports mpi4py.MPI itself, before or after hvd_dcasgd:

    mpirun -np 3 python import_order.py mpi-first|hvd-first

``mpi-first`` loads MPI at mpi4py's default level (MULTIPLE) before
hvd_dcasgd can choose one; ``hvd-first`` is the common order (import the
package, then reach for MPI.COMM_WORLD)."""

import sys

import torch

if sys.argv[1] == "mpi-first":
    from mpi4py import MPI

    import hvd_dcasgd as hvd
else:
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

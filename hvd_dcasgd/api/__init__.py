"""The Horovod API surface, ``horovod.torch`` 0.28.1's names: the
`DistributedOptimizer` wrapper (`optimizer`, with the method and its
constants in `method` and the worker's optimizer class in `wrapped`), the
tensor collectives among the workers (`mpi_ops`), object broadcasts and ``join`` (`collectives`), process
sets (`process_sets`), ``SyncBatchNorm`` (`sync_batch_norm`), Horovod's
questions about its build (`basics`), elastic mode (`elastic`) and the dtype
gradients travel in (`compression`).  ``hvd_dcasgd``'s top level loads these
names on first use.

May import: every other subpackage but `launcher`.
"""

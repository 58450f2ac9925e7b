"""``hvd-dcasgd-run``: start S parameter servers and N workers under the MPI it
finds -- its command line (`launch`), what it finds here (`probe`) and the
command it builds (`command`).  It places no GPU itself: it passes
``--gpus`` on to every rank as ``HVD_DCASGD_GPUS``, and each rank's
``init()`` places itself (``runtime/gpus.py``).  The standard library, and
the settings table, which it reads without importing torch.

May import: `common` (``config``, inside functions), nothing else.
"""

"""``hvd-dcasgd-run``: start S parameter servers and N workers under the MPI it
finds -- its command line (`launch`), what it finds here (`probe`), the
command it builds (`command`), and the per-rank step (`rank`): each rank may
start through ``rank.py`` by path to pin its GPU, so the launcher uses the
standard library alone.

May import: `common` (``config``, inside functions), nothing else.
"""

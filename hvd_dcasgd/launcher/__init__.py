"""``hvd-dcasgd-run``: start S parameter servers and N workers under the MPI it
finds (`launch`).  Each rank may start through ``launch.py`` by path to pin
its GPU, so the launcher uses the standard library alone.

May import: `common` (``config``, inside functions), nothing else.
"""

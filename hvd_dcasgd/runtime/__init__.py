"""One process's place in a job: loading mpi4py's ``MPI`` at the thread level
needed (`mpi`), starting Horovod on the workers (`horovod`), the roles and
Horovod's basic calls -- ``init``, ``rank``, ``size`` ... (`roles`), the
rank's `lifecycle`, the stop signals that inform it (`preemption`), how a
rank ends when something goes wrong (`exits`), and a server's place among the
job's servers (`place`).

May import: `common`.
"""

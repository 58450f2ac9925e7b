"""A job's session on the server side and on the worker side: the server's
loop (`loop`), what differs with the number of servers (`coordination`, with
the several servers' consistent checkpoints and stops in `cuts`), who is in
the job and each change of it (`membership`), the
checkpoint folder (`checkpoints`), the typed messages outside the push
protocol (`messages`) and each role's start and end (`session`).

May import: `common`, `runtime`, `protocol`, `observability`, `algorithm`.
"""

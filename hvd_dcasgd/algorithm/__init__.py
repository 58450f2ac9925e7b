"""The paper's algorithm and what it needs, independent of when things happen:
DC-ASGD's formula, functional, with its reference, `foreach` and fused paths
(`dcasgd`), the compensation rules and their registry (`rules`), the settings
that choose one and the state it keeps (`compensation`), the server's
update and its paths (`update`, `pipelined`), how several servers split the
flat vector (`shards`), the parameter server's state and what it refuses (`server`), that state taken on by
a job of another number of workers (`membership`), the one way to
build a server or a worker over a communicator (`endpoints`), and M virtual
workers in one process against the real server (`simulator`).

May import: `common`, `runtime`, `protocol`, `observability`.
"""

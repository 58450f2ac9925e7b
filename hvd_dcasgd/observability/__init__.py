"""What a job tells its user while it runs: the server's counters and trace
(`telemetry`), its scalars every interval -- TensorBoard or CSV (`metrics`),
the progress line (`progress`), and what the server's loop calls to be
watched (`monitor`).  It reads a server through the server's public methods.

May import: `common`, `runtime`, `protocol`; `algorithm` for annotations only
(a server's type, under ``TYPE_CHECKING``).
"""

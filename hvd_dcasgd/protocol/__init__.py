"""How a worker and a server talk over MPI one-sided windows: the RMA
primitives (`transport`), the push/reply protocol on them (`channel`), a
process of another launch joining a running job (`joining`), who has
been silent for how long (`stall`), the flat model layout and the push
message (`layout`), a CUDA server's copies between window memory and its
device (`staging`), and the worker's side -- pack, check, push, pull
(`worker`).

May import: `common`, `runtime`.
"""

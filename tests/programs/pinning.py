"""Says which GPUs this rank sees after ``hvd.init()``, what ``hvd.local_rank()`` is and on which host: one
JSON object per rank, in the file ``rank<world rank>.json`` of the folder given as its argument (mpirun's
output can join and split the ranks' lines)."""

import json
import os
import socket
import sys
from pathlib import Path

import hvd_dcasgd as hvd

hvd.init()
world_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
Path(sys.argv[1], f"rank{world_rank}.json").write_text(json.dumps({
    "world_rank": world_rank, "server": hvd.is_server(), "local_rank": hvd.local_rank(),
    "host": socket.gethostname(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "torch_imported": "torch" in sys.modules}))
hvd.shutdown()

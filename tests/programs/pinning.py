"""Says which GPUs this rank sees and what hvd.local_rank() is, as one JSON line."""

import json
import os

import hvd_dcasgd as hvd

hvd.init()
print(json.dumps({"world_rank": int(os.environ["OMPI_COMM_WORLD_RANK"]), "server": hvd.is_server(),
                  "local_rank": hvd.local_rank(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
hvd.shutdown()

"""A script written for torchrun's ``--master-addr localhost --master-port PORT``: it reaches the
store on that port itself (``init_method="tcp://localhost:PORT"``, PORT its first argument, not
read from the environment), then all-reduces and prints the sum."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

port = int(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert os.environ["MASTER_PORT"] == str(port), (os.environ["MASTER_PORT"], port)
# Bounded: without a store on the port, the ranks would wait for one until this timeout.
dist.init_process_group(
    "gloo", init_method=f"tcp://localhost:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=40)
)
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
print(f"rank {rank} sum {total.item()} agent_store={os.environ['TORCHELASTIC_USE_AGENT_STORE']}", flush=True)
dist.destroy_process_group()

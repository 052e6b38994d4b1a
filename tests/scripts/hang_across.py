"""Two nodes, one rank each, reporting steps (``elasticd.worker.step``). In the first attempt,
rank 1 stops after step 4's collective without reporting it, and never comes back; rank 0
reports step 4 and blocks in step 5's collective (gloo would wait 30 minutes). Only the hang
watch of rank 1's node, through etcd, can restart the job in time."""

import os
import time

import torch
import torch.distributed as dist

from elasticd import worker

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
total = torch.zeros(1)
for step in range(8):
    t = torch.ones(1)
    dist.all_reduce(t)
    total += t
    if first and rank == 1 and step == 4:
        time.sleep(10**6)  # HANG LINE
    worker.step(step)
    time.sleep(0.3)
print(f"rank {rank} done: {total.item()}", flush=True)
dist.destroy_process_group()

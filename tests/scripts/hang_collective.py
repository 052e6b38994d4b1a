"""A plain torchrun script (no elasticd import, no progress reports): in the first attempt, rank 1
sleeps before the collective, so rank 0 blocks in the all_reduce waiting for it. Only CPU time
and stacks can tell that this job hangs, and which rank is the cause."""

import os
import time

import torch
import torch.distributed as dist


def wander_off() -> None:
    time.sleep(10**6)  # HANG LINE


dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
if rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    print("rank 1 wanders off before the collective", flush=True)
    wander_off()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
print(f"rank {rank} reduced {total.item()}", flush=True)
dist.destroy_process_group()

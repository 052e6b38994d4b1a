"""Rank $CRASH_RANK raises (under torch's ``@record``) between two all_reduces; the other ranks
then fail on the broken collective (gloo: "Connection closed by peer"), also under ``@record``."""

import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    t = torch.ones(1)
    dist.all_reduce(t)  # every rank is connected
    print(f"rank {rank} reduced {t.item()}", flush=True)
    if rank == int(os.environ.get("CRASH_RANK", "1")):
        time.sleep(0.5)  # the others are waiting in the next all_reduce
        raise RuntimeError(f"rank {rank} crashed on purpose")
    dist.all_reduce(t)  # never completes: the crashed rank's connection closes


main()

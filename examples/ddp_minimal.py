"""A minimal DDP training script written for torchrun; it runs unchanged under elasticd.

elasticctl submit --nproc-per-node 2 --follow examples/ddp_minimal.py -- --steps 20
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1234 + rank)
    for step in range(args.steps):
        x = torch.randn(32, 8, generator=gen)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step} loss {loss.item():.4f} world {world} local_rank {os.environ['LOCAL_RANK']}")
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    if rank == 0:
        print(f"done: sum of ranks {int(total.item())}")
    # Every rank is past its last collective before any tears its process group down: without
    # this, gloo can abort a rank at exit ("terminate called without an active exception") when
    # its peer's sockets close first, under any launcher.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A minimal DDP training script written for torchrun; it runs unchanged under elasticd.

elasticctl submit --nproc-per-node 2 --follow examples/ddp_minimal.py -- --steps 20 --checkpoint /tmp/ddp.pt

With ``--checkpoint`` it checkpoints after every step: under elasticd, whose memory snapshots are on
by default, that is a copy into memory (the file follows behind), so a crash redoes at most the step
in flight; under plain torchrun, the file is written at every step.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from elasticd import worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint", help="resume from and checkpoint to this file, every step")
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = worker.load_checkpoint(args.checkpoint) if args.checkpoint else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    start = worker.resume_step(state)
    if rank == 0 and start:
        print(f"resuming at step {start}")
    ddp = DDP(model)
    for step in range(start, args.steps):
        gen = torch.Generator().manual_seed(1234 + 1000 * step + rank)  # a step's data, even after a restart
        x = torch.randn(32, 8, generator=gen)
        loss = ((ddp(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        worker.step(step)  # progress for `elasticctl status`; a no-op elsewhere
        if args.checkpoint:
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}
            worker.save_checkpoint(state, args.checkpoint)
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

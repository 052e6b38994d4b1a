"""Elastic DDP training that loses no step when nodes leave or join (runs under torchrun too).

    elasticctl submit --nnodes 1:4 --nproc-per-node 2 --follow examples/elastic_train.py -- \\
        --steps 500 --checkpoint /shared/ckpt.pt

Whatever the world size, every step trains on the same global batch (split across ranks), so the
result does not depend on how many nodes took part, or when they came and went.
Set LEDGER=/path to have rank 0 record each completed step (used by the tests).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from elasticd import worker

FEATURES = 8
GLOBAL_BATCH = 24  # divisible by 1, 2, 3, 4, 6 and 8 ranks


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=gen)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(GLOBAL_BATCH, 1, generator=gen)
    per = GLOBAL_BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoint", default="checkpoint.pt")
    p.add_argument("--every", type=int, default=20, help="periodic checkpoint interval (steps)")
    p.add_argument("--step-time", type=float, default=0.0, help="pretend each step takes this long")
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args()

    stop = worker.GracefulStop()
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL_BATCH % world:
        raise SystemExit(f"world size {world} does not divide the global batch {GLOBAL_BATCH}")
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    state = worker.load_checkpoint(args.checkpoint)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    start = worker.resume_step(state)
    ddp = DDP(model)
    ledger = os.environ.get("LEDGER")
    if rank == 0:
        print(f"world {world}: resuming at step {start}", flush=True)

    def checkpoint(next_step: int) -> None:
        worker.save_checkpoint({"model": model.state_dict(), "opt": opt.state_dict(), "step": next_step},
                               args.checkpoint)  # fmt: skip

    for step in range(start, args.steps):
        x, y = batch(step, rank, world)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_time)
        worker.step(step)  # progress for `elasticctl status` and --hang-timeout; a no-op elsewhere
        if rank == 0 and ledger:
            with open(ledger, "a") as f:
                f.write(f"{step} {world}\n")
        if stop.should_stop():
            checkpoint(step + 1)
            if rank == 0:
                print(f"stopping after step {step} (asked to leave); checkpoint saved", flush=True)
            break
        if (step + 1) % args.every == 0:
            checkpoint(step + 1)
    else:
        checkpoint(args.steps)
        if rank == 0:
            print(f"finished {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

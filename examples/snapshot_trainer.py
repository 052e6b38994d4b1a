"""A CPU DDP trainer that snapshots every epoch and resumes from its last snapshot.

Written for torchrun (LOCAL_RANK, RANK, WORLD_SIZE, gloo); it runs unchanged under elasticd:

    torchrun --standalone --nproc-per-node 2 examples/snapshot_trainer.py --epochs 8 --snapshot /tmp/snap.pt
    elasticrun --standalone --nproc-per-node 2 --max-restarts 3 examples/snapshot_trainer.py \\
        --epochs 8 --snapshot /tmp/snap.pt

Whoever restarts the workers (torchrun's --max-restarts, elasticd after a crash or a lost node, or
you by hand), they load the snapshot (model, optimizer, epoch) and carry on with the next epoch.
Every epoch's data order comes from (seed, epoch) alone, so a run that crashed and resumed ends
with exactly the weights of a run that never crashed: the last line printed is their digest.

When ``elasticd`` is importable, the script also reports each epoch as progress (``elasticctl
status``, hang detection) and, on SIGTERM (a drain, a scale-up), stops every rank after the same
epoch with a snapshot; without it, nothing changes. To see the resume, set
``CRASH_AT_EPOCH=K`` (and optionally ``CRASH_RANK``): that rank dies in the middle of epoch K, on
the first attempt only (``TORCHELASTIC_RESTART_COUNT`` 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:  # optional: progress, and a clean stop on SIGTERM, when elasticd is installed
    from elasticd import worker
except ImportError:  # plain torchrun
    worker = None  # type: ignore[assignment]  # mypy has no type for "this module, or None"

FEATURES, HIDDEN = 16, 32


def synthetic_regression(samples: int, seed: int) -> TensorDataset:
    """y = a fixed nonlinear function of x, plus noise: the same tensors on every rank."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=gen)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(samples, 1, generator=gen)
    return TensorDataset(x, y)


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Snapshots:
    """Rank 0 writes the snapshot atomically (temp file + rename); every rank reads it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any] | None:
        if worker is not None:
            state: dict[str, Any] | None = worker.load_checkpoint(self.path)
            return state
        if not self.path.exists():
            return None
        loaded: dict[str, Any] = torch.load(self.path, map_location="cpu", weights_only=False)
        return loaded

    def save(self, state: dict[str, Any]) -> None:
        if worker is not None:  # also fsyncs, and tells elasticd it is checkpointing
            worker.save_checkpoint(state, self.path)
            return
        if dist.get_rank() == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            torch.save(state, tmp)
            os.replace(tmp, self.path)
        dist.barrier()  # nobody moves on before the snapshot exists


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--snapshot", type=Path, default=Path("snapshot.pt"))
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", type=Path, help="rank 0 writes the final epoch, loss and digest here (JSON)")
    return p.parse_args()


def resume(snapshots: Snapshots, model: DDP, opt: torch.optim.Optimizer, attempt: int) -> int:
    """The first epoch to run: 0, or the one after the snapshot's, with its model and optimizer loaded."""
    state = snapshots.load()
    if state is None:
        return 0
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    first = int(state["epoch"]) + 1
    if dist.get_rank() == 0:
        print(f"resuming from {snapshots.path} after epoch {first - 1} (attempt {attempt})", flush=True)
    return first


def train_epoch(
    model: DDP, opt: torch.optim.Optimizer, loader: DataLoader[tuple[torch.Tensor, ...]], crash: str | None
) -> torch.Tensor:
    """One pass over this rank's share; the mean loss over every rank's. ``crash``: die halfway, saying so."""
    total = torch.zeros(2)
    for i, (x, y) in enumerate(loader):
        if crash is not None and i == len(loader) // 2:
            print(crash, file=sys.stderr, flush=True)
            os._exit(13)
        opt.zero_grad()
        batch_loss = nn.functional.mse_loss(model(x), y)
        batch_loss.backward()
        opt.step()
        total += torch.tensor([batch_loss.item() * len(x), len(x)])
    dist.all_reduce(total)
    return total[0] / total[1]


def main() -> None:
    args = parse_args()
    stop = worker.GracefulStop() if worker is not None else None
    dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE come from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    crash_epoch = int(os.environ.get("CRASH_AT_EPOCH", "-1"))
    crash_rank = int(os.environ.get("CRASH_RANK", "1"))

    data = synthetic_regression(args.samples, args.seed)
    sampler: DistributedSampler[int] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
    )
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(args.seed)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    snapshots = Snapshots(args.snapshot)
    first = resume(snapshots, model, opt, attempt)

    loss = torch.zeros(())
    epoch = first - 1
    for epoch in range(first, args.epochs):
        sampler.set_epoch(epoch)  # the epoch's order depends on (seed, epoch) only
        crashes = attempt == 0 and epoch == crash_epoch and rank == crash_rank
        loss = train_epoch(
            model, opt, loader, f"rank {rank}: injected crash in epoch {epoch}" if crashes else None
        )
        snapshots.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch})
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.5f} world {world} snapshot {args.snapshot}", flush=True)
        if worker is not None:
            worker.step(epoch)
        if stop is not None and stop.should_stop():  # asked to leave: the snapshot is already saved
            if rank == 0:
                print(f"stopping after epoch {epoch} on request", flush=True)
            break

    if rank == 0:
        final = digest(model.module)
        print(f"final epoch {epoch} loss {loss.item():.5f} digest {final}", flush=True)
        if args.result is not None:
            args.result.write_text(
                json.dumps({"epoch": epoch, "loss": loss.item(), "digest": final, "attempt": attempt})
            )
    dist.barrier()  # every rank is past its last collective before any tears the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A PyTorch Lightning trainer (a tiny regression on random data, CPU, gloo) whose checkpoint after
every step is a memory snapshot: a worker killed mid-run resumes at the last step, not at the
last file.

    elasticrun --standalone --nproc-per-node 2 --max-restarts 3 --preload lightning.pytorch \\
        examples/lightning_train.py --steps 40 --ckpt-dir /tmp/lightning-ckpt
    torchrun --standalone --nproc-per-node 2 examples/lightning_train.py --ckpt-dir /tmp/lightning-ckpt

Lightning's "last" checkpoint goes through ``elasticd.integrations.lightning.SnapshotCheckpointIO``:
under elasticd with memory snapshots (the daemon's ``snapshot_bytes``), a copy into the job's
keeper, with ``last.ckpt`` written behind; under plain torchrun, the file at every step.
``trainer.fit(ckpt_path="last")`` resumes from the newest of the two.

``--pause-at K`` (for the example test): on the first attempt, rank 1 writes ``--pause-file`` and
waits, before step K + 1, to be killed; the newest snapshot then holds step K.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import CheckpointIO, TorchCheckpointIO
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:  # optional: without elasticd, Lightning's own file checkpoints
    from elasticd import worker
    from elasticd.integrations.lightning import SnapshotCheckpointIO
except ImportError:
    worker = None  # type: ignore[assignment]  # mypy has no type for "this module, or None"

FEATURES = 16


class Regression(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Report(Callback):
    """Says where the run starts, tells elasticd each step, and pauses for the example test."""

    def __init__(self, attempt: int, pause_at: int, pause_file: Path | None) -> None:
        self.attempt, self.pause_at, self.pause_file = attempt, pause_at, pause_file

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        print(f"rank {trainer.global_rank}: start at step {trainer.global_step} (attempt {self.attempt})",
              flush=True)  # fmt: skip

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.attempt == 0 and trainer.global_rank == 1 and trainer.global_step == self.pause_at:
            assert self.pause_file is not None
            self.pause_file.write_text(f"{os.getpid()}\n")
            while True:  # until killed
                signal.pause()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if worker is not None:
            worker.step(trainer.global_step)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-dir", type=Path, default=Path("lightning-ckpt"))
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--result", type=Path, help="rank 0 writes the final step and attempt here (JSON)")
    p.add_argument("--pause-at", type=int, default=-1)
    p.add_argument("--pause-file", type=Path)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, FEATURES, generator=gen)
    y = torch.tanh(x @ torch.randn(FEATURES, 1, generator=gen))
    data = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    pl.seed_everything(0, verbose=False)
    io: CheckpointIO = SnapshotCheckpointIO() if worker is not None else TorchCheckpointIO()
    every_step = ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, save_top_k=0, every_n_train_steps=1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        max_steps=args.steps,
        plugins=[io],
        callbacks=[Report(attempt, args.pause_at, args.pause_file), every_step],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(args.lr), data, ckpt_path="last")
    if trainer.global_rank == 0:
        print(f"finished at step {trainer.global_step} (attempt {attempt})", flush=True)
        if args.result is not None:
            args.result.write_text(json.dumps({"step": trainer.global_step, "attempt": attempt}))


if __name__ == "__main__":
    main()

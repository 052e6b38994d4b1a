"""A Hugging Face ``Trainer`` (a tiny regression on random data, CPU, gloo) that saves after every
step as a memory snapshot: a worker killed mid-run resumes at the last step, not at the last
checkpoint directory.

    elasticrun --standalone --nproc-per-node 2 --max-restarts 3 --preload transformers.trainer \\
        examples/hf_train.py --steps 40 --output-dir /tmp/hf-out
    torchrun --standalone --nproc-per-node 2 examples/hf_train.py --output-dir /tmp/hf-out

``elasticd.integrations.huggingface.SnapshotTrainer`` takes every save (``save_strategy="steps"``,
``save_steps=1``) into the job's keeper under elasticd with memory snapshots (the daemon's
``snapshot_bytes``); ``OUT/elasticd-snapshot.pt`` is written behind every ``--persist-every``
saves and when the workers fail, and HF's ``checkpoint-N`` directory at the end (and every
``--checkpoint-every`` saves if asked); under plain torchrun, HF writes the directory at every
save. A restart resumes from the newest snapshot in memory, else from the newest of the file and
the directories.

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

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

try:  # optional: without elasticd, HF's own checkpoints
    from elasticd import worker
    from elasticd.integrations.huggingface import SnapshotTrainer
except ImportError:
    worker = None  # type: ignore[assignment]  # mypy has no type for "this module, or None"

FEATURES = 16


class Regression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.net(x)
        if labels is None:
            return {"logits": out}
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


class Samples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=gen)
        self.y = torch.tanh(self.x @ torch.randn(FEATURES, 1, generator=gen))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Report(TrainerCallback):
    """Says where the run starts, tells elasticd each step, and pauses for the example test."""

    def __init__(self, attempt: int, pause_at: int, pause_file: Path | None) -> None:
        self.attempt, self.pause_at, self.pause_file = attempt, pause_at, pause_file
        self.rank = int(os.environ.get("RANK", "0"))

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        print(f"rank {self.rank}: start at step {state.global_step} (attempt {self.attempt})", flush=True)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.attempt == 0 and self.rank == 1 and state.global_step == self.pause_at:
            assert self.pause_file is not None
            self.pause_file.write_text(f"{os.getpid()}\n")
            while True:  # until killed
                signal.pause()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if worker is not None:
            worker.step(state.global_step)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--output-dir", type=Path, default=Path("hf-out"))
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--persist-every", type=int, default=10, help="elasticd's file, behind")
    p.add_argument("--checkpoint-every", type=int, default=0, help="HF's directory (0: at the end)")
    p.add_argument("--result", type=Path, help="rank 0 writes the final step and attempt here (JSON)")
    p.add_argument("--pause-at", type=int, default=-1)
    p.add_argument("--pause-file", type=Path)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    training = TrainingArguments(
        output_dir=str(args.output_dir),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=0.05,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=2,
        logging_steps=10,
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        seed=0,
    )
    torch.manual_seed(0)
    kwargs: dict[str, Any] = {
        "model": Regression(),
        "args": training,
        "train_dataset": Samples(4096),
        "callbacks": [Report(attempt, args.pause_at, args.pause_file)],
    }
    trainer = (
        SnapshotTrainer(**kwargs, persist_every=args.persist_every, checkpoint_every=args.checkpoint_every)
        if worker is not None
        else Trainer(**kwargs)
    )
    last: str | None = None
    if args.output_dir.is_dir():
        last = get_last_checkpoint(str(args.output_dir))  # type: ignore[no-untyped-call]  # HF leaves it unannotated
    trainer.train(resume_from_checkpoint=last)
    if trainer.is_world_process_zero():
        print(f"finished at step {trainer.state.global_step} (attempt {attempt})", flush=True)
        if args.result is not None:
            args.result.write_text(json.dumps({"step": trainer.state.global_step, "attempt": attempt}))


if __name__ == "__main__":
    main()

"""Hugging Face ``Trainer``'s checkpoints as memory snapshots: ``SnapshotTrainer``.

::

    from elasticd.integrations.huggingface import SnapshotTrainer

    args = TrainingArguments(OUT, save_strategy="steps", save_steps=1, ...)
    trainer = SnapshotTrainer(model=model, args=args, train_dataset=data)
    trainer.train(resume_from_checkpoint=get_last_checkpoint(OUT))

Each save (``save_strategy``) copies the model's, optimizer's, scheduler's and scaler's state, this
rank's random generators and the trainer's state into the job's snapshot keeper, and returns.
Persisting is behind, as for ``worker.save_checkpoint``: rank 0's snapshot goes to
``OUT/elasticd-snapshot.pt`` (a ``torch.save`` file), written from the snapshot by a thread every
``persist_every`` saves (default ``$ELASTICD_SNAPSHOT_PERSIST_EVERY``, else 10), after a restore and
at the script's normal exit, and by the job's keeper when the workers fail. HF's own
``checkpoint-N`` directory is written by HF's code at the last step only (the loop is over then),
or every ``checkpoint_every`` saves if asked (synchronously: HF's layout is HF's to write, from
the live model), or at every save where HF reads its directories (``load_best_model_at_end``,
``push_to_hub``).

``train`` first asks the job's keepers (one collective: every rank calls ``train``) for the newest
complete snapshot of this output directory; else it reads ``elasticd-snapshot.pt`` when every rank
can, and its step is newer than the directory ``resume_from_checkpoint`` names (a job that failed
as a whole and was submitted again; ``resume_from_checkpoint=False`` starts afresh). Either way
the run resumes from it: HF's resume reads the model, optimizer, scheduler, scaler and random
generators from the snapshot, and the trainer's state (a few kB of JSON, which HF reads from a
file) from a scratch directory.

Under plain torchrun (no keeper), with DeepSpeed or FSDP (their checkpoints are theirs), or when a
keeper cannot take the state, every save is HF's own (on every rank: the ranks agree at each save,
with one tiny all_reduce, since HF's save holds collectives); the file still resumes a run that
elasticd snapshotted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import get_last_checkpoint

from elasticd.integrations.rules import callback_states, due, file_is_newer, in_loop_directories
from elasticd.workers.snapshot_program import collective, memory

SNAPSHOT_FILE = "elasticd-snapshot.pt"


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.random.set_rng_state_all(state["cuda"])


class SnapshotTrainer(Trainer):
    """A ``Trainer`` whose saves are memory snapshots, persisted behind; HF's directory at the end."""

    def __init__(
        self, *args: Any, persist_every: int | None = None, checkpoint_every: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.persist_every = persist_every  # None: $ELASTICD_SNAPSHOT_PERSIST_EVERY, else 10
        self.checkpoint_every = checkpoint_every  # HF's directory in the loop (0: at the last step)
        self._written = 0  # the step of the last checkpoint directory written (or restored)
        self._restored: tuple[str, dict[str, Any]] | None = None  # (scratch directory, snapshot)

    def snapshot_path(self) -> Path:
        """The snapshot's name in the keepers, and its file after a restore."""
        return Path(self.args.output_dir or ".") / SNAPSHOT_FILE

    def _in_memory(self) -> bool:
        return memory.on() and not (self.is_deepspeed_enabled or self.is_fsdp_enabled)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        if not self._in_memory():
            super()._save_checkpoint(model, trial)
            return
        if self.hp_search_backend is None and trial is None:
            self.store_flos()  # on every rank, as HF does: a collective
        step = self.state.global_step
        held = memory.save(self._state(), self.snapshot_path(), 0, self.persist_every, False)
        every = 1 if in_loop_directories(self.args.load_best_model_at_end, self.args.push_to_hub) else 0
        every = every or self.checkpoint_every
        if not self._everyone(held) or due(step, self._written, every, self.state.max_steps):
            super()._save_checkpoint(model, trial)
            self._written = step

    def _everyone(self, held: bool) -> bool:
        """Whether every rank's keeper took its snapshot (one tiny all_reduce): HF's own save holds
        collectives, so when one rank must write the directory, every rank does."""
        dist = collective.group()
        if dist is None:
            return held
        flag = torch.tensor([1 if held else 0], dtype=torch.int32, device=self.args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def _state(self) -> dict[str, Any]:
        trainer_state = dataclasses.asdict(self.state)
        held: Any = self.state.stateful_callbacks  # a dict once the state is built
        trainer_state["stateful_callbacks"] = callback_states(
            held if isinstance(held, dict) else {},
            [
                (type(cb).__name__, cb.state())
                for cb in [*self.callback_handler.callbacks, self.control]
                if isinstance(cb, ExportableState)
            ],
        )
        scaler = getattr(self.accelerator, "scaler", None)
        return {
            "step": self.state.global_step,
            "model": cast(nn.Module, self.model).state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rng_state(),
            "trainer_state": json.dumps(trainer_state, indent=2, sort_keys=True) + "\n",
        }

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        found = memory.restore(self.snapshot_path(), collective.group()) if self._in_memory() else None
        if not isinstance(found, dict) and resume_from_checkpoint is not False:
            found = self._from_file(resume_from_checkpoint)
        if not isinstance(found, dict):
            return super().train(resume_from_checkpoint, *args, **kwargs)
        scratch = tempfile.mkdtemp(prefix="elasticd-hf-")
        try:
            where = Path(scratch) / f"checkpoint-{found['step']}"
            where.mkdir()
            (where / TRAINER_STATE_NAME).write_text(found["trainer_state"])
            self._restored, self._written = (str(where), found), int(found["step"])
            return super().train(str(where), *args, **kwargs)
        finally:
            self._restored = None
            shutil.rmtree(scratch, ignore_errors=True)

    def _from_file(self, resume_from_checkpoint: str | bool | None) -> dict[str, Any] | None:
        """``elasticd-snapshot.pt`` when every rank reads it at one step, newer than the HF
        directory the run would resume from (a collective under ``torch.distributed``)."""
        path, found = self.snapshot_path(), None
        if path.is_file():
            try:
                # mapped, not read: only its step is needed unless it is the newest (the job's own file)
                found = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
            except Exception as exc:  # a torn or foreign file: HF's directories, as without it
                memory.say("snapshot.file_unreadable", path=path, error=repr(exc)[:200])
        mine = _step_of(found)
        lowest, highest = self._agreed(mine)
        directory = self._directory_step(resume_from_checkpoint)
        if not file_is_newer(lowest, highest, directory):
            return None
        memory.say("snapshot.restored", source="disk", rank=self.args.process_index, step=mine, path=path)
        return cast(dict[str, Any], found)

    def _agreed(self, step: int) -> tuple[int, int]:
        """The lowest and highest of every rank's ``step`` (two tiny all_reduces)."""
        dist = collective.group()
        if dist is None:
            return step, step
        low = torch.tensor([step], dtype=torch.int64, device=self.args.device)
        high = low.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        return int(low.item()), int(high.item())

    def _directory_step(self, resume_from_checkpoint: str | bool | None) -> int:
        """The global step of the HF directory ``train`` would resume from, -1 for none."""
        where = resume_from_checkpoint
        if where is True:
            out = self.args.output_dir or "."
            where = get_last_checkpoint(out) if os.path.isdir(out) else None  # type: ignore[no-untyped-call]
        if not isinstance(where, str):
            return -1
        try:
            held = json.loads((Path(where) / TRAINER_STATE_NAME).read_text())
            return int(held["global_step"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    def _snapshot_of(self, checkpoint: str | None) -> dict[str, Any] | None:
        """The restored snapshot, when HF resumes from its scratch directory."""
        return self._restored[1] if self._restored is not None and checkpoint == self._restored[0] else None

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        found = self._snapshot_of(resume_from_checkpoint)
        if found is None:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            return
        cast(nn.Module, model if model is not None else self.model).load_state_dict(found["model"])

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        found = self._snapshot_of(checkpoint)
        if found is None:
            super()._load_optimizer_and_scheduler(checkpoint)
            return
        if found["optimizer"] is not None and self.optimizer is not None:
            self.optimizer.load_state_dict(found["optimizer"])
        if found["scheduler"] is not None and self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(found["scheduler"])

    def _load_scaler(self, checkpoint: str | None) -> None:
        found = self._snapshot_of(checkpoint)
        if found is None:
            super()._load_scaler(checkpoint)
            return
        scaler = getattr(self.accelerator, "scaler", None)
        if found["scaler"] is not None and scaler is not None:
            scaler.load_state_dict(found["scaler"])

    def _load_rng_state(self, checkpoint: str | None) -> None:
        found = self._snapshot_of(checkpoint)
        if found is None:
            super()._load_rng_state(checkpoint)
            return
        set_rng_state(found["rng"])


def _step_of(found: Any) -> int:
    """The step of a state ``SnapshotTrainer`` saved, -1 for anything else."""
    if not isinstance(found, dict) or "trainer_state" not in found:
        return -1
    step = found.get("step")
    return step if type(step) is int and step >= 0 else -1

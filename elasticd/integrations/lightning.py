"""PyTorch Lightning's checkpoints as memory snapshots: ``SnapshotCheckpointIO``.

::

    from elasticd.integrations.lightning import SnapshotCheckpointIO

    every_step = ModelCheckpoint(dirpath=CKPT_DIR, save_last=True, save_top_k=0, every_n_train_steps=1)
    trainer = Trainer(plugins=[SnapshotCheckpointIO()], callbacks=[every_step], ...)
    trainer.fit(model, ckpt_path="last")

Lightning's "last" checkpoint (``last.ckpt``, ``last-v1.ckpt``: the one a resume reads) is saved
as a memory snapshot in the job's keeper, and its file is written behind (``elasticd.worker``'s
``save_checkpoint``): every ``persist_every`` saves, at a normal exit, after a restore, and at
once when the file does not exist yet, because Lightning resolves ``ckpt_path="last"`` by looking
for the file before anything is loaded. ``load_checkpoint`` then returns the newest complete
snapshot any keeper of the job holds (local memory, a peer's replica), and only else the file.

Every other checkpoint (top-k, ``trainer.save_checkpoint``) is written at once by Lightning's own
``TorchCheckpointIO``: its name changes at every save, and each name a keeper holds keeps its two
segments for the job's life. Under plain torchrun (no keeper), or where a keeper cannot take the
state, the "last" file is written at once, atomically (temporary file, fsync, rename), as
``elasticd.worker.save_checkpoint`` writes it.

Lightning saves on global rank 0 only, so rank 0's keeper holds the snapshot; a load is a
collective (every rank calls it, as Lightning does), and each rank reads rank 0's copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from elasticd import worker
from elasticd.integrations.rules import snapshotted, with_step
from elasticd.workers.snapshot_program import collective, memory


class SnapshotCheckpointIO(TorchCheckpointIO):
    """A ``CheckpointIO`` that keeps Lightning's "last" checkpoint in the job's snapshot keepers.

    ``persist_every``: the file is written behind every that many snapshots (default
    ``$ELASTICD_SNAPSHOT_PERSIST_EVERY``, else 10; 0: only at exit, on a restore, and the first).
    """

    def __init__(self, persist_every: int | None = None) -> None:
        super().__init__()
        self.persist_every = persist_every

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not snapshotted(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target, state = Path(path), with_step(checkpoint)
        rank = collective.rank(fallback=0)
        if memory.save(state, target, rank, self.persist_every, not target.exists()):
            return
        with worker.checkpointing():
            memory.write_file(state, target)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if snapshotted(path):
            found = memory.restore(Path(path), collective.group())
            if isinstance(found, dict):
                return found
        if map_location is None:  # Lightning's own default: tensors where they were saved
            return super().load_checkpoint(path, weights_only=weights_only)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def teardown(self) -> None:
        """The file being written behind is finished before the trainer lets go of its plugins."""
        memory.flush()
        super().teardown()

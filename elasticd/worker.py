"""Helpers for training scripts: stop together on SIGTERM, checkpoint atomically, resume.

This module and the workers' side of memory snapshots (``elasticd.workers.snapshot_program``: its
``frame``, ``client``, ``memory``, ``restore``, ``device``, ``dcp``) are the only ones that touch
torch, lazily, beside the frameworks' integrations (``elasticd.integrations``: Lightning and Hugging
Face, built on these); the daemon never imports them. It works the same under elasticd and under
plain ``torchrun``.

The pattern (see ``examples/elastic_train.py``)::

    from elasticd import worker

    stop = worker.GracefulStop()                   # SIGTERM sets a flag instead of killing
    state = worker.load_checkpoint(CKPT)           # None on the first run
    start = worker.resume_step(state)              # the next step to run
    for step in range(start, total_steps):
        train_one_step(step)
        if stop.should_stop():                     # one tiny all_reduce: every rank agrees
            worker.save_checkpoint({"step": step + 1, ...}, CKPT)
            break                                  # all ranks leave after the same step
        if (step + 1) % every == 0:
            worker.save_checkpoint({"step": step + 1, ...}, CKPT)

Progress: ``worker.step()`` after each step (or ``worker.step(n)``) tells the daemon; ``status``
shows each rank's last step, steps/s and stragglers, and ``--hang-timeout`` judges hangs by it.
Without elasticd (plain ``torchrun``), it does nothing. A script in another language writes the
same lines (``step 12``) to ``$ELASTICD_HEARTBEAT_FILE``.

When elasticd changes the membership of a job (a drain, a node joining), every worker gets
SIGTERM and the stop grace period: with this pattern no completed step is lost. A crash (SIGKILL,
a lost node) loses the steps since the last periodic checkpoint, unless the daemons keep memory
snapshots (on unless ``snapshot_bytes = 0``, or the host is too small for the bound a daemon derives
from its memory): then ``save_checkpoint`` after every step costs about a copy of the
state into the job's snapshot keeper on the node, the file is written behind, and
``load_checkpoint`` resumes from the newest step any keeper of the job holds, on this node or
replicated on another (``elasticd.workers.snapshot_program``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from elasticd.progress.protocol import MAX_STEP, PROGRESS_FD_ENV
from elasticd.workers.snapshot_program import collective
from elasticd.workers.snapshot_program import memory as snapshots


class _Progress:
    """The progress pipe of ``ELASTICD_PROGRESS_FD``, if the daemon gave one. Writes never block
    and never raise: a full pipe or a closed one drops the report, training goes on."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._checked = False

    def _open(self) -> int | None:
        if not self._checked:
            self._checked = True
            text = os.environ.get(PROGRESS_FD_ENV, "")
            if text.isdigit():
                fd = int(text)
                try:
                    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
                    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
                    os.set_inheritable(fd, False)  # our own children are not this rank
                    self._fd = fd
                except OSError:
                    self._fd = None
        return self._fd

    def send(self, line: str) -> None:
        fd = self._open()
        if fd is None:
            return
        with contextlib.suppress(OSError):  # EAGAIN (the daemon is behind), EPIPE, EBADF: dropped
            os.write(fd, line.encode())  # one short write: atomic on a pipe


_progress = _Progress()


def step(n: int | None = None) -> None:
    """Report that step ``n`` finished (None: one more than the last). Cheap (one write, no
    torch), never blocks or raises, and does nothing outside elasticd."""
    if n is None:
        _progress.send("step\n")
    elif isinstance(n, int) and 0 <= n <= MAX_STEP:
        _progress.send(f"step {n}\n")


@contextlib.contextmanager
def checkpointing() -> Iterator[None]:
    """Around a checkpoint: it runs under the checkpoint phase's hang timeout, not a step's."""
    _progress.send("phase checkpoint\n")
    try:
        yield
    finally:
        _progress.send("phase step\n")


class GracefulStop:
    """Turns SIGTERM (and any of ``signals``) into a request to stop at the next step boundary."""

    def __init__(self, signals: Iterable[signal.Signals] = (signal.SIGTERM,)) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self not in _STOPS:
            _STOPS.append(self)

    def should_stop(self) -> bool:
        """True on every rank, at the same step, as soon as any rank was asked to stop.

        Call it at the same point of every step on every rank: it is a collective.
        """
        dist = collective.group()
        if dist is None:
            return self.requested
        import torch

        backend = dist.get_backend()
        device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = bool(flag.item())
        # A signal that lands while this rank waits in the collective (where the ranks spend
        # most of a call) came after its vote: it stays requested, and this rank's vote at the
        # next call stops every rank. The answer is the vote's, the same on every rank.
        self.requested = self.requested or agreed
        if agreed and self not in _STOPS:  # another rank was asked: a snapshot persists now
            _STOPS.append(self)
        return agreed

    def restore(self) -> None:
        """Put the previous signal handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


_STOPS: list[GracefulStop] = []  # the stops a signal requested: a snapshot persists at once then


def _stopping() -> bool:
    return bool(_STOPS)


def save_checkpoint(
    state: Any,
    path: str | os.PathLike[str],
    *,
    rank: int = 0,
    memory: bool = True,
    persist_every: int | None = None,
) -> None:
    """Checkpoint ``state`` (the same on every rank; rank ``rank`` writes the file).

    Under elasticd with memory snapshots on (the daemon's ``snapshot_bytes``, derived by default) and
    ``memory``: every rank's state is copied into the job's snapshot keeper on this node, and this returns
    as soon as the copy is committed, with no collective. ``path`` is written behind, atomically, from the
    snapshot: every ``persist_every`` snapshots (default ``$ELASTICD_SNAPSHOT_PERSIST_EVERY``, else 10),
    at once after a stop was requested (``GracefulStop``), after a restart restored a snapshot, and at the
    process's normal exit; when a worker fails, the job's keeper writes the newest snapshot itself once
    the group has stopped. Elsewhere (plain torchrun, or the keeper cannot take it): written at once
    (temporary file, fsync, rename, fsync of the directory), then every rank waits for it: when this
    returns, the checkpoint is durable for everyone. A rank whose keeper cannot take the state while the
    job's snapshots are on (its keeper died, or the state is over the bound) writes without that wait: the
    other ranks, snapshotting to memory, make no collective.
    """
    with checkpointing():  # a memory snapshot's stall too: the job's goodput books it as checkpoint
        if memory and snapshots.save(state, Path(path), rank, persist_every, _stopping()):
            return
        _save(state, Path(path), rank, together=not (memory and snapshots.on()))


def _save(state: Any, target: Path, rank: int, together: bool = True) -> None:
    if collective.rank() == rank:
        snapshots.write_file(state, target)
    dist = collective.group()
    if together and dist is not None:
        dist.barrier()


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu", *, memory: bool = True) -> Any:
    """The newest checkpoint every rank can load, or None if there is none yet.

    Under elasticd with memory snapshots on, and ``memory``: the newest step any of the job's
    keepers holds (each rank its own rank's copy, else any rank's: the state is the same on every
    rank), agreed with one ``all_gather`` when ``torch.distributed`` is initialised, so every rank
    must call it then; else the file at ``path`` (and elsewhere, as under plain torchrun, only the
    file: no collective). Each rank logs where its state came from (``snapshot.restored
    source=memory|peer|disk``) to its stderr."""
    if memory:
        found = snapshots.restore(Path(path), collective.group())
        if found is not None:
            return found
    import torch

    target = Path(path)
    if not target.exists():
        return None
    state = torch.load(target, map_location=map_location, weights_only=False)
    step = state.get("step") if isinstance(state, dict) else None  # a state need not count steps
    snapshots.say("snapshot.restored", source="disk", step=step if isinstance(step, int) else -1)
    return state


def snapshot_writer(
    path: str | os.PathLike[str], step: int | None = None, persist_every: int | None = None
) -> Any:
    """A ``torch.distributed.checkpoint`` ``StorageWriter`` on the job's snapshot keepers:
    ``dcp.save(state, storage_writer=worker.snapshot_writer(DIR, step))``. Each rank snapshots its
    own shard; ``DIR`` is written behind, from the snapshots, every ``persist_every`` saves, at
    once after a stop was requested (``GracefulStop``) and at the script's normal exit (in the
    call, by torch's ``FileSystemWriter``, without a keeper). ``step`` orders snapshots (default:
    one more than the last saved or restored here)."""
    from elasticd.workers.snapshot_program.dcp import SnapshotWriter

    return SnapshotWriter(path, step, persist_every, _stopping())


def snapshot_reader(path: str | os.PathLike[str]) -> Any:
    """The ``StorageReader`` to match: ``dcp.load(state, storage_reader=worker.snapshot_reader(DIR))``
    reads the newest step whose every shard a keeper holds, at any world size; else ``DIR``."""
    from elasticd.workers.snapshot_program.dcp import SnapshotReader

    return SnapshotReader(path)


def resume_step(state: Any, key: str = "step") -> int:
    """The step to start from: the one after the last completed step, or 0."""
    return int(state[key]) if state else 0

"""A ``torch.distributed.checkpoint`` directory written behind, from the ranks' snapshots (the
workers' side of ``dcp``; torch imported here, by the job's processes only).

Each rank's thread writes its shard from its snapshot segment, never from the training loop's
tensors, with torch's own ``FileSystemWriter`` (so ``FileSystemReader`` and ``dcp.load`` read the
directory as theirs), into files named for the step (``__<rank>_s<step>_<n>.distcp``), then a
small record of where each item lies (``.__<rank>_s<step>.results``). The coordinator's thread
waits for every rank's record of that step (each rank writes its own; no collective runs behind
the loop), writes ``.metadata`` (a temporary file, fsync, rename: the commit) and removes what
older steps left. A crash at any point leaves the previous ``.metadata`` and every file it names
whole: a step's files are never written over, and a step is read only once its ``.metadata`` is
in place. Like torch's own writer, it takes ``DIR`` to be shared by the ranks that write it.

A segment is written again two snapshots later (the keeper's double buffer): a thread still
reading one then is waited for (``Behind.before_snapshot``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import io
import os
import pickle
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, FileSystemWriter, _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem
from torch.distributed.checkpoint.storage import WriteResult

from elasticd.workers.snapshot_program import frame
from elasticd.workers.snapshot_program.client import SnapshotError
from elasticd.workers.snapshot_program.filing import DCP_META, DCP_SHARDS, WRITE_TIMEOUT_S, file_key
from elasticd.workers.snapshot_program.memory import SNAPSHOTS, WriterThread, atomic_write, say

METADATA = ".metadata"
LOCK = ".elasticd.lock"  # a commit's check and rename, one process at a time
KEEPER = "k"  # the tag of the files a keeper's child writes (never the ones a worker may write)
_SHARD = re.compile(r"__(\d+)_s(\d+)k?_\d+\.distcp")
_RESULTS = re.compile(r"\.__(\d+)_s(\d+)k?\.results")
POLL_S = 0.05  # the coordinator's look for the other ranks' records
KEEPER_WAIT_S = 60.0  # a keeper's commit, for the other nodes' keepers (within filing's bound)


def prefix(rank: int, step: int, tag: str = "") -> _StoragePrefix:
    """The names of ``rank``'s files of ``step``: no step writes over another's, and a keeper's
    child (``tag``) never over a worker's."""
    return _StoragePrefix(f"__{rank}_s{step}{tag}_")


def results_name(rank: int, step: int, tag: str = "") -> str:
    return f".__{rank}_s{step}{tag}.results"


class _Resolved:
    """What torch's writer asks of a planner (``resolve_data``), answered from the snapshot's
    copy of each item, not the live state."""

    def __init__(self, items: dict[MetadataIndex, Any]) -> None:
        self.items = items

    def resolve_data(self, write_item: WriteItem) -> Any:
        value = self.items[write_item.index]
        return io.BytesIO(value) if isinstance(value, bytes) else value


def write_shard(path: Path, buf: Any, rank: int) -> None:
    """Write this rank's shard of the snapshot in ``buf`` under ``path``."""
    step, state = frame.read(buf, views=True)
    write_items(path, state["items"], state["plan"], rank, int(step))


def write_items(
    path: Path, items: dict[MetadataIndex, Any], plan: SavePlan, rank: int, step: int, tag: str = ""
) -> None:
    """Write a rank's shard of ``step`` (its snapshot's ``items``, its save ``plan``) with torch's
    writer into files of the step, then its record (the writer's results: each item's file, offset
    and length)."""
    writer = FileSystemWriter(path)
    writer.set_up_storage_writer(False, rank=rank)
    writer.fs.mkdir(writer.path)
    planner = cast(SavePlanner, _Resolved(items))
    done = writer.write_data(replace(plan, storage_data=prefix(rank, step, tag)), planner)
    _atomic(path / results_name(rank, step, tag), pickle.dumps(done.value()))


def _record(path: Path, rank: int, step: int) -> Path | None:
    for tag in ("", KEEPER):
        record = path / results_name(rank, step, tag)
        if record.exists():
            return record
    return None


def commit(path: Path, metadata: Metadata, step: int, world: int, timeout_s: float = WRITE_TIMEOUT_S) -> bool:
    """Once every rank's record of ``step`` is in ``path`` (a worker's or a keeper's, within
    ``timeout_s``), write the checkpoint's ``.metadata`` and remove older steps' files, unless it
    holds ``step`` or a newer one already (the directory never goes back); False when a record
    never came."""
    deadline = time.monotonic() + timeout_s
    results: list[WriteResult] = []
    for rank in range(world):
        while (record := _record(path, rank, step)) is None:
            if time.monotonic() > deadline:
                say("snapshot.persist_failed", kind="dcp", step=step, reason=f"rank {rank} wrote no shard")
                return False
            time.sleep(POLL_S)
        results.extend(pickle.loads(record.read_bytes()))  # written by the job's own processes
    meta = replace(metadata, storage_data={r.index: r.storage_data for r in results})
    meta.version = CURRENT_DCP_VERSION
    meta.storage_meta = StorageMeta(checkpoint_id=str(path), save_id=uuid.uuid4().hex)
    with _locked(path):
        if committed(path) >= step:
            return True
        _atomic(path / METADATA, pickle.dumps(meta))
        _sweep(path, step)
    return True


def committed(path: Path) -> int:
    """The step ``path``'s ``.metadata`` holds (-1: none, or not one written here)."""
    try:
        meta = pickle.loads((path / METADATA).read_bytes())  # the job's own file
        names = {info.relative_path for info in meta.storage_data.values()}
    except Exception:
        return -1
    steps = {int(m[2]) for m in map(_SHARD.fullmatch, names) if m is not None}
    return max(steps) if len(steps) == 1 else -1


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def from_keeper(target: str, step: int, state: Any) -> None:
    """What a keeper's child writes once the workers failed (``persister``): a rank's shard of
    ``step`` (``target`` is ``DIR#dcp@rank``), unless the directory or the rank's own thread has
    it; or the commit of ``step`` (``DIR#dcp-meta``), once every rank's shard is in."""
    if target.endswith(DCP_META):
        path = Path(target[: -len(DCP_META)])
        if committed(path) >= step:
            return
        if not commit(path, state["metadata"], step, int(state["world"]), KEEPER_WAIT_S):
            raise SystemExit(f"step {step}: not every rank's shard reached {path}")
        return
    name, _, rank = target.rpartition("@")
    path = Path(name[: -len(DCP_SHARDS)])
    if committed(path) >= step or _record(path, int(rank), step) is not None:
        return
    write_items(path, state["items"], state["plan"], int(rank), step, KEEPER)
    with _locked(path):  # a newer step's commit may have swept while this shard was written
        newest = committed(path)
        if newest > step:
            _sweep(path, newest)


def _sweep(path: Path, step: int) -> None:
    """Remove the files ``.metadata`` no longer names: older steps' shards and every record up to
    ``step`` (newer ones are the next commit's), and files of torch's own naming."""
    for entry in os.scandir(path):
        shard, record = _SHARD.fullmatch(entry.name), _RESULTS.fullmatch(entry.name)
        old = (shard is not None and int(shard[2]) < step) or (record is not None and int(record[2]) <= step)
        plain = shard is None and entry.name.startswith("__") and entry.name.endswith(".distcp")
        if old or plain:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _atomic(target: Path, data: bytes) -> None:
    atomic_write(target, lambda f: f.write(data))


class Behind(WriterThread):
    """One checkpoint directory's writes behind, in this process: one thread at a time."""

    said = {"kind": "dcp"}

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.count = 0  # snapshots taken by this process
        self.newest: tuple[Any, int] | None = None  # its shard: the segment, the rank
        self.newest_step = -1
        self.lead: tuple[Metadata, int] | None = None  # the coordinator's: metadata, world size
        self.started = -1  # the newest step a thread was started for

    def taken(self, shard: tuple[Any, int], step: int) -> None:
        """A snapshot of this rank's shard was committed to its keeper (in ``shard[0]``)."""
        if not _BEHIND_EXIT:
            _BEHIND_EXIT.append(True)
            atexit.register(at_exit)
        self.count += 1
        self.newest, self.newest_step = shard, step

    def start_newest(self, lead: tuple[Metadata, int] | None, wait: bool) -> None:
        """Write the newest shard behind and, when ``lead`` (the metadata and the world size) is
        given, commit its step once every rank's record is in; ``wait``: before returning."""
        shard, step = self.newest, self.newest_step
        if shard is None or shard[0] is None:
            return
        self.wait()

        def run() -> None:
            try:
                write_shard(self.path, *shard)
                _tell(file_key(f"{self.path}{DCP_SHARDS}", shard[1]), step)
                if lead is not None and commit(self.path, lead[0], step, lead[1]):
                    _tell(f"{self.path}{DCP_META}", step)
                    say("snapshot.persisted", kind="dcp", step=step, path=self.path)
            except BaseException as exc:  # reported by the next wait, on the training thread
                self.error = exc

        self.started_at, self.started = self.count - 1, step
        self.thread = threading.Thread(target=run, name="elasticd-dcp-persist", daemon=False)
        self.thread.start()
        if wait:
            self.wait()


def _tell(key: str, step: int) -> None:
    """The keeper: ``step`` of the file ``key`` is on disk (its own write after a failure skips it)."""
    client = SNAPSHOTS.client()
    if client is not None:
        with contextlib.suppress(SnapshotError):
            client.written(key, step)


_BEHIND: dict[Path, Behind] = {}
_BEHIND_EXIT: list[bool] = []


def behind(path: Path) -> Behind:
    """This process's writes behind of the checkpoint directory ``path``."""
    key = path.absolute()
    if key not in _BEHIND:
        _BEHIND[key] = Behind(key)
    return _BEHIND[key]


def at_exit() -> None:
    """A script that ends leaves its newest step in the directory (every rank its shard, the
    coordinator the commit). One that fails (an uncaught exception) does not: its step may be
    one the other ranks never reached."""
    if hasattr(sys, "last_value"):
        return
    for files in _BEHIND.values():
        files.wait()
        if files.newest_step > files.started:
            files.start_newest(files.lead, wait=True)

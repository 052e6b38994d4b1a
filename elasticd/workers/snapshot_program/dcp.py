"""``torch.distributed.checkpoint`` on the keepers: a ``StorageWriter`` and a ``StorageReader``.

``dcp.save(state, storage_writer=worker.snapshot_writer(DIR, step))`` snapshots each rank's own
shard (the items its save plan holds, keyed by their ``MetadataIndex``) into its keeper, and the
coordinator then snapshots the checkpoint's ``Metadata`` with which rank holds which item. Every
``persist_every`` saves, at once when a stop was requested, and at the script's normal exit, the
step also goes to ``DIR``, behind, from the snapshots (``dcpfiles``); without a keeper, torch's
``FileSystemWriter`` writes it in the call. ``dcp.load(state, storage_reader=worker.snapshot_reader(DIR))``
resumes at any world size: the ranks agree (one gather in ``read_metadata``) on the
newest step whose metadata and every owner's shard some keeper of the job holds, and each rank
reads the shards its plan names from the nearest keeper; else every rank reads ``DIR``, and says
why on its stderr.
"""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path
from typing import Any

from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from elasticd.workers.snapshot_program import collective, dcpfiles
from elasticd.workers.snapshot_program import restore as nearest
from elasticd.workers.snapshot_program.client import SnapshotError
from elasticd.workers.snapshot_program.filing import DCP_META, DCP_SHARDS
from elasticd.workers.snapshot_program.memory import DEFAULT_PERSIST_EVERY, PERSIST_EVERY_ENV, SNAPSHOTS, say
from elasticd.workers.snapshot_program.protocol import SOCKET_ENV

_LAST_STEP: dict[str, int] = {}  # per checkpoint directory: the newest step saved or restored here


def _names(path: Path) -> tuple[str, str]:
    base = str(path.absolute())
    return base + DCP_SHARDS, base + DCP_META


class SnapshotWriter(StorageWriter):
    def __init__(
        self,
        path: str | os.PathLike[str],
        step: int | None = None,
        persist_every: int | None = None,
        stopping: bool = False,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        key = str(self.path.absolute())
        self.step = step if step is not None else _LAST_STEP.get(key, -1) + 1
        _LAST_STEP[key] = self.step
        every = persist_every
        if every is None:
            text = os.environ.get(PERSIST_EVERY_ENV, "")
            every = int(text) if text.isdigit() else DEFAULT_PERSIST_EVERY
        self.persist = SNAPSHOTS.client() is None  # torch's writer, in the call
        self.due = stopping or (every > 0 and (self.step + 1) % every == 0)  # behind, from the snapshot
        self.stopping = stopping
        self.fs = FileSystemWriter(path)
        self.memory = True
        self.is_coordinator = False

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.fs.reset(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.fs.set_up_storage_writer(is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return self.fs.prepare_local_plan(plan) if self.persist else plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return self.fs.prepare_global_plan(plans) if self.persist else plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        items: dict[MetadataIndex, Any] = {}
        for item in plan.items:
            data = planner.resolve_data(item)
            items[item.index] = data.getvalue() if isinstance(data, io.BytesIO) else data.detach()
        client, name, me = SNAPSHOTS.client(), _names(self.path)[0], collective.rank(fallback=0)
        if client is not None:
            files = dcpfiles.behind(self.path)
            files.before_snapshot(files.count)
            try:
                slot = client.save({"items": items, "plan": plan}, name, me, self.step, file=True)
                files.taken((client.mapped(name, me, slot), me), self.step)
            except SnapshotError as exc:
                say("snapshot.unavailable", rank=me, reason=exc, fallback="disk")
                self.memory = False
        if self.persist or not self.memory:
            if plan.storage_data is None:  # the plan was not torch's writer's: a keeper failed now
                plan = dataclasses.replace(plan, storage_data=dcpfiles.prefix(me, self.step))
            return self.fs.write_data(plan, planner)
        if self.due and not self.is_coordinator:  # the coordinator's goes with the commit (finish)
            dcpfiles.behind(self.path).start_newest(lead=None, wait=self.stopping)
        results = [
            WriteResult(index=i.index, size_in_bytes=_size(items[i.index]), storage_data=None)
            for i in plan.items
        ]
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        owners = {r.index: rank for rank, mine in enumerate(results) for r in mine}
        client = SNAPSHOTS.client()
        if client is not None and self.memory:
            try:
                meta = {"metadata": metadata, "owners": owners, "world": len(results)}
                client.save(meta, _names(self.path)[1], 0, self.step, file=True)
            except SnapshotError as exc:
                say("snapshot.unavailable", rank=collective.rank(fallback=0), reason=exc, fallback="disk")
        if self.persist or not self.memory:
            self.fs.finish(metadata, results)
        else:
            files = dcpfiles.behind(self.path)
            files.lead = (metadata, len(results))
            if self.due:
                files.start_newest(files.lead, wait=self.stopping)

    def storage_meta(self) -> Any:
        return self.fs.storage_meta()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return FileSystemWriter.validate_checkpoint_id(checkpoint_id)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, bytes) else int(value.numel() * value.element_size())


class SnapshotReader(StorageReader):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        self.fs = FileSystemReader(path)
        self.source: nearest.Source | None = None  # the metadata's, when from memory
        self.owners: dict[MetadataIndex, int] = {}
        self.shards: list[dict[str, Any]] = []  # every rank's report of its keeper's shards
        self.key = ""
        self.step = -1

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.fs.reset(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """A collective (``dcp.load`` calls it on every rank): from memory when every shard of
        the newest complete step is held by some keeper, else from the directory."""
        if SOCKET_ENV not in os.environ:  # not under elasticd's snapshots: the directory, as FileSystemReader
            return self.fs.read_metadata(*args, **kwargs)
        data, meta = _names(self.path)
        client, me = SNAPSHOTS.client(), collective.rank(fallback=0)
        mine, held, why = nearest.report(client, meta, me)
        shard_report, shards_held, _ = nearest.report(client, data, me)
        mine["shards"] = shard_report["held"]
        reports = nearest.gather(mine, collective.group())
        self.key = nearest.choose_key(reports)
        self.shards = [{**r, "held": r.get("shards", [])} for r in reports]
        self.shards_here = shards_held
        for source in nearest.sources(reports, held, me):
            try:
                found = nearest.load(client or _no_client(), meta, self.key, source)
            except SnapshotError as exc:
                why = str(exc)
                continue
            owners = found["owners"]
            have = {(int(rank), int(step)) for r in self.shards for rank, step in r["held"]}
            missing = sorted({rank for rank in owners.values() if (rank, source.step) not in have})
            if missing:
                why = f"step {source.step}: the shards of ranks {missing} are in no keeper"
                break
            self.source, self.owners, self.step = source, owners, source.step
            _LAST_STEP[str(self.path.absolute())] = source.step
            say("snapshot.restored", source="memory", rank=me, step=source.step, kind="dcp")
            return found["metadata"]  # type: ignore[no-any-return]
        say("snapshot.memory_skipped", rank=me, reason=why or "no snapshot of this checkpoint", kind="dcp")
        return self.fs.read_metadata(*args, **kwargs)

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if self.source is None:
            self.fs.set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return self.fs.prepare_local_plan(plan) if self.source is None else plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return self.fs.prepare_global_plan(plans) if self.source is None else plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if self.source is None:
            return self.fs.read_data(plan, planner)
        wanted = sorted({self.owners[item.storage_index] for item in plan.items})
        shards: dict[MetadataIndex, Any] = {}
        for rank in wanted:
            shards.update(self._shard(rank))
        for item in plan.items:
            value = shards[item.storage_index]
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(value))
                continue
            tensor = narrow_tensor_by_index(value, item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item).detach()
            target.copy_(tensor)
            planner.commit_tensor(item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _shard(self, rank: int) -> dict[MetadataIndex, Any]:
        """Rank ``rank``'s items of the agreed step, from the nearest keeper holding them."""
        data, me = _names(self.path)[0], collective.rank(fallback=0)
        step = self.step
        reports = [
            {**r, "held": [[k, s] for k, s in r["held"] if (k, s) == (rank, step)]} for r in self.shards
        ]
        here = [h for h in self.shards_here if (h.rank, h.step) == (rank, step)]
        errors = []
        for source in nearest.sources(reports, here, me):
            try:
                return nearest.load(SNAPSHOTS.client() or _no_client(), data, self.key, source)["items"]  # type: ignore[no-any-return]
            except SnapshotError as exc:
                errors.append(str(exc))
        raise RuntimeError(f"rank {rank}'s shard of step {self.step} could not be read: {'; '.join(errors)}")

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return FileSystemReader.validate_checkpoint_id(checkpoint_id)


def _no_client() -> Any:
    from elasticd.workers.snapshot_program.client import KeeperClient

    return KeeperClient("")

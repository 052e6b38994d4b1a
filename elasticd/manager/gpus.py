"""This node's GPUs out of the allocatable pool: the marks in etcd, and applying them.

A verdict of the health watcher (``node/gpuwatch.py``) is written as ``gpus/<node>/<uuid>``
(no lease: a GPU taken out stays out across a daemon restart until an operator returns it with
``undrain NODE --gpu UUID``, which deletes the key). The marks read from etcd, with any not yet
written (etcd was down), are the slots the allocator never hands out; ``JobManager`` makes the
jobs holding them leave (``RoundReason.GPU_FAILED``: no restart spent) and re-admits them on
the GPUs left. A GPU whose mark is deleted is judged afresh from its counters then (``accept``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from elasticd import log
from elasticd.decode import DecodeError, decode, parse_json, report_invalid
from elasticd.errors import EtcdNoSpace, EtcdUnavailable
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.gpu.health import Verdict
from elasticd.gpu.read import Usage
from elasticd.node.allocator import Allocator
from elasticd.node.inventory import Inventory
from elasticd.terms.state import GpuStatus

_log = log.get("elasticd.gpu")

MAX_REASON = 300


@dataclass(frozen=True)
class GpuMark:
    """Value of ``gpus/<node>/<uuid>``."""

    fault: str
    reason: str
    at: float = 0.0
    job: str | None = None  # the job that held it when it went out

    def __post_init__(self) -> None:
        if len(self.reason) > MAX_REASON or len(self.fault) > 40:
            raise ValueError("fault and reason must be short")


class GpuPool:
    def __init__(
        self,
        kv: KV,
        keys: Keys,
        node_id: str,
        inventory: Inventory,
        allocator: Allocator,
        accept: Callable[[str], None] | None = None,
        usage: Callable[[], Mapping[str, Usage]] | None = None,
    ) -> None:
        self._kv = kv
        self._keys = keys
        self._node = node_id
        self._inventory = inventory
        self._allocator = allocator
        self._accept = accept or (lambda uuid: None)
        self._usage = usage or dict
        self.marks: dict[str, GpuMark] = {}  # uuid -> why it is out
        self._unsaved: dict[str, GpuMark] = {}  # verdicts etcd has not taken yet

    def slots_of(self, uuids: set[str]) -> frozenset[int]:
        """The slots of these GPUs (every MIG slice of a partitioned one, or a slice named alone)."""
        gpus = self._inventory.gpus
        return frozenset(
            s for s, d in enumerate(self._inventory.devices) if gpus[d.gpu].uuid in uuids or d.uuid in uuids
        )

    def known(self, uuid: str) -> bool:
        return any(g.uuid == uuid for g in self._inventory.gpus)

    async def report(self, uuid: str, verdict: Verdict, job: str | None, now: float) -> None:
        """Take the GPU out now; write its mark (kept to write at the next ``sync`` if etcd fails)."""
        mark = GpuMark(verdict.fault.value, verdict.reason[:MAX_REASON], now, job)
        self.marks[uuid] = mark
        self._unsaved[uuid] = mark
        self._apply()
        await self._save()

    async def sync(self) -> None:
        """Read this node's marks: a mark deleted returns its GPU to the pool (judged afresh)."""
        await self._save()
        kvs = await asyncio.to_thread(self._kv.get_prefix, self._keys.gpus(self._node))
        marks: dict[str, GpuMark] = {}
        for kv in kvs:
            uuid = kv.key.rsplit("/", 1)[-1]
            if not self.known(uuid):  # another host's GPU, or none: nothing here to take out
                continue
            try:
                marks[uuid] = decode(GpuMark, parse_json(kv.value))
            except DecodeError as exc:  # the key's presence is the intent: the GPU stays out
                report_invalid(self._keys.relative(kv.key), kv.mod_revision, str(exc), kind="gpu")
                marks[uuid] = GpuMark("other", "invalid mark record")
        marks |= self._unsaved
        for uuid in set(self.marks) - set(marks):
            _log.info("gpu.returned", uuid=uuid)
            self._accept(uuid)
        self.marks = marks
        self._apply()

    async def _save(self) -> None:
        for uuid, mark in list(self._unsaved.items()):
            try:
                await asyncio.to_thread(self._kv.put_json, self._keys.gpu(self._node, uuid), asdict(mark))
            except (EtcdUnavailable, EtcdNoSpace) as exc:
                _log.warning("gpu.mark_unsaved", uuid=uuid, error=str(exc))
                return
            self._unsaved.pop(uuid, None)

    def _apply(self) -> None:
        self._allocator.out = self.slots_of(set(self.marks))

    def states(
        self, first_rank: Mapping[str, int | None] | None = None, coarse: bool = True
    ) -> list[dict[str, Any]]:
        """Each GPU as the node record shows it: its state and why, its usage, the job holding it
        and the rank there (``first_rank``: each job's global rank of its local rank 0). Memory
        in 256 MiB steps and utilisation in 5 % steps, so that
        the record, compared at every keep-alive, is not rewritten for every small change; exact
        for the metrics, with ``coarse`` off)."""
        mem_step, util_step = (256, 5) if coarse else (1, 1)
        usage = self._usage()
        held = self._allocator.held
        out = []
        for gpu in self._inventory.gpus:
            slots = self.slots_of({gpu.uuid})
            holder = next(((job, sl) for job, sl in held.items() if slots & set(sl)), None)
            mark = self.marks.get(gpu.uuid)
            u = usage.get(gpu.uuid, Usage())
            out.append(
                {
                    "uuid": gpu.uuid,
                    "state": (GpuStatus.UNHEALTHY if mark is not None else GpuStatus.HEALTHY).value,
                    "reason": mark.reason if mark is not None else "",
                    "memory_used_mib": _step(u.memory_used_mib, mem_step),
                    "utilization_pct": _step(u.utilization_pct, util_step),
                    "job": holder[0] if holder else None,
                    "rank": _rank(holder, slots, first_rank or {}),
                }
            )
        return out


def _rank(
    holder: tuple[str, tuple[int, ...]] | None, slots: frozenset[int], first_rank: Mapping[str, int | None]
) -> int | None:
    """The global rank on the GPU (its first slot's, for a partitioned GPU), once workers run."""
    if holder is None or first_rank.get(holder[0]) is None:
        return None
    local = min(holder[1].index(s) for s in slots if s in holder[1])
    return int(first_rank[holder[0]] or 0) + local


def _step(value: int | None, step: int) -> int | None:
    return None if value is None else value - value % step

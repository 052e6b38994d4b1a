"""The node commands' reads and writes: nodes, drain and undrain, and a GPU's return to the pool.

Reached through ``CommandService.nodes``, after the command's permission check
(``CommandService.authorize``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from elasticd.agent.stragglers import DRAINED_BY
from elasticd.errors import Conflict, InvalidArgs, JobNotFound, NodeNotFound
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.space import Space
from elasticd.etcd.types import Query
from elasticd.happenings.bus import publish
from elasticd.happenings.records import GpuReturned, NodeDrained, NodeUndrained
from elasticd.manager.checks import run_check
from elasticd.manager.drainrule import Membership, judge_drain
from elasticd.manager.etcdspace import SpaceWatch
from elasticd.manager.jobmanager import JobManager
from elasticd.node.registry import NodeRecord, NodeRegistry
from elasticd.rendezvous import rosterread
from elasticd.rendezvous.jobread import JobRead
from elasticd.terms.ids import valid_gpu_uuid


class NodeCommands:
    def __init__(
        self, manager: JobManager, registry: NodeRegistry, kv: KV, keys: Keys, space: SpaceWatch | None = None
    ) -> None:
        self._manager = manager
        self._registry = registry
        self._kv = kv
        self._keys = keys
        self._space = space  # how full etcd is (None: not watched)

    async def records(self) -> list[NodeRecord]:
        return await asyncio.to_thread(self._registry.records)  # bad records are skipped (and logged)

    def etcd_space(self) -> Space | None:
        """The last reading of how full etcd is (None: not watched)."""
        return self._space.space if self._space is not None else None

    async def _known_node(self, node: str) -> bool:
        """A node is known while it is live (its record is under its lease) or drained."""
        queries = [Query(self._keys.node(node)), Query(self._keys.drain(node))]
        found = await asyncio.to_thread(self._kv.read_many, queries)
        return any(f.kvs for f in found)

    async def drain(
        self, node: str, job_id: str | None, grace_s: float | None, force: bool, user: str
    ) -> dict[str, Any]:
        """Ask ``node`` to leave its jobs (or one job) gracefully; refuse to go below MIN unless forced."""
        reads = await self._manager.cluster.current()
        if job_id is not None and job_id not in reads:
            raise JobNotFound(f"no job {job_id!r}")
        if not await self._known_node(node):
            raise NodeNotFound(f"no live node {node!r}")
        members = [
            Membership(jid, read.closed.size, read.head.nnodes.min)
            for jid, read in await self._member_of(reads, node, job_id)
            if read.head is not None and read.closed is not None
        ]
        verdict = judge_drain(node, members, force)
        if verdict.refusal:
            raise Conflict(verdict.refusal)
        record = {"grace_s": grace_s, "at": time.time(), "by": user}
        key = self._keys.job_drain(job_id, node) if job_id else self._keys.drain(node)
        await asyncio.to_thread(self._kv.put_json, key, record)
        publish(NodeDrained(node, job_id, grace_s, user, verdict.affected, verdict.forced))
        return {"node": node, "job": job_id, "jobs": list(verdict.affected), "forced": verdict.forced}

    async def _member_of(
        self, reads: dict[str, JobRead], node: str, job_id: str | None
    ) -> list[tuple[str, JobRead]]:
        """The running jobs (``job_id`` alone, if given) whose current round has ``node`` as a
        member: one key each (its assignment), in one request, not every member of every job."""
        asks = [
            (jid, read)
            for jid, read in reads.items()
            if read.head is not None and read.final is None and read.closed is not None
            and (job_id is None or jid == job_id) and read.head.allows(node)
        ]  # fmt: skip
        heads = [(jid, read.closed, node) for jid, read in asks if read.closed is not None]
        found = await asyncio.to_thread(rosterread.membership, self._kv, self._keys, heads)
        return [ask for ask, member in zip(asks, found, strict=True) if member]

    async def check(self, nodes: list[str], user: str) -> dict[str, Any]:
        """The pre-flight node check on ``nodes`` (every live node when empty), on demand. A node
        that passes takes part again in the jobs whose straggler policy drained it."""
        reply = await run_check(self._kv, self._keys, self._registry, nodes, user)
        passed = {r["node"] for r in reply["nodes"] if r["verdict"] == "ok"}
        returned = []
        for job_id, read in (await self._manager.cluster.current()).items():
            for node in sorted(passed):
                record = read.drains.get(node)
                if record is not None and record.by == DRAINED_BY:
                    await asyncio.to_thread(self._kv.delete, self._keys.job_drain(job_id, node))
                    publish(NodeUndrained(node, job_id))
                    returned.append({"node": node, "job": job_id})
        return reply | {"returned": returned}

    async def undrain(self, node: str, job_id: str | None) -> dict[str, Any]:
        """Undo a drain; an unknown node or job, or one that is not drained, is an error."""
        key = self._keys.job_drain(job_id, node) if job_id else self._keys.drain(node)
        if job_id is None and not await self._known_node(node):
            raise NodeNotFound(f"no node {node!r} is live or drained")
        if not await asyncio.to_thread(self._kv.delete, key):
            where = f" from job {job_id}" if job_id else ""
            raise Conflict(f"node {node} is not drained{where}")
        publish(NodeUndrained(node, job_id))
        return {"node": node, "job": job_id}

    async def return_gpu(self, node: str, uuid: str, user: str) -> dict[str, Any]:
        """Return a GPU its node took out of the pool: its daemon judges it afresh from its
        counters as they are now (``manager/gpus.py``)."""
        if not valid_gpu_uuid(uuid):
            raise InvalidArgs("gpu must be a GPU UUID (GPU-...)")
        if not await asyncio.to_thread(self._kv.delete, self._keys.gpu(node, uuid)):
            raise Conflict(f"GPU {uuid} of node {node} is not out of the pool")
        publish(GpuReturned(node, uuid, user))
        return {"node": node, "job": None, "gpu": uuid}

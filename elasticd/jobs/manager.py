"""Every job this node knows of: submission, taking part, status, kill, shutdown, crash recovery.

One ``JobManager`` per daemon, owned by the event loop. It watches etcd for jobs, decides with
``admission.admit`` whether this node takes part, and runs one ``JobAgent`` per job it joins.
The cluster-wide truth is in etcd; nothing here is authoritative but the local slot allocation.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from typing import Any

import psutil

from elasticd import log
from elasticd.aio import wait_event
from elasticd.decode import report_invalid
from elasticd.errors import (
    Conflict,
    EtcdUnavailable,
    InsufficientCapacity,
    JobNotFound,
    NodeNotFound,
)
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from elasticd.etcd.types import KeyValue, Query
from elasticd.jobs.admission import admit, refuse
from elasticd.jobs.agent import AgentState, JobAgent
from elasticd.jobs.launch import NodeRuntime
from elasticd.jobs.spec import JobSpec, valid_job_id
from elasticd.jobs.state import EndReason, JobState
from elasticd.jobs.view import job_view
from elasticd.node.allocator import Allocator
from elasticd.node.registry import NodeRegistry, parse_node_drain
from elasticd.node.statedir import StateDir
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.model import DrainRecord, RoundInfo, RoundReason
from elasticd.rendezvous.store import JobSnapshot, JobStore
from elasticd.workers import proctree

_log = log.get("elasticd.jobs")

SCAN_S = 2.0  # safety net under the watch
SCAN_LEAVES = frozenset({"spec", "round", "final"})
KILL_WAIT_S = 60.0


class JobManager:
    def __init__(
        self,
        rt: NodeRuntime,
        etcd: EtcdClient,
        keys: Keys,
        state: StateDir,
        registry: NodeRegistry,
        allow_root_jobs: bool = False,
    ) -> None:
        self.rt = rt
        self._allow_root_jobs = allow_root_jobs  # this node's own config, whatever a spec says
        self._uid = os.geteuid()
        self._etcd = etcd
        self._keys = keys
        self._state = state
        self._registry = registry
        self.allocator = Allocator(rt.inventory.slots)
        self.agents: dict[str, JobAgent] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._notes: dict[str, str] = {}
        self.draining: DrainRecord | None = None  # this node's drain record, while drained
        registry.on_lost = self.fence_all
        registry.on_granted = self.wake

    # -- capacity ---------------------------------------------------------------------------
    def capacity(self) -> dict[str, Any]:
        free = self.allocator.free()
        return {
            "slots": self.rt.inventory.slots,
            "free_slots": len(free),
            "free_devices": self.rt.inventory.visible_devices(tuple(free)),
            "jobs": sorted(self.agents),
            "draining": self.draining is not None,
        }

    @property
    def unit(self) -> str:
        return "GPUs" if self.rt.inventory.gpus else "CPU slots"

    def _store(self, job_id: str) -> JobStore:
        return JobStore(self._etcd, self._keys, job_id)

    # -- submission ---------------------------------------------------------------------------
    async def submit(self, spec: JobSpec) -> dict[str, Any]:
        records = await asyncio.to_thread(self._registry.records)
        candidates = [n for n in records if spec.allows(n.node)]
        biggest = max((n.slots for n in candidates), default=0)
        if candidates and biggest < spec.nproc_per_node:
            where = f"node {self.rt.node_id}" if len(candidates) == 1 else "the largest node"
            raise InsufficientCapacity(
                f"job asks for {spec.nproc_per_node} {self.unit} per node but {where} has {biggest}",
                requested=spec.nproc_per_node,
                available=biggest,
            )
        if not await asyncio.to_thread(self._store(spec.id).create, spec):
            raise Conflict(f"job {spec.id} already exists")
        _log.info("job.submitted", job=spec.id, user=spec.user, argv=spec.argv, nnodes=str(spec.nnodes))
        await self.scan()
        return await self.view(spec.id)

    # -- taking part ----------------------------------------------------------------------------
    def wake(self, job_id: str | None = None, leaf: str | None = None, deleted: bool = False) -> None:
        """Something changed: for one job (``leaf`` is the key below ``jobs/<job>/``), or anywhere."""
        if job_id is None:
            for agent in self.agents.values():
                agent.wake()
        elif job_id in self.agents:
            self.agents[job_id].wake(leaf, deleted)
        if leaf is None or leaf in SCAN_LEAVES or leaf.endswith("/result") or leaf.startswith("drain/"):
            self._wake.set()  # only what can change whether this node should join a job

    async def run(self) -> None:
        """Look for jobs to join (woken by the watch, with a slow poll under it) until cancelled."""
        while True:
            try:
                await self.scan()
            except EtcdUnavailable as exc:
                _log.warning("jobs.scan_failed", error=str(exc))
            await wait_event(self._wake, SCAN_S)
            self._wake.clear()

    async def _snapshots(self) -> dict[str, JobSnapshot]:
        kvs = await asyncio.to_thread(self._etcd.get_prefix, self._keys.jobs())
        by_job: dict[str, list[KeyValue]] = defaultdict(list)
        for kv in kvs:
            parsed = self._keys.job_of(kv.key)
            if parsed:
                by_job[parsed[0]].append(kv)
        return {job: JobSnapshot.parse(self._keys, job, items) for job, items in by_job.items()}

    async def scan(self) -> None:
        if self._stopping or self._registry.lease_id is None:
            return
        snaps = await self._snapshots()
        drain = await asyncio.to_thread(self._etcd.get, self._keys.drain(self.rt.node_id))
        self.draining = parse_node_drain(self._keys, drain) if drain is not None else None
        self._apply_drains(snaps)
        alive: set[str] | None = None
        for job_id, snap in sorted(
            snaps.items(), key=lambda kv: kv[1].spec.submitted_at if kv[1].spec else 0
        ):
            if snap.final is None and snap.invalid:
                await self._fail_invalid(snap)
            if snap.spec is None or snap.ended:
                continue
            if job_id not in self.agents:
                await self._consider(snap)
            if alive is None:
                alive = set(await asyncio.to_thread(self._registry.live_nodes))
            await self._watch_orphans(snap, alive)
        self._registry.publish_soon()

    async def _fail_invalid(self, snap: JobSnapshot) -> None:
        """A job with a bad record ends FAILED, naming the key; each bad key is logged once. A bad
        ``final`` is replaced by a readable one; nothing is written for a key that names no job."""
        for bad in snap.invalid:
            report_invalid(bad.key, bad.revision, bad.why, job=snap.job_id)
        if valid_job_id(snap.job_id) and await asyncio.to_thread(self._store(snap.job_id).fail_invalid, snap):
            _log.warning(
                "job.failed", job=snap.job_id, code=EndReason.INVALID_RECORD.value, key=snap.invalid[0].key
            )

    async def _consider(self, snap: JobSnapshot) -> None:
        assert snap.spec is not None
        spec = snap.spec
        refusal = refuse(spec, self.rt.node_id, self._uid, self._allow_root_jobs)
        if refusal is not None:
            ended = await asyncio.to_thread(
                self._store(spec.id).finalize, JobState.FAILED, refusal.code, refusal.reason
            )
            if ended:
                _log.warning("job.refused", job=spec.id, code=refusal.code.value, reason=refusal.reason)
            return
        decision = admit(
            snap,
            self.rt.node_id,
            len(self.allocator.free()),
            self.rt.inventory.slots,
            self.unit,
            draining=self.draining is not None,
        )
        lease = self._registry.lease_id
        if decision.note != self._notes.get(spec.id) and lease is not None and snap.result is None:
            await asyncio.to_thread(self._store(spec.id).note_pending, self.rt.node_id, decision.note, lease)
            self._notes[spec.id] = decision.note or ""
        if not decision.join:
            return
        slots = self.allocator.allocate(spec.id, spec.nproc_per_node)
        if slots is None:
            return
        agent = JobAgent(spec, self.rt, self._store(spec.id), self._registry, slots, self._agent_changed)
        self.agents[spec.id] = agent
        self._agent_changed(agent)
        _log.info(
            "job.joining", job=spec.id, node=self.rt.node_id, devices=self.rt.inventory.visible_devices(slots)
        )
        agent.start()

    def _apply_drains(self, snaps: dict[str, JobSnapshot]) -> None:
        """Leave, gracefully, every job this node is drained from."""
        for job_id, agent in self.agents.items():
            snap = snaps.get(job_id)
            record = (snap.drains.get(self.rt.node_id) if snap is not None else None) or self.draining
            if record is not None:
                agent.leave(RoundReason.MEMBER_LEFT, f"node {self.rt.node_id} drained", record.grace_s)

    async def _watch_orphans(self, snap: JobSnapshot, alive: set[str]) -> None:
        """Jobs no live member looks after: restart them (any node may, once) or fail them."""
        assert snap.spec is not None and snap.round is not None
        spec, result = snap.spec, snap.result
        store = self._store(snap.job_id)
        if result is not None:
            present = {j.node for j in snap.current_joins} | snap.done.get(snap.current, set())
            if any(n in present for n in result.nodes):
                return
            plan = rdzv.plan_bump(RoundReason.MEMBER_LOST, snap.restarts, spec.max_restarts,
                                  f"every node of round {snap.current} was lost")  # fmt: skip
            if plan.fail:
                await asyncio.to_thread(store.finalize, JobState.FAILED, EndReason.NODES_LOST, plan.why)
            else:
                info = RoundInfo(snap.current + 1, RoundReason.MEMBER_LOST, time.time(), (), plan.why)
                if await asyncio.to_thread(store.bump, snap, info, plan.spend):
                    _log.warning("job.orphaned", job=snap.job_id, round=snap.current, action="restart")
        elif not snap.current_joins and time.time() - snap.round.opened_at > spec.join_timeout_s:
            why = f"only 0 of the {spec.nnodes.min} nodes needed joined within {spec.join_timeout_s:g}s"
            await asyncio.to_thread(store.finalize, JobState.FAILED, EndReason.JOIN_TIMEOUT, why)

    def _agent_changed(self, agent: JobAgent) -> None:
        """Keep the state dir's record of what this node runs (for crash recovery) current."""
        job_id = agent.spec.id
        if agent.state is not AgentState.LEFT:
            pgids = [w.pid for w in agent.group.workers if w.pid] if agent.group else []
            self._state.save_job(
                job_id, {"slots": list(agent.slots), "pgids": pgids, "saved_at": time.time()}
            )
            return
        if self.agents.get(job_id) is agent:
            del self.agents[job_id]
        self.allocator.release(job_id)
        self._state.drop_job(job_id)
        self._notes.pop(job_id, None)
        _log.info("job.left", job=job_id, node=self.rt.node_id)
        self.wake()

    async def watch(self) -> None:
        """Turn etcd changes under our prefix into wake-ups; re-arm when the stream breaks."""
        loop = asyncio.get_running_loop()
        broken = asyncio.Event()
        jobs, nodes = self._keys.jobs(), self._keys.nodes()

        def on_change(key: str, deleted: bool) -> None:  # on a grpc thread
            if key.startswith(nodes):
                loop.call_soon_threadsafe(self.wake)
            elif key.startswith(jobs) and (parsed := self._keys.job_of(key)):
                loop.call_soon_threadsafe(self.wake, parsed[0], parsed[1], deleted)

        def on_broken() -> None:  # on a grpc thread
            loop.call_soon_threadsafe(broken.set)

        while True:
            try:
                prefix = self._keys.prefix + "/"
                cancel = await asyncio.to_thread(self._etcd.watch_prefix, prefix, on_change, on_broken)
            except EtcdUnavailable:
                await asyncio.sleep(1.0)
                continue
            try:
                await broken.wait()
            finally:
                cancel()
            broken.clear()
            _log.info("watch.rearm")
            self.wake()

    def fence_all(self) -> None:
        for agent in self.agents.values():
            agent.fence()

    # -- queries and commands -------------------------------------------------------------------
    async def snapshot(self, job_id: str) -> JobSnapshot:
        """The job as of now; one with unreadable records is still a job (it shows as FAILED)."""
        if not valid_job_id(job_id):
            raise JobNotFound(f"no job {job_id[:80]!r}")
        snap = await asyncio.to_thread(self._store(job_id).snapshot)
        if not snap.found:
            raise JobNotFound(f"no job {job_id!r}")
        return snap

    async def view(self, job_id: str) -> dict[str, Any]:
        try:
            return job_view(await self.snapshot(job_id), self.rt.node_id)
        except EtcdUnavailable:
            agent = self.agents.get(job_id)
            if agent is None:
                raise
            return {"id": job_id, "state": agent.state.value, "stale": True,
                    "reason": "etcd is unreachable: this node's own view"} | agent.local_view()  # fmt: skip

    async def views(self) -> list[dict[str, Any]]:
        snaps = await self._snapshots()
        views = [job_view(s, self.rt.node_id) for s in snaps.values()]  # unreadable ones too
        return sorted(views, key=lambda v: v.get("submitted_at") or 0)

    async def owner_of(self, job_id: str) -> tuple[int, str] | None:
        """The job's owner (uid, user) for permission checks; None if its spec is unreadable."""
        snap = await self.snapshot(job_id)
        return (snap.spec.uid, snap.spec.user) if snap.spec is not None else None

    async def kill(self, job_id: str, user: str) -> dict[str, Any]:
        snap = await self.snapshot(job_id)
        if snap.final is not None:
            raise Conflict(f"job {job_id} already ended as {snap.final.state.value}")
        await asyncio.to_thread(
            self._store(job_id).finalize, JobState.KILLED, EndReason.KILLED, f"killed by {user}"
        )
        self.wake(job_id)
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:  # until no node runs its workers any more
            agent = self.agents.get(job_id)
            if agent is not None:
                await asyncio.wait({asyncio.ensure_future(agent.wait())}, timeout=0.5)
                continue
            snap = await self.snapshot(job_id)
            if not any(s.pids for s in snap.node_status.values()):
                break
            await asyncio.sleep(0.1)
        return job_view(await self.snapshot(job_id), self.rt.node_id)

    async def _known_node(self, node: str) -> bool:
        """A node is known while it is live (its record is under its lease) or drained."""
        found = await asyncio.to_thread(
            self._etcd.read_many, [Query(self._keys.node(node)), Query(self._keys.drain(node))]
        )
        return any(f.kvs for f in found)

    async def drain(
        self, node: str, job_id: str | None, grace_s: float | None, force: bool, user: str
    ) -> dict[str, Any]:
        """Ask ``node`` to leave its jobs (or one job) gracefully; refuse to go below MIN unless forced.
        Who may ask is decided in ``elasticd.control.access`` (root; a job's owner for ``--job``)."""
        snaps = await self._snapshots()
        if job_id is not None and job_id not in snaps:
            raise JobNotFound(f"no job {job_id!r}")
        if not await self._known_node(node):
            raise NodeNotFound(f"no live node {node!r}")
        affected = []
        too_small = []
        for jid, snap in snaps.items():
            if snap.spec is None or snap.final is not None or (job_id is not None and jid != job_id):
                continue
            members = snap.result.nodes if snap.result is not None else ()
            if node not in members:
                continue
            affected.append(jid)
            if len(members) - 1 < snap.spec.nnodes.min:
                too_small.append(f"{jid} (needs {snap.spec.nnodes.min} nodes, has {len(members)})")
        if too_small and not force:
            raise Conflict(
                f"draining {node} would take job(s) below their minimum: {', '.join(too_small)}; "
                "use --force to drain anyway (the job then waits for a replacement node)"
            )
        record = {"grace_s": grace_s, "at": time.time(), "by": user}
        key = self._keys.job_drain(job_id, node) if job_id else self._keys.drain(node)
        await asyncio.to_thread(self._etcd.put_json, key, record)
        _log.info(
            "node.drain",
            node=node,
            job=job_id,
            grace_s=grace_s,
            by=user,
            jobs=affected,
            forced=bool(too_small),
        )
        return {"node": node, "job": job_id, "jobs": affected, "forced": bool(too_small)}

    async def undrain(self, node: str, job_id: str | None) -> dict[str, Any]:
        """Undo a drain; an unknown node or job, or one that is not drained, is an error."""
        key = self._keys.job_drain(job_id, node) if job_id else self._keys.drain(node)
        if job_id is None and not await self._known_node(node):
            raise NodeNotFound(f"no node {node!r} is live or drained")
        if not await asyncio.to_thread(self._etcd.delete, key):
            where = f" from job {job_id}" if job_id else ""
            raise Conflict(f"node {node} is not drained{where}")
        _log.info("node.undrain", node=node, job=job_id)
        return {"node": node, "job": job_id}

    async def shutdown(self) -> None:
        """Leave every job: the others go on without this node, or the job ends if it cannot."""
        self._stopping = True
        agents = list(self.agents.values())
        for agent in agents:  # a drain: the jobs go on without this node, no restart spent
            agent.leave(RoundReason.MEMBER_LEFT, f"elasticd on {self.rt.node_id} shut down")
        waits = [asyncio.ensure_future(a.wait()) for a in agents]
        if not waits:
            return
        bound = max(a.spec.stop_grace_s for a in agents) + 10.0
        _, late = await asyncio.wait(waits, timeout=bound)
        for agent in agents:
            if agent.task is not None and not agent.task.done():
                _log.error("jobs.leave_timeout", job=agent.spec.id, bound_s=bound)
                agent.task.cancel()  # its cleanup still stops the workers
        await asyncio.gather(*late, return_exceptions=True)

    # -- crash recovery -----------------------------------------------------------------------
    async def recover(self) -> None:
        """Clean up after a predecessor that died: its processes, its slots, its part in jobs."""
        leftovers = await asyncio.to_thread(proctree.marked, self.rt.node_id)
        records = self._state.jobs()
        pgids = [pg for rec in records.values() for pg in _pgids(rec) if _orphaned_group(pg)]
        if leftovers or pgids:
            _log.warning("recover.killing", pids=[p.pid for p in leftovers], pgids=pgids)
            await proctree.terminate(leftovers, pgids, grace_s=2.0)
        self.rt.limits.sweep(())  # no worker of ours is alive yet: every job cgroup is stale
        for job_id in records:
            self._state.drop_job(job_id)
            try:
                await self._recover_job(job_id)
            except (EtcdUnavailable, JobNotFound) as exc:
                _log.warning("recover.skipped", job=job_id, error=str(exc))

    async def _recover_job(self, job_id: str) -> None:
        snap = await self.snapshot(job_id)
        result = snap.result
        if snap.ended or result is None or self.rt.node_id not in result.nodes:
            return  # a job with a bad record is failed by the scan
        assert snap.spec is not None
        why = f"elasticd on {self.rt.node_id} restarted while the job ran"
        plan = rdzv.plan_bump(RoundReason.MEMBER_LOST, snap.restarts, snap.spec.max_restarts, why)
        store = self._store(job_id)
        if plan.fail:
            await asyncio.to_thread(store.finalize, JobState.FAILED, EndReason.NODES_LOST, plan.why)
        else:
            alive = set(await asyncio.to_thread(self._registry.live_nodes))
            info = RoundInfo(snap.current + 1, RoundReason.MEMBER_LOST, time.time(),
                             rdzv.next_expect(result, alive), why)  # fmt: skip
            await asyncio.to_thread(store.bump, snap, info, plan.spend)
        _log.warning("recover.job", job=job_id, action="failed" if plan.fail else "restart", reason=plan.why)


def _pgids(record: Any) -> list[int]:
    """The process groups a state-dir record names (a damaged record names none)."""
    pgids = record.get("pgids") if isinstance(record, dict) else None
    return [p for p in pgids if type(p) is int and p > 1] if isinstance(pgids, list) else []


def _orphaned_group(pgid: int) -> bool:
    """True if ``pgid`` still names the old group: its leader is gone (pids are not reused while a
    group of that id exists, so a live group without its leader is the orphaned original)."""
    return not psutil.pid_exists(pgid) and bool(proctree.group_members(pgid))

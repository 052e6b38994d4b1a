"""All jobs on this node: admission, the pending queue, slot allocation, persistence, status.

One ``JobManager`` per daemon, owned by the event loop. Supervisors report changes here; the
manager keeps the allocator, the state dir and etcd in step with them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psutil

from elasticd import log
from elasticd.errors import Conflict, InsufficientCapacity, JobNotFound, PermissionDenied
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from elasticd.jobs.publisher import StatusPublisher
from elasticd.jobs.spec import JobSpec
from elasticd.jobs.state import JobState
from elasticd.jobs.supervisor import JobSupervisor, Runtime
from elasticd.node.allocator import Allocator
from elasticd.node.statedir import StateDir
from elasticd.workers import proctree

_log = log.get("elasticd.jobs")


class JobManager:
    def __init__(
        self,
        rt: Runtime,
        etcd: EtcdClient,
        keys: Keys,
        state: StateDir,
        publisher: StatusPublisher,
        capacity_changed: Any,
    ) -> None:
        self.rt = rt
        self._etcd = etcd
        self._keys = keys
        self._state = state
        self._publisher = publisher
        self._capacity_changed = capacity_changed
        self.allocator = Allocator(rt.inventory.slots)
        self.jobs: dict[str, JobSupervisor] = {}

    # -- capacity ---------------------------------------------------------------------------
    def capacity(self) -> dict[str, Any]:
        free = self.allocator.free()
        return {
            "slots": self.rt.inventory.slots,
            "free_slots": len(free),
            "free_devices": self.rt.inventory.visible_devices(tuple(free)),
        }

    def _unit(self) -> str:
        return "GPUs" if self.rt.inventory.gpus else "CPU slots"

    # -- admission ----------------------------------------------------------------------------
    async def submit(self, spec: JobSpec) -> JobSupervisor:
        if not self.allocator.fits_host(spec.nproc_per_node):
            raise InsufficientCapacity(
                f"job asks for {spec.nproc_per_node} {self._unit()} per node but node "
                f"{self.rt.node_id} has {self.rt.inventory.slots}",
                requested=spec.nproc_per_node,
                available=self.rt.inventory.slots,
            )
        if spec.nnodes.min > 1:
            raise InsufficientCapacity(
                f"job needs at least {spec.nnodes.min} nodes; this daemon runs single-node jobs "
                "(multi-node rendezvous is not available in this release)"
            )
        created = await asyncio.to_thread(
            self._etcd.create_json, self._keys.job_spec(spec.id), spec.to_json()
        )
        if not created:
            raise Conflict(f"job {spec.id} already exists")
        sup = JobSupervisor(spec, self.rt, self._changed)
        self.jobs[spec.id] = sup
        _log.info("job.submitted", job=spec.id, user=spec.user, argv=spec.argv, nproc=spec.nproc_per_node)
        self._changed(sup)
        self.schedule()
        return sup

    def schedule(self) -> None:
        """Start pending jobs, in submission order, as their slots become free."""
        for sup in list(self.jobs.values()):
            if sup.state is not JobState.PENDING or sup.task is not None:
                continue
            slots = self.allocator.allocate(sup.spec.id, sup.spec.nproc_per_node)
            if slots is None:
                free = len(self.allocator.free())
                sup.wait_reason(
                    f"waiting for {sup.spec.nproc_per_node} free {self._unit()} "
                    f"({free} of {self.rt.inventory.slots} free now)"
                )
                continue
            sup.start(slots)
        self._capacity_changed()

    # -- change propagation -------------------------------------------------------------------
    def _changed(self, sup: JobSupervisor) -> None:
        job_id = sup.spec.id
        view = sup.view() | {"node": self.rt.node_id, "updated_at": time.time()}
        self._publisher.publish(self._keys.job_status(job_id), view)
        if sup.state.terminal:
            self._state.drop_job(job_id)
            if self.allocator.held.get(job_id):
                self.allocator.release(job_id)
                asyncio.get_running_loop().call_soon(self.schedule)
        else:
            pgids = [w.pid for w in sup.group.workers if w.pid] if sup.group else []
            self._state.save_job(job_id, {"slots": list(sup.slots), "pgids": pgids, "saved_at": time.time()})

    # -- queries and commands -------------------------------------------------------------------
    def local(self, job_id: str) -> JobSupervisor | None:
        return self.jobs.get(job_id)

    async def view(self, job_id: str) -> dict[str, Any]:
        sup = self.jobs.get(job_id)
        if sup is not None:
            return sup.view() | {"node": self.rt.node_id}
        stored = await asyncio.to_thread(self._etcd.get_json, self._keys.job_status(job_id))
        if stored is None:
            raise JobNotFound(f"no job {job_id!r}")
        return dict(stored)

    async def views(self) -> list[dict[str, Any]]:
        """Every job known to the cluster, live local state first-hand, the rest from etcd."""
        stored = await asyncio.to_thread(self._etcd.get_prefix, self._keys.jobs())
        merged: dict[str, dict[str, Any]] = {}
        for kv in stored:
            parsed = self._keys.job_of(kv.key)
            if parsed and parsed[1] == "status":
                merged[parsed[0]] = kv.json()
        for job_id, sup in self.jobs.items():
            merged[job_id] = sup.view() | {"node": self.rt.node_id}
        return sorted(merged.values(), key=lambda v: v.get("submitted_at") or 0)

    async def kill(self, job_id: str, uid: int, user: str) -> dict[str, Any]:
        sup = self.jobs.get(job_id)
        if sup is None:
            await self.view(job_id)  # JobNotFound, or known but not running here
            raise Conflict(f"job {job_id} is not running on this node")
        if uid not in (0, sup.spec.uid):
            raise PermissionDenied(f"job {job_id} belongs to {sup.spec.user}; only they or root may kill it")
        if sup.state.terminal:
            raise Conflict(f"job {job_id} already ended as {sup.state.value}")
        sup.request_stop(JobState.KILLED, f"killed by {user}")
        await sup.wait()
        return sup.view()

    async def shutdown(self) -> None:
        live = [s for s in self.jobs.values() if not s.state.terminal]
        for sup in live:
            sup.request_stop(JobState.FAILED, f"elasticd on {self.rt.node_id} shut down")
        await asyncio.gather(*(s.wait() for s in live), return_exceptions=True)

    # -- crash recovery -----------------------------------------------------------------------
    async def recover(self, daemon_started: float) -> None:
        """Clean up after a predecessor that died: its processes, its slots, its job states."""
        leftovers = await asyncio.to_thread(proctree.marked, self.rt.node_id)
        records = self._state.jobs()
        pgids = [pg for rec in records.values() for pg in rec.get("pgids", []) if _orphaned_group(pg)]
        if leftovers or pgids:
            _log.warning("recover.killing", pids=[p.pid for p in leftovers], pgids=pgids)
            await proctree.terminate(leftovers, pgids, grace_s=2.0)
        for job_id in records:
            self._state.drop_job(job_id)
            reason = f"elasticd on {self.rt.node_id} restarted while the job ran"
            try:
                stored = await asyncio.to_thread(self._etcd.get_json, self._keys.job_status(job_id))
            except Exception:
                stored = None
            if stored and not JobState(stored.get("state", "FAILED")).terminal:
                stored |= {
                    "state": JobState.FAILED.value,
                    "reason": reason,
                    "error": reason,
                    "ended_at": daemon_started,
                    "world_size": 0,
                    "pids": [],
                }
                self._publisher.publish(self._keys.job_status(job_id), stored)
            _log.warning("recover.job_failed", job=job_id, reason=reason)


def _orphaned_group(pgid: int) -> bool:
    """True if ``pgid`` still names the old group: its leader is gone (pids are not reused while a
    group of that id exists, so a live group without its leader is the orphaned original)."""
    return not psutil.pid_exists(pgid) and bool(proctree.group_members(pgid))

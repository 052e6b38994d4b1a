"""Taking part in jobs: the scan that admits jobs, and the wake-ups that run it.

One ``JobManager`` per daemon, owned by the event loop. The cluster-wide truth is in the store;
nothing here is authoritative but the local slot allocation (``Admitter``). Its parts, each in its
own module: the copy of every job, kept current by one watch (``ClusterCopy``), joining
a job and its agent's record (``Joins``), the GPU health verdicts (``GpuHealth``), the sweep of
this node's logs (``sweep_logs``), and the cluster's clean-up (``Janitor``). The command service
and the daemon are given the manager alone: it answers for its parts (``watch``, ``jobs``, ...).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from elasticd import log
from elasticd.agent.executor import JobAgent
from elasticd.aio import wait_event
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keyref import Change
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.space import Space
from elasticd.jobs.attempt import NodeRuntime
from elasticd.jobs.queue import Turns, admission_order
from elasticd.jobs.quota import NO_QUOTAS, Quotas, Verdict, over_limits
from elasticd.jobs.ticket import JobTicket
from elasticd.manager import janitor as janitors
from elasticd.manager import quotacheck as limits
from elasticd.manager.access import ROOT_ONLY, Admins
from elasticd.manager.admitter import Admitter
from elasticd.manager.checks import CHECK_KINDS, CheckResponder
from elasticd.manager.clustercopy import ClusterCopy, Jobs
from elasticd.manager.gpuhealth import GpuHealth
from elasticd.manager.gpus import GpuPool
from elasticd.manager.janitor import Janitor
from elasticd.manager.joins import Joins
from elasticd.manager.logsweep import sweep_logs
from elasticd.manager.presence import PresenceWatches
from elasticd.manager.recovery import recover
from elasticd.manager.room import RoomMaker
from elasticd.manager.wakes import QUIET_KINDS, SCAN_KINDS
from elasticd.node.gpuwatch import GpuWatch
from elasticd.node.hooks import LeaseHooks
from elasticd.node.registry import NodeRegistry, parse_node_drain
from elasticd.node.statedir import StateDir
from elasticd.rendezvous.jobread import JobRead
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.store import EtcdJobStore
from elasticd.terms.state import RoundReason

_log = log.get("elasticd.jobs")

# The scan's safety net under the watch. Every key change wakes the scan at once (the watch), and
# the janitor's decisions that come due by time alone wake it when they do (``Janitor.next_due``),
# so this only bounds how long a change could go unseen if the watch stream stalled silently.
SCAN_S = 10.0
# A safety-net wake that finds the copy of every job unchanged (``ClusterCopy``) does nothing more, but no
# longer than this after the last full scan: a full one then redoes whatever a failed write left.
FULL_SCAN_S = 60.0
DUE_SLACK_S = 0.05  # wake just after a janitor deadline, not just before it


class JobManager:
    def __init__(
        self,
        rt: NodeRuntime,
        kv: KV,
        keys: Keys,
        state: StateDir,
        registry: NodeRegistry,
        allow_root_jobs: bool = False,
        store_of: Callable[[str], JobStore] | None = None,
        retention_s: float | None = None,
        quotas: Quotas = NO_QUOTAS,
        admins: Admins = ROOT_ONLY,
        space: Callable[[], Space | None] = lambda: None,
        hooks: LeaseHooks | None = None,
        gpu_watch: GpuWatch | None = None,
    ) -> None:
        self.rt = rt
        self.turns = Turns()  # whose jobs this node admitted lately: the fair queue's turns
        self._keys = keys
        self._state = state
        self._registry = registry
        self.store_of = store_of or (lambda job_id: EtcdJobStore(kv, keys, job_id))
        self.admitter = Admitter(rt, allow_root_jobs)
        self._quotas, self._admins = quotas, admins
        self.gpus = GpuPool(
            kv, keys, rt.node_id, rt.inventory, self.admitter.allocator,
            accept=gpu_watch.accept if gpu_watch else None, usage=gpu_watch.usage if gpu_watch else None,
        )  # fmt: skip
        self.janitor = Janitor(kv, keys, rt.node_id, self.store_of, retention_s, space=space)
        self.room = RoomMaker(kv, keys, lambda: registry.records(), rt.shrink_interval_s)
        self.agents: dict[str, JobAgent] = {}
        self.checks = CheckResponder(kv, keys, rt.node_id, rt.address, registry)
        self._wake = asyncio.Event()
        self._due: float | None = None  # when the janitor's next decision by time alone comes due
        self._stopping = False
        self._presence = PresenceWatches(kv, keys, self.wake)  # node losses, per job joined
        self.joins = Joins(
            rt, keys, state, registry, self.store_of, self.admitter, self._presence, self.agents,
            self.turns, wake=self.wake, wake_scan=self._wake.set,
        )  # fmt: skip
        self.gpu_health = GpuHealth(rt, self.gpus, self.admitter, registry, self.agents, self._wake.set)
        # Every job, kept current by one watch: what the scan, ``status`` and the commands read.
        self.cluster = ClusterCopy(kv, keys, rt.node_id, wake=self.wake)
        self._settled: tuple[Jobs, int] | None = None  # the read and drain of the last full scan
        self._settled_at = 0.0
        if hooks is not None:  # the registry's lease news: fence on a loss, rescan on a grant
            hooks.attach(self)

    def capacity(self) -> dict[str, Any]:
        free = self.admitter.allocator.free()
        return {
            "slots": self.rt.inventory.slots,
            "free_slots": len(free),
            "free_devices": self.rt.inventory.visible_devices(tuple(free)),
            "jobs": sorted(self.agents),
            "draining": self.admitter.draining is not None,
            "gpu_states": self.gpus.states({j: a.first_rank for j, a in self.agents.items()}),
        }

    # -- wake-ups ---------------------------------------------------------------------------------
    def wake(self, change: Change | None = None) -> None:
        """Something changed: for one job (``change.job``), or anywhere (None, or a node-wide key)."""
        if change is not None and change.kind in QUIET_KINDS:
            return
        if change is not None and change.kind in CHECK_KINDS:
            self.checks.heard(change)  # an operator's check: nothing for the jobs
            return
        if change is None or change.job is None:
            for agent in self.agents.values():
                agent.wake()
        elif change.job in self.agents:
            self.agents[change.job].wake(change)
        if change is None or change.job is None or change.kind is None or change.kind in SCAN_KINDS:
            self._wake.set()

    def fence_all(self) -> None:
        for agent in self.agents.values():
            agent.fence()

    # -- the scan ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Look for jobs to join (woken by the watch, with a slow poll under it) until cancelled."""
        quiet = False
        while True:
            try:
                await self.scan(quiet=quiet)
            except EtcdUnavailable as exc:
                _log.warning("jobs.scan_failed", error=str(exc))
            timeout = SCAN_S
            if self._due is not None:
                timeout = min(SCAN_S, max(0.0, self._due - self.janitor.now()) + DUE_SLACK_S)
            quiet = not await wait_event(self._wake, timeout) and timeout >= SCAN_S  # the safety net
            self._wake.clear()

    async def scan(self, clean_up: bool = True, quiet: bool = False) -> None:
        """Join what this node should join; with ``clean_up``, do the janitor's round if elected
        (a submit's scan skips it: the submitter waits for this scan). A ``quiet`` scan (the
        safety net's, which nothing asked for) stops once it finds nothing changed since the
        last full scan, up to ``FULL_SCAN_S`` after it."""
        lease = self._registry.lease_id
        if self._stopping or lease is None:
            return
        if quiet:  # the net under the watch: what changed since the copy's revision, asked
            await self.cluster.caught_up()
        else:
            await self.cluster.ready()
        drain = await self.cluster.drain_record(quiet)
        jobs = self.cluster.jobs()
        reads, strays = jobs
        seen = (jobs, drain.mod_revision if drain is not None else 0)
        if quiet and await self._still_settled(seen, reads):
            return
        self._settled = None  # until this scan completes
        self.admitter.draining = parse_node_drain(self._keys, drain) if drain is not None else None
        self._apply_drains(reads)
        if self.rt.inventory.gpus:
            await self.gpus.sync()
            self.gpu_health.leave_bad_gpus()
        janitors.report(reads)
        if clean_up:
            self._due = None
        janitor = clean_up and await self.janitor.elected(lease)
        # First: etcd near its quota (or at it, refusing the writes below) needs room. The read is
        # shared (``ClusterCopy``, ``status``): the jobs removed are left out of a copy.
        if janitor and (removed := await self.janitor.relieve(reads)):
            reads = {j: s for j, s in reads.items() if j not in removed}
        node = self.rt.node_id
        for job_id in await self._order(reads, janitor):
            head = reads[job_id].head
            if job_id not in self.agents and head is not None and head.allows(node):
                await self.joins.consider(reads[job_id], lease)
        if janitor:
            await self.janitor.sweep(reads)
            await self.janitor.drop_strays(strays)
            self._due = self.janitor.next_due(reads)
        if clean_up:
            await asyncio.to_thread(sweep_logs, self.rt.log_dir, set(reads), self.agents)
            self._settled, self._settled_at = seen, time.monotonic()
        self._registry.publish_soon()

    async def _order(self, reads: dict[str, JobRead], janitor: bool) -> Sequence[str]:
        """The jobs to consider, in admission order, once the limits failed whom they fail and,
        on the janitor, once nodes were lent to a waiting job of a higher priority (``jobs.room``)."""
        copy = self.cluster
        tickets = copy.tickets(reads)  # the jobs that have not ended
        failed = await limits.enforce(tickets, self._quotas, self._admins, self.store_of,
                                      self._over_limits(reads, tickets))  # fmt: skip
        if janitor:
            await self.room.make(reads, tickets, copy.queue(reads, self.turns).order, failed)
        if failed:
            return admission_order((t for t in tickets if t.id not in failed), self.turns.last)
        return copy.queue(reads, self.turns).admission

    def _over_limits(self, reads: dict[str, JobRead], tickets: Sequence[JobTicket]) -> list[Verdict]:
        """The jobs of ``tickets`` over a limit (``jobs.quota.over_limits``): judged once per change
        of the copy (a submit's scan and the one its watch's news wakes share it), and again when
        who among their users is an admin changes (group membership moves: asked each scan)."""
        admins = frozenset(uid for uid in {t.uid for t in tickets} if self._admins(uid))
        return self.cluster.derive(
            "over limits", reads, lambda: over_limits(tickets, self._quotas, admins), admins
        )

    async def _still_settled(self, seen: tuple[Jobs, int], reads: dict[str, JobRead]) -> bool:
        """Whether the read and drain are the last full scan's (``_unchanged``): then the quiet
        scan stops, but for the janitor's sweep, which asks what no read of every job shows:
        whether a running round's members are still there (their joins, ``Members.live``)."""
        if not self._unchanged(seen):
            return False
        if self.janitor.holding:
            await self.janitor.sweep(reads)
        return True

    def _unchanged(self, seen: tuple[Jobs, int]) -> bool:
        """The same jobs (the very objects: ``ClusterCopy``) and drain as the last full scan's, recently."""
        settled = self._settled
        return (
            settled is not None
            and settled[0] is seen[0]
            and settled[1] == seen[1]
            and time.monotonic() - self._settled_at < FULL_SCAN_S
        )

    def _apply_drains(self, reads: dict[str, JobRead]) -> None:
        """Leave, gracefully, every job this node is drained from."""
        node = self.rt.node_id
        for job_id, agent in self.agents.items():
            read = reads.get(job_id)
            record = (read.drains.get(node) if read is not None else None) or self.admitter.draining
            if record is not None:
                agent.leave(RoundReason.MEMBER_LEFT, f"node {node} drained", record.grace_s)

    # -- start and stop -----------------------------------------------------------------------------
    async def recover(self) -> None:
        await recover(self.rt, self._state, self.store_of, self._registry.in_job)

    async def shutdown(self) -> None:
        """Leave every job: the others go on without this node, or the job ends if it cannot."""
        self._stopping = True
        try:
            await self._shutdown_agents()
        finally:  # no presence watch outlives the leaves
            self._presence.close()
            self.checks.close()

    async def _shutdown_agents(self) -> None:
        agents = list(self.agents.values())
        for agent in agents:  # a drain: the jobs go on without this node, no restart spent
            agent.leave(RoundReason.MEMBER_LEFT, f"elasticd on {self.rt.node_id} shut down", stopping=True)
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

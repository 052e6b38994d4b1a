"""Taking part in jobs: watch the store, admit jobs, run one ``JobAgent`` per job joined.

One ``JobManager`` per daemon, owned by the event loop. The cluster-wide truth is in the store;
nothing here is authoritative but the local slot allocation (``Admitter``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from elasticd import log
from elasticd.agent.executor import JobAgent
from elasticd.agent.record import AgentState
from elasticd.aio import wait_event
from elasticd.decode import DecodeError
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Change, KeyKind, Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.space import Space
from elasticd.etcd.types import KeyValue
from elasticd.gpu.health import Verdict
from elasticd.happenings.bus import publish
from elasticd.happenings.records import GpuUnhealthy, JobFailed, JobJoining, JobLeft
from elasticd.jobs import logdir, logread
from elasticd.jobs.board import Board
from elasticd.jobs.launch import NodeRuntime
from elasticd.jobs.queue import Turns, admission_order
from elasticd.jobs.quota import NO_QUOTAS, Quotas
from elasticd.manager import janitor as janitors
from elasticd.manager import quotas as limits
from elasticd.manager.access import ROOT_ONLY, Admins
from elasticd.manager.admitter import Admitter
from elasticd.manager.gpus import GpuPool
from elasticd.manager.janitor import Janitor
from elasticd.manager.jobsread import Jobs, JobsRead, ReadBack
from elasticd.manager.presence import PresenceWatches
from elasticd.manager.recovery import recover
from elasticd.manager.sharedread import RecentRead
from elasticd.manager.wakes import QUIET_KINDS, SCAN_KINDS, Created
from elasticd.node.gpuwatch import GpuWatch
from elasticd.node.hooks import LeaseHooks
from elasticd.node.registry import NodeRegistry, parse_node_drain
from elasticd.node.statedir import StateDir
from elasticd.rendezvous.snapshot import JobSnapshot
from elasticd.rendezvous.store import EtcdJobStore, JobStore
from elasticd.terms.head import JobHead
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, JobState, RoundReason

_log = log.get("elasticd.jobs")

# The scan's safety net under the watch. Every key change wakes the scan at once (the watch), and
# the janitor's decisions that come due by time alone wake it when they do (``Janitor.next_due``),
# so this only bounds how long a change could go unseen if the watch stream stalled silently.
SCAN_S = 10.0
# A safety-net wake that finds the jobs read unchanged (``JobsRead``) does nothing more, but no
# longer than this after the last full scan: a full one then redoes whatever a failed write left.
FULL_SCAN_S = 60.0
DUE_SLACK_S = 0.05  # wake just after a janitor deadline, not just before it
# How long a submit waits for the watch to report the job it created (``expect_head``) before it
# scans anyway: the watch reports it within milliseconds unless it is broken (then re-armed).
HEAR_S = 0.5


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
        # The tickets and the queue of the latest read of every job, shared by the scan and
        # ``status`` and made once per read (per job, once per snapshot).
        self.board = Board(self.turns)
        self._kv = kv
        self._keys = keys
        self._state = state
        self._registry = registry
        self.store_of = store_of or (lambda job_id: EtcdJobStore(kv, keys, job_id))
        self.admitter = Admitter(rt, allow_root_jobs)
        self._limits = limits.Enforcer(quotas, admins, self.store_of)
        self.gpus = GpuPool(
            kv, keys, rt.node_id, rt.inventory, self.admitter.allocator,
            accept=gpu_watch.accept if gpu_watch else None, usage=gpu_watch.usage if gpu_watch else None,
        )  # fmt: skip
        self.janitor = Janitor(kv, keys, rt.node_id, self.store_of, retention_s, space=space)
        self.agents: dict[str, JobAgent] = {}
        self._wake = asyncio.Event()
        self._due: float | None = None  # when the janitor's next decision by time alone comes due
        self._stopping = False
        self._presence = PresenceWatches(kv, keys, self.wake)  # node losses, per job joined
        # Jobs a scan is taking this node into: it reads the full spec (an await) between the
        # admission and the agent, and a submit's scan and the watch's may overlap.
        self._joining: dict[str, asyncio.Event] = {}  # set once that scan's consideration ended
        # Jobs this node's submits created and wait to hear of from the watch (``expect_head``).
        self._expected: dict[str, tuple[Created, asyncio.Event]] = {}  # (set once all heard)
        # The scan's and status's reads cost what changed; with no news of ``jobs/`` since the last
        # one (no change seen: the recent read's generation), only ``parts/`` is asked about,
        # while the watch is armed (``_armed``: the event its break sets).
        self._armed: asyncio.Event | None = None
        # This node's drain record as the scan last read it, and the news of ``drain/`` by then.
        self._drain: tuple[int, KeyValue | None] | None = None
        self._drain_news = 0
        self._jobs = JobsRead(kv, keys, changes=self._news)
        self._settled: tuple[Jobs, int] | None = None  # the read and drain of the last full scan
        self._settled_at = 0.0
        # Every job from a recent read, dropped at any change this daemon sees that wakes the scan
        # (``wake``) and at its own writes (``CommandService``): what ``status`` shows, and the
        # scan's read, which ``status`` callers share (the scan a change wakes reads once for both).
        self.recent: RecentRead[Jobs] = RecentRead(self._jobs.read)
        if hooks is not None:  # the registry's lease news: fence on a loss, rescan on a grant
            hooks.attach(self)

    def _news(self) -> int | None:
        """How many changes the armed watch brought (``JobsRead``); None while it is not armed."""
        armed = self._armed
        return self.recent.generation if armed is not None and not armed.is_set() else None

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
        expected = self._expected.get(change.job) if change is not None and change.job else None
        if expected is not None and change is not None and expected[0].own(change):
            if not expected[0].unheard:
                expected[1].set()
            return  # its submitter reads the job back, and wakes the scan (``advance``)
        self.recent.invalidate()  # the scan this wakes reads again, and ``status`` with it
        if change is None or change.kind is KeyKind.NODE_DRAIN:
            self._drain_news += 1  # (any node's: the scan reads its own again)
        if change is None or change.job is None:
            for agent in self.agents.values():
                agent.wake()
        elif change.job in self.agents:
            self.agents[change.job].wake(change)
        if change is None or change.job is None or change.kind is None or change.kind in SCAN_KINDS:
            self._wake.set()

    async def watch(self) -> None:
        """Turn changes under our prefix into wake-ups; re-arm when the stream breaks.

        Everything but the joins, the nodes' records and presences (``Keys.watched``): only a
        round's leader needs the joins, and it watches its round's itself (``agent.joinwatch``),
        so a round of N nodes sends N join events, not one to every daemon (N²); a job's agents
        hear its nodes' losses from ``PresenceWatches``."""
        loop = asyncio.get_running_loop()
        broken = asyncio.Event()

        def on_change(key: str, deleted: bool) -> None:  # on the watch's thread
            change = self._keys.route(key, deleted)
            if change is not None:
                loop.call_soon_threadsafe(self.wake, change)

        def on_broken() -> None:  # on the watch's thread
            loop.call_soon_threadsafe(broken.set)

        while True:
            cancels: list[Callable[[], None]] = []
            try:
                for start, end in self._keys.watched():
                    cancels.append(
                        await asyncio.to_thread(self._kv.watch_range, start, end, on_change, on_broken)
                    )
            except EtcdUnavailable:
                for cancel in cancels:
                    cancel()
                await asyncio.sleep(1.0)
                continue
            self._armed = broken
            self.recent.invalidate()  # a read from before the watch was armed: its news may be lost
            self._drain_news += 1
            try:
                await broken.wait()
            finally:
                self._armed = None
                for cancel in cancels:
                    cancel()
            broken.clear()
            _log.info("watch.rearm")
            self.wake()

    def expect_head(self, job_id: str) -> asyncio.Event:
        """An event set when the watch has reported every key ``JobStore.create`` writes under
        ``jobs/`` for ``job_id`` (see ``heard``); news that, until ``forget_head``, does not drop
        the recent read: its submitter reads the job back and ``advance``s the read. Call before
        creating the job, and ``forget_head`` after."""
        return self._expected.setdefault(job_id, (Created(), asyncio.Event()))[1]

    def forget_head(self, job_id: str) -> None:
        self._expected.pop(job_id, None)

    async def heard(self, event: asyncio.Event) -> bool:
        """Wait (at most ``HEAR_S``) for the watch's news of a job this node created; False if it
        did not come. The news wakes the scan, which then works from the read ``advance`` made
        (``RecentRead.fresh``), as do the submit's own scan and the ``status`` after it. Without
        the wait, a submit's own scan would read, then the scan its news wakes would read again
        (with a thousand jobs queued, each read costs etcd a pass over every job's keys)."""
        if await wait_event(event, HEAR_S):
            return True
        _log.info("watch.late", waited_s=HEAR_S)  # (broken, or etcd or this host overloaded)
        return False

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

    async def snapshots(self) -> dict[str, JobSnapshot]:
        """Every job, all as of one revision (one read of ``jobs/`` and ``parts/``)."""
        return (await self._read_jobs())[0]

    async def recent_snapshots(self) -> dict[str, JobSnapshot]:
        """Every job, from the recent read (``RecentRead.get``): what ``status`` answers from."""
        return (await self.recent.get())[0]

    async def read_back(self, job_id: str) -> ReadBack:
        """A job this node just created, read alone (for ``advance``)."""
        return await asyncio.to_thread(self._jobs.read_back, job_id)

    def advance(self, since: int, back: ReadBack) -> bool:
        """The recent read, with ``back`` (this node's new job, read back after its creation) put
        in, as a read begun now (``RecentRead.advance``), and in the read of every job the next
        read starts from (``JobsRead.adopt``): False if another change was seen since ``since``
        (``recent.generation`` before the write), and the read is dropped instead. Wakes the
        scan, as the job's news (its submitter's own: ``wake``) did not."""
        job = back.snap.job_id

        def put(jobs: Jobs) -> Jobs:
            adopted = self._jobs.adopt(jobs, back, since, self.recent.generation)
            if adopted is not None:
                return adopted
            return {**jobs[0], job: back.snap}, {j: keys for j, keys in jobs[1].items() if j != job}

        advanced = self.recent.advance(since, put) is not None
        self._wake.set()  # the scan the news of the job would have woken: it reads what holds now
        return advanced

    def amend_snapshot(self, snap: JobSnapshot) -> None:
        """The recent read, with ``snap`` (read after it, by this node) in place of its job's."""
        self.recent.amend(lambda jobs: ({**jobs[0], snap.job_id: snap}, jobs[1]))

    def held_snapshots(self) -> dict[str, JobSnapshot] | None:
        """The recent read's jobs while it is valid, without reading (None: none is)."""
        held = self.recent.held()
        return held[0] if held is not None else None

    async def _read_jobs(self) -> Jobs:
        """Every job as ``snapshots``, and the parts of no job (``parse_jobs``), which the
        janitor deletes: a read that began after the last change seen, shared with ``status``
        (``RecentRead.fresh``), and read again only as far as something changed (``JobsRead``)."""
        return await self.recent.fresh()

    async def scan(self, clean_up: bool = True, quiet: bool = False) -> None:
        """Join what this node should join; with ``clean_up``, do the janitor's round if elected
        (a submit's scan skips it: the submitter waits for this scan). A ``quiet`` scan (the
        safety net's, which nothing asked for) stops once it finds nothing changed since the
        last full scan, up to ``FULL_SCAN_S`` after it."""
        lease = self._registry.lease_id
        if self._stopping or lease is None:
            return
        if quiet:  # the net under the watch: a read that trusts no news of it (``JobsRead``)
            self.recent.invalidate()
        jobs, drain = await asyncio.gather(self._read_jobs(), self._drain_record(quiet))
        snaps, strays = jobs
        seen = (jobs, drain.mod_revision if drain is not None else 0)
        if quiet and self._unchanged(seen):
            return
        self._settled = None  # until this scan completes
        self.admitter.draining = parse_node_drain(self._keys, drain) if drain is not None else None
        self._apply_drains(snaps)
        if self.rt.inventory.gpus:
            await self.gpus.sync()
            self._leave_bad_gpus()
        janitors.report(snaps)
        if clean_up:
            self._due = None
        janitor = clean_up and await self.janitor.elected(lease)
        # First: etcd near its quota (or at it, refusing the writes below) needs room. The read is
        # shared (``JobsRead``, ``Board``, ``status``): the jobs removed are left out of a copy.
        if janitor and (removed := await self.janitor.relieve(snaps)):
            snaps = {j: s for j, s in snaps.items() if j not in removed}
        tickets = self.board.tickets(snaps)  # the jobs that have not ended
        failed = await self._limits.enforce(tickets)
        if failed:
            order = admission_order((t for t in tickets if t.id not in failed), self.turns.last)
        else:
            order = self.board.queue(snaps).admission
        node = self.rt.node_id
        for job_id in order:
            head = snaps[job_id].head
            if job_id not in self.agents and head is not None and head.allows(node):
                await self._consider(snaps[job_id], lease)
        if janitor:
            await self.janitor.sweep(snaps)
            await self.janitor.drop_strays(strays)
            self._due = self.janitor.next_due(snaps)
        if clean_up:
            await asyncio.to_thread(self.sweep_logs, set(snaps))
            self._settled, self._settled_at = seen, time.monotonic()
        self._registry.publish_soon()

    async def _drain_record(self, quiet: bool) -> KeyValue | None:
        """This node's drain record (``drain/<node>``, watched): as last read while the watch is
        armed and brought no news of ``drain/`` since, else read (always for the safety net)."""
        armed = self._news() is not None
        news, held = self._drain_news, self._drain
        if armed and not quiet and held is not None and held[0] == news:
            return held[1]
        kv = await asyncio.to_thread(self._kv.get, self._keys.drain(self.rt.node_id))
        self._drain = (news, kv) if armed else None
        return kv

    def _unchanged(self, seen: tuple[Jobs, int]) -> bool:
        """The same read (the very objects: ``JobsRead``) and drain as the last full scan's, recently."""
        settled = self._settled
        return (
            settled is not None
            and settled[0] is seen[0]
            and settled[1] == seen[1]
            and time.monotonic() - self._settled_at < FULL_SCAN_S
        )

    def sweep_logs(self, known: set[str]) -> list[str]:
        """Drop this node's logs of jobs whose records are gone (removed, or past retention)."""
        gone = [j for j in logread.list_dir(self.rt.log_dir, ()) if j not in known and j not in self.agents]
        removed = []
        for job in gone:
            try:
                if logdir.remove_job(self.rt.log_dir, job):
                    removed.append(job)
            except OSError as exc:  # a full or read-only disk: the next sweep tries again
                _log.warning("logs.remove_failed", job=job, error=repr(exc))
        if removed:
            _log.info("logs.removed", jobs=removed)
        return removed

    async def _consider(self, snap: JobSnapshot, lease: int) -> None:
        assert snap.head is not None
        if not snap.head.allows(self.rt.node_id):
            return  # a job for other nodes: nothing to decide or note here (``admit``, ``refuse``)
        joining = self._joining.get(snap.job_id)
        if joining is not None:
            # Another scan (a submit's, the watch's) is taking this node into the job: its outcome
            # (an agent started, or the note of why not) is this scan's too, so a submit's reply
            # waits for it.
            await joining.wait()
            return
        done = self._joining[snap.job_id] = asyncio.Event()
        try:
            await self._join(snap, snap.head, lease)
        finally:
            del self._joining[snap.job_id]
            done.set()

    async def _join(self, snap: JobSnapshot, head: JobHead, lease: int) -> None:
        store = self.store_of(snap.job_id)
        slots = await self.admitter.consider(snap, store, lease)
        if slots is None:
            return
        spec = await self._full_spec(head, store)
        if spec is None:
            self.admitter.release(snap.job_id)
            return
        try:  # present in the job, and hearing its losses, before any other key of ours in it
            await self._registry.enter(spec.id)
            if spec.nnodes.max > 1:  # (a job of one node has no other node to lose)
                await self._presence.follow(spec.id)
        except EtcdUnavailable:
            self._registry.leave(spec.id)
            self.admitter.release(spec.id)
            raise
        in_job = self._registry.in_job(spec.id)
        agent = JobAgent(spec, self.rt, store, in_job, slots, self._agent_changed, on_invalid=self._wake.set)
        self.agents[spec.id] = agent
        self.turns.admitted(spec.uid)
        self._agent_changed(agent)
        publish(JobJoining(spec.id, self.rt.node_id, self.rt.inventory.visible_devices(slots)))
        agent.start()

    async def _full_spec(self, head: JobHead, store: JobStore) -> JobSpec | None:
        """The job's full spec, read now that this node takes part (nothing else reads it); a
        missing one, or one that disagrees with the head the job was admitted by, fails the job."""
        try:
            return await store.spec(head)
        except DecodeError as exc:
            reason = f"invalid record at {self._keys.relative(self._keys.job_body(head.id))}: {exc}"
            if await store.finalize(JobState.FAILED, EndReason.INVALID_RECORD, reason):
                publish(JobFailed(head.id, EndReason.INVALID_RECORD, reason))
            return None

    def _apply_drains(self, snaps: dict[str, JobSnapshot]) -> None:
        """Leave, gracefully, every job this node is drained from."""
        node = self.rt.node_id
        for job_id, agent in self.agents.items():
            snap = snaps.get(job_id)
            record = (snap.drains.get(node) if snap is not None else None) or self.admitter.draining
            if record is not None:
                agent.leave(RoundReason.MEMBER_LEFT, f"node {node} drained", record.grace_s)

    def _agent_changed(self, agent: JobAgent) -> None:
        """Keep the state dir's record of what this node runs (for crash recovery) current."""
        job_id = agent.spec.id
        if agent.state is not AgentState.LEFT:
            pgids = agent.workers.pgids() if agent.workers is not None else []
            self._state.save_job(
                job_id, {"slots": list(agent.slots), "pgids": pgids, "saved_at": time.time()}
            )
            self._registry.publish_soon()  # the record shows the ranks on its GPUs
            return
        if self.agents.get(job_id) is agent:
            del self.agents[job_id]
            self._presence.drop(job_id)
            self._registry.leave(job_id)  # after its last keys: its peers may hear it as a loss
        self.admitter.release(job_id)
        self._state.drop_job(job_id)
        publish(JobLeft(job_id, self.rt.node_id))
        self.wake()

    # -- unhealthy GPUs -------------------------------------------------------------------------------
    async def watch_gpus(self, verdicts: asyncio.Queue[tuple[str, Verdict]]) -> None:
        """Carry out the health watcher's verdicts (``node/gpuwatch.py``), one at a time."""
        while True:
            uuid, verdict = await verdicts.get()
            try:
                await self.gpu_unhealthy(uuid, verdict)
            except EtcdUnavailable as exc:  # the mark is kept and written at the next scan
                _log.warning("gpu.report_failed", uuid=uuid, error=str(exc))

    async def gpu_unhealthy(self, uuid: str, verdict: Verdict) -> None:
        """Take the GPU out of the pool; the job holding it goes on without it (``_leave_bad_gpus``)."""
        if not self.gpus.known(uuid):
            return
        holders = self.admitter.allocator.holders(self.gpus.slots_of({uuid}))
        await self.gpus.report(uuid, verdict, holders[0] if holders else None, time.time())
        publish(
            GpuUnhealthy(
                self.rt.node_id, uuid, verdict.fault.value, verdict.reason, holders[0] if holders else None
            )
        )
        self._leave_bad_gpus()
        self._registry.publish_soon()
        self._wake.set()

    def _leave_bad_gpus(self) -> None:
        """Every job holding a GPU out of the pool leaves (no restart spent); the scan admits it
        again where enough healthy GPUs are free."""
        out = self.admitter.allocator.out
        for job_id in self.admitter.allocator.holders(out):
            agent = self.agents.get(job_id)
            if agent is None:
                continue
            bad = sorted(
                {
                    self.rt.inventory.gpus[self.rt.inventory.devices[s].gpu].uuid
                    for s in set(agent.slots) & out
                }
            )
            reasons = "; ".join(f"{u}: {self.gpus.marks[u].reason}" for u in bad if u in self.gpus.marks)
            agent.leave(RoundReason.GPU_FAILED, f"GPU unhealthy on {self.rt.node_id} ({reasons})")

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

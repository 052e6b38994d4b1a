"""Taking this node into a job the scan considers, and keeping its record until it leaves.

Between the admission (``Admitter``) and the running ``JobAgent`` the full spec is read (an await),
and a submit's scan and the watch's may consider the same job at once: the second waits for the
first's outcome (``consider``). While the agent runs, the state dir holds what it runs (for crash
recovery); when it has left, its slots, presence and record go.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from elasticd import log
from elasticd.agent.executor import JobAgent
from elasticd.agent.record import AgentState
from elasticd.decode import DecodeError
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Keys
from elasticd.happenings.bus import publish
from elasticd.happenings.records import JobFailed, JobJoining, JobLeft
from elasticd.jobs.attempt import NodeRuntime
from elasticd.jobs.queue import Turns
from elasticd.manager.admitter import Admitter
from elasticd.manager.presence import PresenceWatches
from elasticd.node.registry import NodeRegistry
from elasticd.node.statedir import StateDir
from elasticd.rendezvous.jobread import JobRead
from elasticd.rendezvous.jobstore import JobStore
from elasticd.terms.head import JobHead
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, JobState
from elasticd.workers.group import wall_clock

_log = log.get("elasticd.jobs")


class Joins:
    """The jobs this node takes part in (``agents``, shared with ``JobManager``), joined and left.
    ``wake`` is told when an agent has left (``JobManager.wake``), ``wake_scan`` when an agent finds
    its job's records invalid."""

    def __init__(
        self,
        rt: NodeRuntime,
        keys: Keys,
        state: StateDir,
        registry: NodeRegistry,
        store_of: Callable[[str], JobStore],
        admitter: Admitter,
        presence: PresenceWatches,
        agents: dict[str, JobAgent],
        turns: Turns,
        wake: Callable[[], None],
        wake_scan: Callable[[], None],
    ) -> None:
        self.rt = rt
        self._keys = keys
        self._state = state
        self._registry = registry
        self.store_of = store_of
        self.admitter = admitter
        self._presence = presence
        self.agents = agents
        self.turns = turns
        self._wake = wake
        self._wake_scan = wake_scan
        # Jobs a scan is taking this node into: it reads the full spec (an await) between the
        # admission and the agent, and a submit's scan and the watch's may overlap.
        self._joining: dict[str, asyncio.Event] = {}  # set once that scan's consideration ended

    async def consider(self, read: JobRead, lease: int) -> None:
        assert read.head is not None
        if not read.head.allows(self.rt.node_id):
            return  # a job for other nodes: nothing to decide or note here (``admit``, ``refuse``)
        joining = self._joining.get(read.job_id)
        if joining is not None:
            # Another scan (a submit's, the watch's) is taking this node into the job: its outcome
            # (an agent started, or the note of why not) is this scan's too, so a submit's reply
            # waits for it.
            await joining.wait()
            return
        done = self._joining[read.job_id] = asyncio.Event()
        try:
            await self._join(read, read.head, lease)
        finally:
            del self._joining[read.job_id]
            done.set()

    async def _join(self, read: JobRead, head: JobHead, lease: int) -> None:
        store = self.store_of(read.job_id)
        slots = await self.admitter.consider(read, store, lease)
        if slots is None:
            return
        spec = await self._full_spec(head, store)
        if spec is None:
            self.admitter.release(read.job_id)
            return
        try:  # present in the job, and hearing its losses, before any other key of ours in it
            await self._registry.enter(spec.id)
            if spec.nnodes.max > 1:  # (a job of one node has no other node to lose)
                await self._presence.follow(spec.id)
        except EtcdUnavailable:
            self._registry.leave(spec.id)
            self.admitter.release(spec.id)
            raise
        if not self.rt.books.holds(spec.id):
            await self._pick_up(spec, store)
        in_job = self._registry.in_job(spec.id)
        agent = JobAgent(spec, self.rt, store, in_job, slots, self._agent_changed, on_invalid=self._wake_scan)
        self.agents[spec.id] = agent
        self.turns.admitted(spec.uid)
        self._agent_changed(agent)
        publish(JobJoining(spec.id, self.rt.node_id, self.rt.inventory.visible_devices(slots)))
        agent.start()

    async def _pick_up(self, spec: JobSpec, store: JobStore) -> None:
        """A job this daemon keeps no ledger of: if this node's report of it is left from a daemon
        before this one (it restarted; the report lives until that one's lease ends), the job's
        ledger picks up from the report's mark (``goodput.resumed``) rather than starting over."""
        try:
            status = await store.node_status(self.rt.node_id)
        except EtcdUnavailable as exc:  # the ledger starts over: no reason to hold the join back
            _log.warning("goodput.unread", job=spec.id, error=str(exc))
            return
        if status is None or status.ledger is None:
            return
        books = self.rt.books.resume(spec.id, spec.submitted_at, wall_clock, status.ledger, status.updated_at)
        settled = books.settled()
        _log.info(
            "goodput.resumed", job=spec.id, written_at=status.updated_at, settled_s=round(settled.total_s, 3),
            productive_s=round(settled.productive_s, 3),
        )  # fmt: skip

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
        self._wake()

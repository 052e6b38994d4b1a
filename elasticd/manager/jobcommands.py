"""The job commands' reads and writes: submit, status, kill, logs and rm.

Reached through ``CommandService.jobs``, after the command's permission check
(``CommandService.authorize``); they read and write through the ``JobManager``, and answer
``status`` from its copy of every job (``ClusterCopy``), of parts made from the copy
(``manager/statusviews.py``). A command whose write the next ``status`` must show waits for
the copy to hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from elasticd.errors import Conflict, EtcdUnavailable, InsufficientCapacity, JobNotFound
from elasticd.happenings.bus import publish
from elasticd.happenings.records import JobKilled, JobRemoved, JobSubmitted
from elasticd.history.store import EventLog
from elasticd.jobs import logdir, quota, snapshotspace
from elasticd.jobs.logs import Read, attempt_starts, log_files, read_logs
from elasticd.jobs.logscope import check_scope, round_view
from elasticd.jobs.queue import QueuePlace
from elasticd.jobs.quota import Limits
from elasticd.jobs.view import job_state, job_view, last_head
from elasticd.manager import statusviews
from elasticd.manager.clustercopy import ClusterCopy
from elasticd.manager.etcdspace import SpaceWatch
from elasticd.manager.facts import NodeFacts
from elasticd.manager.jobmanager import JobManager
from elasticd.manager.statusviews import Held
from elasticd.node import hostmemory
from elasticd.node.registry import NodeRegistry
from elasticd.rendezvous import reportread, rosterread
from elasticd.rendezvous.jobparse import with_parts
from elasticd.rendezvous.jobread import InvalidKey, JobRead, JoinsRead, RostersRead
from elasticd.rendezvous.model import NodeStatus, RoundResult
from elasticd.terms.ids import valid_job_id
from elasticd.terms.options import EntryKind
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, IllegalTransition, JobState, check_transition
from elasticd.wire import LogsArgs, RoundView, is_terminal

KILL_WAIT_S = 60.0


@dataclass(frozen=True)
class LogsRead:
    """What ``logs`` answers: the job as ``status`` shows it, its current round, the output read,
    when each attempt with logs here started, and whether this node is still winding its part of
    the job up (``finishing``: its agent has not left; after the job's end, that is its workers'
    stop and its snapshot keeper's last writes)."""

    view: dict[str, Any]
    round: RoundView | None
    read: Read
    starts: dict[int, float]
    finishing: bool = False


class JobCommands:
    def __init__(
        self,
        facts: NodeFacts,
        manager: JobManager,
        registry: NodeRegistry,
        events: EventLog,
        rounds: rosterread.Rounds,
        space: SpaceWatch | None = None,
    ) -> None:
        self.facts = facts
        self._manager = manager
        self._registry = registry
        self._events = events
        self._rounds = rounds  # the members of rounds a view of one job showed
        self._space = space  # how full etcd is (None: not watched)

    @property
    def _cluster(self) -> ClusterCopy:
        """Every job, as the daemon's one watch keeps it."""
        return self._manager.cluster

    def _own_statuses(self) -> dict[str, NodeStatus]:
        """This node's part in each job it takes part in, as its agent knows it (state, round,
        devices, pids): what a view of every job shows of this node, whose read carries no
        node's status."""
        out: dict[str, NodeStatus] = {}
        for job_id, agent in self._manager.agents.items():
            v = agent.local_view()
            with contextlib.suppress(ValueError):
                out[job_id] = NodeStatus(v["state"], v["round"], v["devices"], tuple(v["pids"]), 0.0)
        return out

    async def submit(self, spec: JobSpec, limits: Limits | None = None) -> dict[str, Any]:
        """Store a new job, within the submitter's ``limits``: the spec's size, and the jobs they
        hold (counted from the copy of every job; a submit that races another past the limit is
        failed by the scan, ``jobs.quota.over_limits``)."""
        self._refuse_if_etcd_full()
        if spec.entry_kind is not EntryKind.EXEC:  # a python job may keep memory snapshots here
            bound = self._manager.rt.snapshot_bytes
            if (
                small := snapshotspace.refusal(bound, hostmemory.shm_bytes(), self.facts.node_id)
            ) is not None:
                raise small
        if limits is not None:
            await self._check_limits(spec, limits)
        records = await asyncio.to_thread(self._registry.records)
        candidates = [n for n in records if spec.allows(n.node)]
        biggest = max((n.slots_for(spec.mig) for n in candidates), default=0)
        if candidates and biggest < spec.nproc_per_node:
            where = f"node {self.facts.node_id}" if len(candidates) == 1 else "the largest node"
            unit = "MIG slices" if spec.mig else self._manager.admitter.unit
            raise InsufficientCapacity(
                f"job asks for {spec.nproc_per_node} {unit} per node but {where} has {biggest}",
                requested=spec.nproc_per_node,
                available=biggest,
            )
        revision = await self._manager.store_of(spec.id).create(spec)
        if not revision:
            raise Conflict(f"job {spec.id} already exists")
        publish(JobSubmitted(spec.id, spec.user, tuple(spec.argv), str(spec.nnodes)))
        # With the job in the copy, this submit's scan considers it, and the ``status`` after it
        # shows it (the watch's news wakes the scan too, which then finds nothing new).
        await self._cluster.wait_for(revision, spec.id)
        await self._manager.scan(clean_up=False)
        read = self._cluster.jobs()[0].get(spec.id)
        if read is not None and not spec.allows(self.facts.node_id):  # (no note of this node's)
            return job_view(read, self.facts.node_id)
        # What this node's agent just noted of the job (e.g. that it waits for capacity) may not
        # be in the copy yet: the job is read alone. Its place: ``status``.
        return await self.view(spec.id, queue=False, held=False)

    async def _check_limits(self, spec: JobSpec, limits: Limits) -> None:
        if (too_large := quota.size_refusal(quota.stored_size(spec.to_json()), spec.env, limits)) is not None:
            raise too_large
        if limits.jobs.value <= 0:
            return
        reads = await self._cluster.current()
        if spec.id in reads:  # a second node's line of one multi-node job: ``conflict``, not a quota
            return
        held = quota.held_by(self._cluster.tickets(reads), spec.uid)
        refusal = quota.jobs_refusal(spec.user, held, limits)
        if refusal is not None:
            raise refusal

    async def read_job(self, job_id: str) -> JoinsRead:
        """The job as of now, its rounds' heads but not their members (``whole_view``); one
        with unreadable records is still a job (it shows as FAILED)."""
        if not valid_job_id(job_id):
            raise JobNotFound(f"no job {job_id[:80]!r}")
        read = await self._manager.store_of(job_id).read()
        if not read.found:
            raise JobNotFound(f"no job {job_id!r}")
        return read

    async def whole_view(self, read: JobRead) -> dict[str, Any]:
        """``read``'s view with the members of the round it shows, read in pages once
        (``rosterread.Rounds``): what only a view of one job shows."""
        head = last_head(read, job_state(read))
        if head is None or (isinstance(read, RostersRead) and head.round in read.results):
            return job_view(read, self.facts.node_id)
        roster = await self._rounds.read(read.job_id, head)
        if isinstance(roster, InvalidKey):
            read = replace(read, invalid=tuple(sorted([*read.invalid, roster], key=lambda k: k.key)))
        members = roster if isinstance(roster, RoundResult) else None
        return job_view(read, self.facts.node_id, members)

    async def _with_parts(self, read: JobRead) -> JobRead:
        """``read`` (from the read of every job: no status, join nor done marker) with its nodes'
        statuses and, where its view shows them, the joins and done markers of the round it
        shows (an ended job's last: how each member's part ended; an open round's, or a running
        one's with pending notes to set apart from the members'), each read in pages for this
        job alone."""
        store = self._manager.store_of(read.job_id)
        read = reportread.with_reports(read, await store.statuses())
        state = job_state(read)
        head = last_head(read, state) if state.terminal else None
        if head is None and read.closed is not None and not read.pending:
            return read
        r = head.round if head is not None else read.current
        return with_parts(read, r, await store.round_parts(r))

    async def view(self, job_id: str, queue: bool = True, held: bool = True) -> dict[str, Any]:
        """The job as ``status`` shows it: from the copy of every job (not unless ``held``), with
        what the copy does not hold read for this job alone, else from a read of this job alone;
        with ``queue``, a waiting job's place in the queue (the queue is every job's)."""
        try:
            read = (await self._cluster.current()).get(job_id) if held else None
            if read is None:
                read = await self.read_job(job_id)
            else:  # the copy holds no member's status nor join: this job's
                read = await self._with_parts(read)
            view = await self.whole_view(read)
            if queue and view["state"] == JobState.PENDING:
                every = await self._cluster.current()
                view.update(_queue(self._cluster.queue(every, self._manager.turns).place(job_id)))
            return view
        except EtcdUnavailable:
            if (own := self._own_view(job_id)) is None:
                raise
            return own

    def _own_view(self, job_id: str) -> dict[str, Any] | None:
        """This node's own view of a job it takes part in, for when etcd cannot be asked."""
        agent = self._manager.agents.get(job_id)
        if agent is None:
            return None
        own = agent.local_view()
        own.pop("progress", None)  # published per member; not a field of the job's own view
        own.pop("ledger", None)  # what a restarted daemon picks up from: nothing to show
        return {
            "id": job_id,
            "state": agent.state.value,
            "stale": True,
            "reason": "etcd is unreachable: this node's own view",
        } | own

    async def views(self, states: Collection[JobState] = (), user: str | None = None) -> list[dict[str, Any]]:
        """Every job (unreadable ones too), oldest first; only those in ``states`` (when given) and
        ``user``'s (when given); a waiting job with its queue place. From the copy of every job."""
        every = await self._cluster.current()
        held, order = self._held(every, self._own_statuses())
        queue = self._cluster.queue(every, self._manager.turns)
        return statusviews.views(every, held, order, queue, states, user)

    async def views_json(
        self, states: Collection[JobState] = (), user: str | None = None, rows: bool = False
    ) -> bytes:
        """``views``, as a JSON array (of rows, with ``rows``): each job's view as encoded when its
        job last changed, with its queue place spliced in; made once per change of the copy,
        admission count, this node's part in its jobs and filter (``statusviews.reply``)."""
        every, own, turns = await self._cluster.current(), self._own_statuses(), self._manager.turns
        key = statusviews.selection(states, user, rows)

        def reply() -> bytes:
            held, order = self._held(every, own)
            ranked = self._cluster.queue(every, turns).ranked
            return statusviews.reply(every, held, order, ranked, key)

        return self._cluster.derive(("status", key), every, reply, (turns.admissions, own))

    def _held(
        self, every: Mapping[str, JobRead], own: Mapping[str, NodeStatus]
    ) -> tuple[Mapping[str, Held], Sequence[str]]:
        """Every job's view and its encodings (each made again for another read of the job, or
        another status of this node's in it: ``own``), and the jobs oldest first."""
        node = self.facts.node_id
        held = self._cluster.each(
            "status view", every, lambda job, read: statusviews.held(read, node, own.get(job)), own
        )
        return held, self._cluster.derive("status order", every, lambda: statusviews.oldest_first(held), own)

    async def kill(self, job_id: str, user: str) -> dict[str, Any]:
        read = await self.read_job(job_id)
        try:
            check_transition(job_id, job_state(read), JobState.KILLED)
        except IllegalTransition as exc:  # it ended (or has an invalid record: it shows FAILED)
            raise Conflict(str(exc)) from None
        if await self._manager.store_of(job_id).finalize(
            JobState.KILLED, EndReason.KILLED, f"killed by {user}"
        ):
            publish(JobKilled(job_id, user))
        self._manager.wake()
        await self._cluster.caught_up()  # the ``status`` after this shows the job's end
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:  # until no node runs its workers any more
            agent = self._manager.agents.get(job_id)
            if agent is not None:
                await asyncio.wait({asyncio.ensure_future(agent.wait())}, timeout=0.5)
                continue
            read = await self.read_job(job_id)
            if not any(s.pids for s in read.node_status.values()):
                break
            await asyncio.sleep(0.1)
        return await self.whole_view(await self.read_job(job_id))

    async def logs(self, args: LogsArgs) -> LogsRead:
        """A job's output on this node from ``args.cursor``; a rank or attempt the job does not
        have is an error (when etcd can be asked)."""
        read: JobRead | None = None
        try:
            read = await self.read_job(args.job)
            view = await self.whole_view(read)
        except EtcdUnavailable:
            if (own := self._own_view(args.job)) is None:
                raise
            view = own
        ended = is_terminal(view.get("state"))

        def from_files() -> tuple[Read, dict[int, float]]:
            files = log_files(self.facts.log_dir, args.job)
            if read is not None:
                check_scope(read, args.rank, args.attempt, files)
            starts = attempt_starts(self.facts.log_dir, args.job)
            since = args.since
            attempts = {
                a
                for a, _ in files
                if (args.attempt is None or a == args.attempt)
                and (since is None or starts.get(a, since) >= since)
            }
            got = read_logs(self.facts.log_dir, args.job, args.cursor, files=files, rank=args.rank,
                            attempts=attempts, tail=args.tail, whole=ended, partial=args.partial)  # fmt: skip
            here = {a for a, _ in files}
            return got, {a: t for a, t in starts.items() if a in here}

        got, starts = await asyncio.to_thread(from_files)
        finishing = args.job in self._manager.agents
        return LogsRead(view, round_view(read) if read is not None else None, got, starts, finishing)

    async def rm(self, job_id: str) -> dict[str, Any]:
        """Delete an ended job's records, and this node's logs of it (each node drops its own logs
        of jobs whose records are gone: ``manager/logsweep.py``)."""
        read = await self.read_job(job_id)
        if not read.ended:
            state = job_view(read, self.facts.node_id)["state"]
            raise Conflict(f"job {job_id} is {state}: kill it first (elasticctl kill {job_id})")
        await self._manager.store_of(job_id).remove()
        await self._cluster.caught_up()  # the ``status`` after this shows the job gone
        removed = await asyncio.to_thread(logdir.remove_job, self.facts.log_dir, job_id)
        # After the logs: the scan that the records' deletion wakes drops the logs of a job with
        # no records too (``manager/logsweep.py``), and two removals of one tree race.
        await asyncio.to_thread(self._events.drop_jobs, {job_id})
        publish(JobRemoved(job_id, removed))
        return {"job": job_id, "logs_removed": removed}

    def _refuse_if_etcd_full(self) -> None:
        """``EtcdFull`` while etcd is above its high-water mark or alarmed (``SpaceWatch``)."""
        if self._space is not None:
            self._space.check_submit()


def _queue(place: QueuePlace | None) -> dict[str, Any]:
    """The ``queue`` field of a waiting job's view (none for others)."""
    return {} if place is None else {"queue": place.to_json()}

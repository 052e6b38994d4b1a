"""The job commands' reads and writes: submit, status, kill, logs and rm.

Reached through ``CommandService.jobs``, after the command's permission check
(``CommandService.authorize``); they read and write through the ``JobManager``, and answer
``status`` from its recent read of every job.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from functools import cached_property
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
from elasticd.manager.etcdspace import SpaceWatch
from elasticd.manager.facts import NodeFacts
from elasticd.manager.jobmanager import JobManager
from elasticd.manager.jobwatch import JobWatch
from elasticd.manager.statusviews import StatusViews
from elasticd.node import hostmemory
from elasticd.node.registry import NodeRegistry
from elasticd.rendezvous import reportread, rosterread
from elasticd.rendezvous.model import NodeStatus
from elasticd.rendezvous.snapshot import JobSnapshot
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
    def _watch(self) -> JobWatch:
        """The watch and the read of every job."""
        return self._manager.jobwatch

    @cached_property
    def status_views(self) -> StatusViews:
        """Every job's view, encoded once per change, and ``status``'s replies made of them."""
        return StatusViews(self.facts.node_id, self._manager.board, self._own_statuses)

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
        hold (counted from the recent read; a submit that races another past the limit is failed
        by the scan, ``jobs.quota.over_limits``)."""
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
        heard = self._watch.expect_head(spec.id)
        since = self._manager.recent.generation
        try:
            if not await self._manager.store_of(spec.id).create(spec):
                raise Conflict(f"job {spec.id} already exists")
            publish(JobSubmitted(spec.id, spec.user, tuple(spec.argv), str(spec.nnodes)))
            # The job read back (its keys alone), and the watch's news of it heard: the recent read
            # with the job put in is then as good as a new read, for this submit's scan, the one
            # the news wakes and the ``status`` after them (``JobWatch.advance``).
            back, told = await asyncio.gather(self._watch.read_back(spec.id), self._watch.heard(heard))
        except BaseException:
            self._manager.wake()  # whatever was written: read again (its news may have been ours)
            raise
        finally:
            self._watch.forget_head(spec.id)
        if told:
            self._watch.advance(since, back)
        else:  # what came before the job's news may still come: read again
            self._manager.wake()
        await self._manager.scan(clean_up=False)
        if not spec.allows(self.facts.node_id):  # no note of this node's since the job was read back
            return job_view(back.snap, self.facts.node_id)
        # The job as read predates what this node's agent just noted (e.g. that the job waits for
        # capacity), which no watch reports: the job is read alone again, and put in the held read
        # for the next ``status``. Its place: ``status``.
        return await self.view(spec.id, queue=False, held=False)

    async def _check_limits(self, spec: JobSpec, limits: Limits) -> None:
        if (too_large := quota.size_refusal(quota.stored_size(spec.to_json()), spec.env, limits)) is not None:
            raise too_large
        if limits.jobs.value <= 0:
            return
        snaps = await self._watch.recent_snapshots()
        if spec.id in snaps:  # a second node's line of one multi-node job: ``conflict``, not a quota
            return
        held = quota.held_by(self._manager.board.tickets(snaps), spec.uid)
        refusal = quota.jobs_refusal(spec.user, held, limits)
        if refusal is not None:
            raise refusal

    async def snapshot(self, job_id: str) -> JobSnapshot:
        """The job as of now, its rounds' heads but not their members (``with_members``); one
        with unreadable records is still a job (it shows as FAILED)."""
        if not valid_job_id(job_id):
            raise JobNotFound(f"no job {job_id[:80]!r}")
        snap = await self._manager.store_of(job_id).snapshot(rosters=False)
        if not snap.found:
            raise JobNotFound(f"no job {job_id!r}")
        return snap

    async def with_members(self, snap: JobSnapshot) -> JobSnapshot:
        """``snap`` (a copy) with the members of the round its view shows, read in pages once
        (``rosterread.Rounds``): what only a view of one job shows."""
        head = last_head(snap, job_state(snap))
        if head is None or head.round in snap.results:
            return snap
        return rosterread.with_round(snap, head, await self._rounds.read(snap.job_id, head))

    async def _with_parts(self, snap: JobSnapshot) -> JobSnapshot:
        """``snap`` (from the read of every job: no status, join nor done marker) with its nodes'
        statuses and, where its view shows them, the joins and done markers of the round it
        shows (an ended job's last: how each member's part ended; an open round's, or a running
        one's with pending notes to set apart from the members'), each read in pages for this
        job alone."""
        store = self._manager.store_of(snap.job_id)
        snap = reportread.with_reports(snap, await store.statuses())
        state = job_state(snap)
        head = last_head(snap, state) if state.terminal else None
        if head is None and snap.closed is not None and not snap.pending:
            return snap
        r = head.round if head is not None else snap.current
        got = await store.round_parts(r)
        return replace(
            snap,
            joins={**snap.joins, r: got.joins.get(r, [])},
            done={**snap.done, r: got.done.get(r, set())},
            joins_read=True,
            invalid=sorted([*snap.invalid, *got.invalid], key=lambda k: k.key),
        )

    async def view(self, job_id: str, queue: bool = True, held: bool = True) -> dict[str, Any]:
        """The job as ``status`` shows it: from the recent read of every job while it is valid
        (``JobManager.recent``; not unless ``held``), else from a read of this job alone; with
        ``queue``, a waiting job's place in the queue (from the recent read: the queue is every
        job's)."""
        try:
            recent = self._watch.held_snapshots() if held else None
            snap = (recent or {}).get(job_id)
            if snap is None:
                snap = await self.snapshot(job_id)
                # (heads only, no status and no join, as the read of every job)
                bare = replace(snap, node_status={}, joins={}, done={}, join_counts={}, joins_read=False)
                self._watch.amend_snapshot(bare)
            else:  # the read of every job carries no member's status nor join: this job's
                snap = await self._with_parts(snap)
            view = job_view(await self.with_members(snap), self.facts.node_id)
            if queue and view["state"] == JobState.PENDING:
                place = self._manager.board.queue(await self._watch.recent_snapshots()).place(job_id)
                view.update(_queue(place))
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
        ``user``'s (when given); a waiting job with its queue place. From a recent read
        (``JobManager.recent``)."""
        return self.status_views.views(await self._watch.recent_snapshots(), states, user)

    async def views_json(
        self, states: Collection[JobState] = (), user: str | None = None, rows: bool = False
    ) -> bytes:
        """``views``, as a JSON array (of rows, with ``rows``): each job's view as encoded when its
        job last changed, with its queue place spliced in; made once per read (``StatusViews``)."""
        return self.status_views.json(await self._watch.recent_snapshots(), states, user, rows)

    async def kill(self, job_id: str, user: str) -> dict[str, Any]:
        snap = await self.snapshot(job_id)
        try:
            check_transition(job_id, job_state(snap), JobState.KILLED)
        except IllegalTransition as exc:  # it ended (or has an invalid record: it shows FAILED)
            raise Conflict(str(exc)) from None
        if await self._manager.store_of(job_id).finalize(
            JobState.KILLED, EndReason.KILLED, f"killed by {user}"
        ):
            publish(JobKilled(job_id, user))
        self._manager.wake()  # (which drops the recent read, too)
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:  # until no node runs its workers any more
            agent = self._manager.agents.get(job_id)
            if agent is not None:
                await asyncio.wait({asyncio.ensure_future(agent.wait())}, timeout=0.5)
                continue
            snap = await self.snapshot(job_id)
            if not any(s.pids for s in snap.node_status.values()):
                break
            await asyncio.sleep(0.1)
        return job_view(await self.with_members(await self.snapshot(job_id)), self.facts.node_id)

    async def logs(self, args: LogsArgs) -> LogsRead:
        """A job's output on this node from ``args.cursor``; a rank or attempt the job does not
        have is an error (when etcd can be asked)."""
        snap: JobSnapshot | None = None
        try:
            snap = await self.snapshot(args.job)
            view = job_view(await self.with_members(snap), self.facts.node_id)
        except EtcdUnavailable:
            if (own := self._own_view(args.job)) is None:
                raise
            view = own
        ended = is_terminal(view.get("state"))

        def read() -> tuple[Read, dict[int, float]]:
            files = log_files(self.facts.log_dir, args.job)
            if snap is not None:
                check_scope(snap, args.rank, args.attempt, files)
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

        got, starts = await asyncio.to_thread(read)
        finishing = args.job in self._manager.agents
        return LogsRead(view, round_view(snap) if snap is not None else None, got, starts, finishing)

    async def rm(self, job_id: str) -> dict[str, Any]:
        """Delete an ended job's records, and this node's logs of it (each node drops its own logs
        of jobs whose records are gone: ``manager/logsweep.py``)."""
        snap = await self.snapshot(job_id)
        if not snap.ended:
            state = job_view(snap, self.facts.node_id)["state"]
            raise Conflict(f"job {job_id} is {state}: kill it first (elasticctl kill {job_id})")
        await self._manager.store_of(job_id).remove()
        self._manager.recent.invalidate()
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

"""The daemon's watch of etcd, and the read of every job that its news keeps current.

Every change the watch delivers is routed (``etcd/keys.py``) to ``JobManager.wake``. A change
drops the recent read (``changed``), which the scan and ``status`` share, unless it is the news of
a job this node's submit created (``own``): its submitter reads the job back and puts it in the
read itself (``advance``). While the watch is armed, what brought no news is not read again: the
notes of the jobs (``JobsRead``) and this node's drain record (``drain_record``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from elasticd import log
from elasticd.aio import wait_event
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keyref import Change, KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.types import KeyValue
from elasticd.manager.jobsread import Jobs, JobsRead, ReadBack
from elasticd.manager.sharedread import RecentRead
from elasticd.manager.wakes import Created
from elasticd.rendezvous.snapshot import JobSnapshot

_log = log.get("elasticd.jobs")

# How long a submit waits for the watch to report the job it created (``expect_head``) before it
# scans anyway: the watch reports it within milliseconds unless it is broken (then re-armed).
HEAR_S = 0.5


class JobWatch:
    """The watch (``watch``), its news of this node's own submits (``expect_head``), and the recent
    read of every job (``recent``). ``wake`` is told of every change (``JobManager.wake``),
    ``wake_scan`` when the read changed in place (``advance``)."""

    def __init__(
        self,
        kv: KV,
        keys: Keys,
        node_id: str,
        wake: Callable[[Change | None], None],
        wake_scan: Callable[[], None],
    ) -> None:
        self._kv = kv
        self._keys = keys
        self._node_id = node_id
        self._wake = wake
        self._wake_scan = wake_scan
        # Jobs this node's submits created and wait to hear of from the watch (``expect_head``).
        self._expected: dict[str, tuple[Created, asyncio.Event]] = {}  # (set once all heard)
        # The scan's and status's reads cost what changed; with no news of ``jobs/`` since the last
        # one (no change seen: the recent read's generation), only ``notes/`` is asked about,
        # while the watch is armed (``_armed``: the event its break sets).
        self._armed: asyncio.Event | None = None
        # This node's drain record as the scan last read it, and the news of ``drain/`` by then.
        self._drain: tuple[int, KeyValue | None] | None = None
        self._drain_news = 0
        self._jobs = JobsRead(kv, keys, changes=self._news)
        # Every job from a recent read, dropped at any change this daemon sees that wakes the scan
        # (``JobManager.wake``) and at its own writes (``CommandService``): what ``status`` shows,
        # and the scan's read, which ``status`` callers share (the scan a change wakes reads once
        # for both).
        self.recent: RecentRead[Jobs] = RecentRead(self._jobs.read)

    def _news(self) -> int | None:
        """How many changes the armed watch brought (``JobsRead``); None while it is not armed."""
        armed = self._armed
        return self.recent.generation if armed is not None and not armed.is_set() else None

    # -- the changes ------------------------------------------------------------------------------
    def own(self, change: Change | None) -> bool:
        """Whether ``change`` is the first news of a key this node's submit wrote (``expect_head``),
        which drops no read: its submitter reads the job back, and wakes the scan (``advance``)."""
        expected = self._expected.get(change.job) if change is not None and change.job else None
        if expected is not None and change is not None and expected[0].own(change):
            if not expected[0].unheard:
                expected[1].set()
            return True
        return False

    def changed(self, change: Change | None) -> None:
        """A change that wakes the scan: the scan reads again, and ``status`` with it."""
        self.recent.invalidate()
        if change is None or change.kind is KeyKind.NODE_DRAIN:
            self._drain_news += 1  # (any node's: the scan reads its own again)

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
                loop.call_soon_threadsafe(self._wake, change)

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
            self._wake(None)

    # -- a submit's own job -----------------------------------------------------------------------
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

    async def read_back(self, job_id: str) -> ReadBack:
        """A job this node just created, read alone (for ``advance``)."""
        return await asyncio.to_thread(self._jobs.read_back, job_id)

    def advance(self, since: int, back: ReadBack) -> bool:
        """The recent read, with ``back`` (this node's new job, read back after its creation) put
        in, as a read begun now (``RecentRead.advance``), and in the read of every job the next
        read starts from (``JobsRead.adopt``): False if another change was seen since ``since``
        (``recent.generation`` before the write), and the read is dropped instead. Wakes the
        scan, as the job's news (its submitter's own: ``own``) did not."""
        job = back.snap.job_id

        def put(jobs: Jobs) -> Jobs:
            adopted = self._jobs.adopt(jobs, back, since, self.recent.generation)
            if adopted is not None:
                return adopted
            return {**jobs[0], job: back.snap}, {j: keys for j, keys in jobs[1].items() if j != job}

        advanced = self.recent.advance(since, put) is not None
        self._wake_scan()  # the scan the news of the job would have woken: it reads what holds now
        return advanced

    # -- every job --------------------------------------------------------------------------------
    async def snapshots(self) -> dict[str, JobSnapshot]:
        """Every job, all as of one revision (one read of ``jobs/`` and ``notes/``)."""
        return (await self.read_jobs())[0]

    async def recent_snapshots(self) -> dict[str, JobSnapshot]:
        """Every job, from the recent read (``RecentRead.get``): what ``status`` answers from."""
        return (await self.recent.get())[0]

    def amend_snapshot(self, snap: JobSnapshot) -> None:
        """The recent read, with ``snap`` (read after it, by this node) in place of its job's."""
        self.recent.amend(lambda jobs: ({**jobs[0], snap.job_id: snap}, jobs[1]))

    def held_snapshots(self) -> dict[str, JobSnapshot] | None:
        """The recent read's jobs while it is valid, without reading (None: none is)."""
        held = self.recent.held()
        return held[0] if held is not None else None

    async def read_jobs(self) -> Jobs:
        """Every job as ``snapshots``, and the notes of no job (``parse_jobs``), which the
        janitor deletes: a read that began after the last change seen, shared with ``status``
        (``RecentRead.fresh``), and read again only as far as something changed (``JobsRead``)."""
        return await self.recent.fresh()

    async def drain_record(self, quiet: bool) -> KeyValue | None:
        """This node's drain record (``drain/<node>``, watched): as last read while the watch is
        armed and brought no news of ``drain/`` since, else read (always for the safety net)."""
        armed = self._news() is not None
        news, held = self._drain_news, self._drain
        if armed and not quiet and held is not None and held[0] == news:
            return held[1]
        kv = await asyncio.to_thread(self._kv.get, self._keys.drain(self._node_id))
        self._drain = (news, kv) if armed else None
        return kv

"""The daemon's copy of every job: one informer, read by the scan, ``status`` and the commands.

The informer (``elasticd.informer``) holds ``jobs/`` and ``notes/`` (every job's records and its
pending notes: ``Keys.every_job``), listed at one revision, and watches from the next one what
every daemon watches (``Keys.watched``: the whole prefix but what grows with a job's nodes) and
``notes/``. Each job is decoded once per change of its keys (``parse_job``; a bad key fails its
job only: ``JobRead.invalid``), and the jobs are handed out as the same objects while nothing
changed. What is computed from every job is asked of the copy, and made once per change of it
(``derive``; per job, once per read of the job: ``each``; ``informer/derived.py``): the scan and
``status`` share each job's ticket and the queue (``tickets``, ``queue``: ``jobs/board.py``), and
``status`` its views and replies (``manager/statusviews.py``). Every change but a note's is
routed (``Keys.route``) to ``wake`` (``JobManager.wake``),
after the copy holds it; after a list, ``wake(None)``: anything may have changed. Pending notes
are held, never routed: they wake no one, as when they were not watched.

What the copy does not hold (a job's parts, reports and rounds' members: O(N) a round) is read
explicitly, for one job, by whoever decides on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

from elasticd import log
from elasticd.etcd.keyref import Change, KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV, prefix_end
from elasticd.etcd.types import KeyValue, WatchEvent
from elasticd.informer.informer import Informer, Phase
from elasticd.informer.store import Bound, Store
from elasticd.jobs import board
from elasticd.jobs.board import Queue
from elasticd.jobs.queue import Turns
from elasticd.jobs.ticket import JobTicket, ticket_of
from elasticd.rendezvous.jobparse import parse_job
from elasticd.rendezvous.jobread import JobRead

_log = log.get("elasticd.jobs")
V = TypeVar("V")

# Every job by id; and the keys of notes of no job (``notes/<job>/`` of a job that has no
# records, put after its removal by a leaving node), which the janitor deletes.
Jobs = tuple[dict[str, JobRead], dict[str, list[str]]]

CATCH_UP_S = 2.0  # how long a writer waits for the watch's news of what etcd holds
# What the copy may hold: a queued job is a few keys of small records (its full spec lives in
# ``specs/``, not held); past this, keys are left out (``informer.over_bound``), not memory spent.
BOUND = Bound(keys=400_000, bytes=256 * 1024 * 1024)


class ClusterCopy:
    """Every job, as the informer keeps it (module doc), and this node's drain record."""

    def __init__(
        self, kv: KV, keys: Keys, node_id: str, wake: Callable[[Change | None], None], bound: Bound = BOUND
    ) -> None:
        self._kv = kv
        self._keys = keys
        self._node_id = node_id
        self._wake = wake
        jobs, notes = keys.every_job()
        self._notes = (notes, prefix_end(notes))
        held = [(jobs, prefix_end(jobs)), self._notes]
        store: Store[JobRead] = Store(held, keys.job_of, lambda job, kvs: parse_job(keys, job, kvs), bound)
        watched = sorted([*keys.watched(), self._notes])
        self.informer = Informer(kv, store, watched, on_events=self._heard, name="jobs")
        # This node's drain record as the scan last read it, and the news of ``drain/`` by then.
        self._drain: tuple[int, KeyValue | None] | None = None
        self._drain_news = 0

    async def run(self) -> None:
        """Keep the copy current, until cancelled (``Informer.run``)."""
        await self.informer.run()

    def _heard(self, events: list[WatchEvent] | None) -> None:
        """Route each change to ``wake``, the copy holding it already; None: a list."""
        if events is None:
            self._drain_news += 1
            self._wake(None)
            return
        notes = self._notes[0]
        for event in events:
            key = event.kv.key
            if key.startswith(notes):
                continue
            change = self._keys.route(key, event.deleted)
            if change is not None:
                if change.kind is KeyKind.NODE_DRAIN:
                    self._drain_news += 1  # (any node's: the scan reads its own again)
                self._wake(change)

    # -- every job --------------------------------------------------------------------------------
    def jobs(self) -> Jobs:
        """Every job the copy holds, and the notes of no job: the same objects while nothing
        changed, a job's same read while its keys did not."""
        return self.informer.derived.value("jobs", self._jobs)

    def _jobs(self) -> Jobs:
        reads, store = self.informer.reads(), self.informer.store
        found = {job: read for job, read in reads.items() if read.found}
        strays = {job: [kv.key for kv in store.keys(job)] for job in reads.keys() - found.keys()}
        return found, strays

    # -- what is computed from every job ----------------------------------------------------------
    def derive(
        self, key: Hashable, jobs: Mapping[str, JobRead], make: Callable[[], V], inputs: object = None
    ) -> V:
        """``make()``, a value computed from ``jobs`` (and ``inputs``: what else it reads, compared
        with ``==``), as made once for the copy as it is (``Derived.value``) when ``jobs`` are the
        copy's (``jobs()``). Jobs that are not (a read the copy has moved past while the caller
        awaited, or a part of one): made for them alone."""
        if jobs is not self.jobs()[0]:
            return make()
        return self.informer.derived.value(key, make, inputs)

    def each(
        self,
        key: Hashable,
        jobs: Mapping[str, JobRead],
        make: Callable[[str, JobRead], V],
        inputs: Mapping[str, object] | None = None,
    ) -> Mapping[str, V]:
        """``{job: make(job, read)}`` for ``jobs`` (``derive``), a job's value made again only for
        another read of it, or another entry of ``inputs`` (``Derived.each``)."""
        derived = self.informer.derived
        return self.derive(key, jobs, lambda: derived.each(key, jobs, make, inputs), inputs)

    def tickets(self, jobs: Mapping[str, JobRead]) -> tuple[JobTicket, ...]:
        """The tickets of the jobs that have not ended, in ``jobs``' order (``jobs.ticket``)."""
        made = self.each("ticket", jobs, lambda job, read: ticket_of(read))
        return self.derive("tickets", jobs, lambda: tuple(t for t in made.values() if t is not None))

    def queue(self, jobs: Mapping[str, JobRead], turns: Turns) -> Queue:
        """The queue of ``jobs`` as this node orders it now (``jobs.board.queue``): made again when
        the copy changes, and when this node admits a job (``Turns.admissions``)."""
        return self.derive(
            "queue", jobs, lambda: board.queue(jobs, self.tickets(jobs), dict(turns.last)), turns.admissions
        )

    async def current(self) -> dict[str, JobRead]:
        """Every job: what ``status`` answers from. Asked of etcd first while no watch is open
        (starting, re-arming, etcd lost): EtcdUnavailable when it cannot be."""
        await self.ready()
        return self.jobs()[0]

    async def ready(self) -> None:
        """With a watch open, nothing (the copy is current); else etcd asked what changed since
        the copy's revision, and the copy listed again if anything did (``Informer.caught_up``)."""
        if self.informer.phase is not Phase.WATCHING:
            await self.informer.caught_up(CATCH_UP_S)

    async def wait_for(self, revision: int, job_id: str) -> bool:
        """Wait for the copy to hold what a write of ``job_id``'s records at ``revision`` wrote
        (``Informer.wait_for``)."""
        if self.informer.phase is not Phase.WATCHING:
            await self.informer.caught_up(CATCH_UP_S)
            return True
        if await self.informer.wait_for(revision, CATCH_UP_S, key=self._keys.job_spec(job_id)):
            return True
        _log.info("watch.late", waited_s=CATCH_UP_S, revision=revision)
        return False

    async def caught_up(self) -> None:
        """Wait for the copy to hold what etcd holds now (``Informer.caught_up``): after a write
        whose revision the writer does not know (a delete), and in the scan's safety net."""
        await self.informer.caught_up(CATCH_UP_S)

    async def drain_record(self, quiet: bool) -> KeyValue | None:
        """This node's drain record (``drain/<node>``, watched): as last read while the watch is
        armed and brought no news of ``drain/`` since, else read (always for the safety net)."""
        armed = self.informer.phase is Phase.WATCHING
        news, held = self._drain_news, self._drain
        if armed and not quiet and held is not None and held[0] == news:
            return held[1]
        kv = await asyncio.to_thread(self._kv.get, self._keys.drain(self._node_id))
        self._drain = (news, kv) if armed else None
        return kv

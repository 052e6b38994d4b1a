"""Reading every job, for the scan and ``status``, at a cost that follows what changed.

One read of ``jobs/`` and ``notes/`` at one revision gives every job (``parse_jobs``): its head,
its round, its closed rounds' heads (size, world, master: a few hundred bytes whatever N) and
pending notes, but none of what each member of a round has: its assignment (``rounds/``), its
join (``parts/``), its status (``reports/``). The scan and the table of ``status`` need sizes
and states, not members, and with them every daemon read O(N) bytes per round of an N-node job,
and every status change again; what decides on members reads one job's
(``rendezvous/rosterread.py``, ``rendezvous/reportread.py``, the admitter's and the janitor's
counts and asks). With a thousand jobs queued that is thousands of keys, and the scan asks for
it at every wake and every ``SCAN_S``, ``status`` at every refresh. So the last read is held, by
job, and the next one first asks etcd, in one small request, what was created, changed or
deleted since: a range read from the revision after the newest key held
(``Query.min_mod_revision``) returns only the keys changed since then, and counts every key of
the range, so a deletion shows as a count short of the held keys plus the new ones.

- Nothing changed: the held read is the answer (the very same objects).
- Keys created or changed, none deleted: they are applied to the held keys and only their jobs
  are parsed again; the read is then as of the probe's revision, as consistent as a full one.
- A deletion: every key is read again (and parsed with the ``RecordCache``, which reuses the
  snapshot of every job whose keys did not change).

Every key under ``jobs/`` is watched, ``notes/`` is not. So when the daemon has seen no change
since the held read was asked for (``changes``, the count of the news the watch brought: the
recent read's generation), the probe asks about ``notes/`` alone, which etcd answers with a pass
over it only (the notes of jobs that wait for capacity), not over every queued job's keys; only
when it changed is the whole probe sent. The held read then stands as it was, consistent as of
its revision: ``jobs/`` had no change the watch reported, ``notes/`` none at all. A job this
daemon created is read back alone and put in the held read (``adopt``),
its creation's news not counted: so a submit costs no pass either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.types import Found, KeyValue, Query
from elasticd.rendezvous.snapshot import JobSnapshot, RecordCache, parse_jobs

Jobs = tuple[dict[str, JobSnapshot], dict[str, list[str]]]  # what ``parse_jobs`` returns


@dataclass
class _Held:
    jobs: Jobs
    by_job: dict[str, dict[str, KeyValue]]  # every key read that is under a job, by its job
    counts: tuple[int, ...]  # keys in each range (those under no job too)
    newest: int  # the highest mod revision among the keys read (0: none)


@dataclass(frozen=True)
class ReadBack:
    """One job read alone, its keys under ``jobs/`` and ``notes/`` at one revision (``read_back``)."""

    snap: JobSnapshot
    found: list[Found]  # the two ranges, as ``JobsRead``'s queries of every job order them


class JobsRead:
    """Every job, as ``parse_jobs`` gives it, read again only as far as something changed (module
    doc). Used on one event loop. Reads are taken one at a time: a probe must be applied to the
    read it was made against, and an older probe applied after a newer one would bring back a
    key's old value (or hide a deletion behind an old count). The snapshots it hands out are
    shared: callers treat them as read-only."""

    def __init__(self, kv: KV, keys: Keys, changes: Callable[[], int | None] = lambda: None) -> None:
        self._kv = kv
        self._keys = keys
        self._changes = changes  # news of ``jobs/`` seen so far (None: none can be relied on now)
        self._seen: int | None = None  # ``changes()`` when the held read was asked for
        # ``jobs/`` and (unwatched) ``notes/``; not ``parts/``, ``reports/``, ``rounds/``: each
        # O(N) a round (module doc)
        self._queries = tuple(Query(p, prefix=True) for p in keys.every_job())
        self.records = RecordCache()
        self._held: _Held | None = None
        self.full_reads = 0  # what the tests and benches count
        self.probes = 0  # of every key (``full_reads`` reads them all)
        self.parts_probes = 0
        self._lock = asyncio.Lock()

    async def read(self) -> Jobs:
        async with self._lock:
            return await self._read()

    async def _read(self) -> Jobs:
        held = self._held
        seen = self._changes()
        if held is not None:
            if seen is not None and seen == self._seen and await self._parts_unchanged(held):
                return held.jobs
            probe = [replace(q, min_mod_revision=held.newest + 1) for q in self._queries]
            changed = await asyncio.to_thread(self._kv.read_many, probe)
            self.probes += 1
            if self._apply(held, changed):
                self._seen = seen
                return held.jobs
        found = await asyncio.to_thread(self._kv.read_many, self._queries)
        self.full_reads += 1
        kvs = [kv for f in found for kv in f.kvs]
        by_job: dict[str, dict[str, KeyValue]] = {}
        for kv in kvs:
            job = self._keys.job_of(kv.key)
            if job is not None:
                by_job.setdefault(job, {})[kv.key] = kv
        newest = max((kv.mod_revision for kv in kvs), default=0)
        jobs = parse_jobs(self._keys, kvs, self.records)
        self._held = _Held(jobs, by_job, tuple(f.count for f in found), newest)
        self._seen = seen
        return jobs

    def read_back(self, job_id: str) -> ReadBack:
        """``job_id`` alone (blocking: run it in a thread), parsed as a read of every job parses it."""
        k = self._keys
        found = self._kv.read_many(
            [
                Query(k.job(job_id), prefix=True),
                Query(k.job_notes(job_id), prefix=True),
            ]
        )
        kvs = [kv for f in found for kv in f.kvs]
        snaps, _ = parse_jobs(k, kvs)
        return ReadBack(snaps.get(job_id) or JobSnapshot.parse(k, job_id, kvs, with_joins=False), found)

    def adopt(self, jobs: Jobs, back: ReadBack, before: int, after: int) -> Jobs | None:
        """The held read, ``jobs``, with a job this process created and read back put in, as the
        next probe would bring it (None: not done, and the next read asks etcd as it would).
        Only while no read is under way and none was asked for since the news count ``before``
        (taken before the write; its own news is not counted), which becomes ``after``."""
        held = self._held
        job = back.snap.job_id
        if held is None or held.jobs is not jobs or self._lock.locked() or self._seen != before:
            return None
        if job in held.by_job or not back.found[0].kvs:  # (a job it holds already, or no job)
            return None
        held.by_job[job] = {kv.key: kv for f in back.found for kv in f.kvs}
        held.counts = tuple(c + len(f.kvs) for c, f in zip(held.counts, back.found, strict=True))
        held.jobs = {**jobs[0], job: back.snap}, {j: keys for j, keys in jobs[1].items() if j != job}
        self._seen = after
        return held.jobs

    async def _parts_unchanged(self, held: _Held) -> bool:
        """No key under ``notes/`` (the unwatched range) created, changed or deleted since ``held``
        was read."""
        probe = [replace(q, min_mod_revision=held.newest + 1) for q in self._queries[1:]]
        found = await asyncio.to_thread(self._kv.read_many, probe)
        self.parts_probes += 1
        return all(not f.kvs and f.count == count for f, count in zip(found, held.counts[1:], strict=True))

    def _apply(self, held: _Held, changed: list[Found]) -> bool:
        """Bring ``held`` up to the probe's revision; False if a key was deleted (read it all)."""
        new = [sum(not self._holds(held, kv.key) for kv in f.kvs) for f in changed]
        if any(f.count != count + n for f, count, n in zip(changed, held.counts, new, strict=True)):
            return False
        touched: set[str] = set()
        for kv in (kv for f in changed for kv in f.kvs):
            job = self._keys.job_of(kv.key)
            if job is not None:
                held.by_job.setdefault(job, {})[kv.key] = kv
                touched.add(job)
            held.newest = max(held.newest, kv.mod_revision)
        held.counts = tuple(f.count for f in changed)
        if touched:
            held.jobs = self._reparse(held, touched)
        return True

    def _holds(self, held: _Held, key: str) -> bool:
        job = self._keys.job_of(key)
        return job is not None and key in held.by_job.get(job, {})

    def _reparse(self, held: _Held, touched: set[str]) -> Jobs:
        """The held jobs with ``touched`` parsed again (the others' snapshots are kept)."""
        snaps, strays = dict(held.jobs[0]), dict(held.jobs[1])
        kvs = [kv for job in touched for _, kv in sorted(held.by_job[job].items())]
        fresh, lost = parse_jobs(self._keys, kvs)
        for job in touched:
            snaps.pop(job, None)
            strays.pop(job, None)
        return snaps | fresh, strays | lost

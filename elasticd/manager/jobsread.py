"""Reading every job, for the scan and ``status``, at a cost that follows what changed.

One read of ``jobs/`` and ``parts/`` at one revision gives every job (``parse_jobs``): with a
thousand jobs queued that is thousands of keys, and the scan asks for it at every wake and every
``SCAN_S``, ``status`` at every refresh. So the last read is held, by job, and the next one first
asks etcd, in one small request, what was created, changed or deleted since: a range read from
the revision after the newest key held (``Query.min_mod_revision``) returns only the keys changed
since then, and counts every key of the range, so a deletion shows as a count short of the held
keys plus the new ones.

- Nothing changed: the held read is the answer (the very same objects).
- Keys created or changed, none deleted: they are applied to the held keys and only their jobs
  are parsed again; the read is then as of the probe's revision, as consistent as a full one.
- A deletion: every key is read again (and parsed with the ``RecordCache``, which reuses the
  snapshot of every job whose keys did not change).
"""

from __future__ import annotations

import asyncio
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


class JobsRead:
    """Every job, as ``parse_jobs`` gives it, read again only as far as something changed (module
    doc). Used on one event loop. Reads are taken one at a time: a probe must be applied to the
    read it was made against, and an older probe applied after a newer one would bring back a
    key's old value (or hide a deletion behind an old count). The snapshots it hands out are
    shared: callers treat them as read-only."""

    def __init__(self, kv: KV, keys: Keys) -> None:
        self._kv = kv
        self._keys = keys
        self._queries = (
            Query(keys.jobs(), prefix=True),
            Query(keys.all_parts(), prefix=True),
            Query(keys.all_rounds(), prefix=True),  # the members of every closed round, for ``status``
        )
        self.records = RecordCache()
        self._held: _Held | None = None
        self.full_reads = 0  # what the tests and benches count
        self._lock = asyncio.Lock()

    async def read(self) -> Jobs:
        async with self._lock:
            return await self._read()

    async def _read(self) -> Jobs:
        held = self._held
        if held is not None:
            probe = [replace(q, min_mod_revision=held.newest + 1) for q in self._queries]
            changed = await asyncio.to_thread(self._kv.read_many, probe)
            if self._apply(held, changed):
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
        return jobs

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

"""Reading every job, for the scan and ``status``, at a cost that follows what changed.

One read of ``jobs/`` and ``parts/`` at one revision gives every job (``parse_jobs``): with a
thousand jobs queued that is thousands of keys, and the scan asks for it at every wake and every
``SCAN_S``, ``status`` at every refresh. So the last read is held, and the next one first asks
etcd, in one small request, whether anything in those ranges was created, changed or deleted
since: a range read from the revision after the newest key it held (``Query.min_mod_revision``)
returns only the keys changed since then, and counts every key of the range, so a deletion shows
as a smaller count. Nothing changed: the held read is the answer (the same objects). Keys
created or changed, none deleted (the counts are the held ones plus the keys that are new): the
held keys with those applied are the read, as of the probe's revision. Else (a deletion) the
ranges are read again. Either is parsed with a ``RecordCache``, which reuses the snapshot of
every job whose keys did not change and decodes only the records that did.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.types import Found, KeyValue, Query
from elasticd.rendezvous.snapshot import JobSnapshot, RecordCache, parse_jobs

Jobs = tuple[dict[str, JobSnapshot], dict[str, list[str]]]  # what ``parse_jobs`` returns


@dataclass(frozen=True)
class _Held:
    jobs: Jobs
    kvs: tuple[dict[str, KeyValue], ...]  # each range's keys
    newest: int  # the highest mod revision among the keys read (0: none)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(len(kvs) for kvs in self.kvs)


class JobsRead:
    """Every job, as ``parse_jobs`` gives it, read again only when something changed (module doc).

    Used on one event loop; concurrent calls are safe (each is a consistent read; the last one
    read is held). The snapshots it hands out are shared: callers treat them as read-only."""

    def __init__(self, kv: KV, keys: Keys) -> None:
        self._kv = kv
        self._queries = (Query(keys.jobs(), prefix=True), Query(keys.all_parts(), prefix=True))
        self._keys = keys
        self.records = RecordCache()
        self._held: _Held | None = None
        self.full_reads = 0  # what the tests and benches count

    async def read(self) -> Jobs:
        held = self._held
        if held is not None:
            probe = [replace(q, min_mod_revision=held.newest + 1) for q in self._queries]
            changed = await asyncio.to_thread(self._kv.read_many, probe)
            if not any(f.kvs for f in changed) and tuple(f.count for f in changed) == held.counts:
                return held.jobs
            merged = _merge(held, changed)
            if merged is not None:
                return self._parse(merged)
        found = await asyncio.to_thread(self._kv.read_many, self._queries)
        self.full_reads += 1
        return self._parse(tuple({kv.key: kv for kv in f.kvs} for f in found))

    def _parse(self, ranges: tuple[dict[str, KeyValue], ...]) -> Jobs:
        kvs = [kv for r in ranges for _, kv in sorted(r.items())]
        jobs = parse_jobs(self._keys, kvs, self.records)
        newest = max((kv.mod_revision for kv in kvs), default=0)
        self._held = _Held(jobs, ranges, newest)
        return jobs


def _merge(held: _Held, changed: list[Found]) -> tuple[dict[str, KeyValue], ...] | None:
    """The held ranges with the keys created or changed since applied; None if a key was also
    deleted (each range's count is then short of its held keys plus the new ones)."""
    out = []
    for kvs, found in zip(held.kvs, changed, strict=True):
        new = sum(kv.key not in kvs for kv in found.kvs)
        if found.count != len(kvs) + new:
            return None
        out.append(kvs | {kv.key: kv for kv in found.kvs})
    return tuple(out)

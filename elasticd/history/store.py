"""The event history in etcd: cluster-wide, bounded, and fair to each job (``history.rings``).

Appending is one read (the counter, and how many events each ring that matters holds, with its
first: count-only and first-key ranges) and one transaction: it moves the ``event_seq`` counter
by compare-and-swap, puts the new event in its ring, and moves or deletes what ``rings.plan``
says. The size is bounded by construction, with no sweeper, and every node can append; a loser of
the race reads again. Events are rare (rounds, failures, drains), though a flood of jobs makes
many: an append costs about the same however full the history is.

Reading decodes every event through ``ClusterEvent.from_json``; an event that does not decode,
or whose job is not the one its key names, is skipped and reported (``Skipped``), never passed
on. Calls block: run them in a thread.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from elasticd.decode import DecodeError, decode_as, parse_json
from elasticd.etcd.eventkeys import EventKey, EventRing, older_job, parse_event, seq_named
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.types import Compare, Found, KeyValue, Put, Query
from elasticd.history.model import ClusterEvent
from elasticd.history.rings import Limits, Ring, Seen, needs_oldest_recent, plan
from elasticd.history.select import EventKind

MAX_TRIES = 8  # appends racing other nodes' appends
MAX_TXN_DELETES = 100  # etcd refuses a transaction of more than 128 operations (--max-txn-ops)
MAX_VALUE_BYTES = 8192  # an event's stored size; a bigger value is not one we wrote
DEFAULT_LIMITS = Limits()


class AppendConflict(Exception):
    """Other nodes kept appending: the event was not recorded."""


@dataclass(frozen=True)
class Stored:
    seq: int
    event: ClusterEvent


@dataclass(frozen=True)
class Skipped:
    """An event key that did not decode, and why."""

    key: str
    why: str


@dataclass(frozen=True)
class Page:
    events: list[Stored]  # in sequence order
    skipped: list[Skipped]
    cursor: int  # the last sequence number read (pass it as ``after`` to read what follows)


class EventLog:
    def __init__(self, kv: KV, keys: Keys, limits: Limits = DEFAULT_LIMITS) -> None:
        self._kv = kv
        self._keys = keys
        self.limits = limits

    def _counter(self, kvs: list[KeyValue]) -> tuple[int, int]:
        """The counter's value and mod revision ((0, 0) before the first event)."""
        if not kvs:
            return 0, 0
        try:
            value = decode_as(int, parse_json(kvs[0].value))
        except DecodeError as exc:
            raise DecodeError("", f"event_seq {exc.why}") from None
        if value < 0:
            raise DecodeError("", "event_seq is negative")
        return value, kvs[0].mod_revision

    def _seen(self, job: str | None) -> tuple[int, int, Seen]:
        """One read: the counter and the rings an append of an event of ``job`` needs (a second
        read for the oldest recent event, in the rare case that it must go)."""
        keys = self._keys
        queries = [Query(keys.event_seq())]
        if job is None:
            queries.append(_first(keys.event_ring(EventRing.CLUSTER)))
        else:
            queries += [
                _first(keys.event_ring(EventRing.RECENT, job)),
                Query(keys.event_ring(EventRing.RECENT), prefix=True, count_only=True),
                _first(keys.event_ring(EventRing.OLDER)),
            ]
        counter, *rings = self._kv.read_many(queries)
        seq, mod = self._counter(counter.kvs)
        seen = Seen(*(_ring(f) for f in rings))
        if job is not None and needs_oldest_recent(self.limits, seen):
            (oldest,) = self._kv.read_many(
                [Query(keys.event_ring(EventRing.RECENT), prefix=True, oldest_only=True)]
            )
            seen = replace(seen, recent=_ring(oldest))
        return seq, mod, seen

    def append(self, event: ClusterEvent) -> int:
        """Record ``event``; its sequence number. AppendConflict when others kept winning;
        DecodeError when the counter is not a number (it is not advanced over)."""
        key = self._keys.event_seq()
        # A job's removal is the last word on a job that is no more: kept with the cluster's.
        job = None if event.kind == EventKind.REMOVED else event.job
        for _ in range(MAX_TRIES):
            seq, mod, seen = self._seen(job)
            nxt = seq + 1
            step = plan(self._keys, self.limits, seen, nxt, event.to_json(), job)
            puts = [Put(key, nxt), *(Put(k, v) for k, v in step.puts)]
            if self._kv.txn([Compare(key, "mod", mod)], puts, step.deletes):
                return nxt
        raise AppendConflict(f"the event counter moved {MAX_TRIES} times while appending")

    def drop_jobs(self, jobs: Collection[str]) -> None:
        """Delete removed jobs' events (they name jobs that are no more): their recent rings, and
        their older events, found in one read of the older ring."""
        for job in jobs:
            self._kv.delete_prefix(self._keys.event_ring(EventRing.RECENT, job))
        older = self._kv.get_prefix(self._keys.event_ring(EventRing.OLDER))
        gone = [kv.key for kv in older if kv.key.rpartition("/")[2] in jobs]
        for start in range(0, len(gone), MAX_TXN_DELETES):
            self._kv.txn([], [], gone[start : start + MAX_TXN_DELETES])

    def read(self, after: int = 0, limit: int | None = None, job: str | None = None) -> Page:
        """Events with a sequence number above ``after``, oldest first: ``job``'s, or every
        one; the last ``limit`` of them when given. Once a reader has seen everything (``after``
        at the counter), a follower's poll reads the counter alone."""
        if after > 0:
            last = self._kv.get(self._keys.event_seq())
            try:
                if last is not None and self._counter([last])[0] <= after:
                    return Page([], [], after)
            except DecodeError:
                pass  # read the events; appends report the counter
        if job is None:
            queries = [Query(self._keys.events(), prefix=True)]
        else:  # its recent ring, and the rings where its older events and its removal are
            rings = [(EventRing.RECENT, job), (EventRing.OLDER, None), (EventRing.CLUSTER, None)]
            queries = [Query(self._keys.event_ring(r, j), prefix=True) for r, j in rings]
        counter, *found_rings = self._kv.read_many([Query(self._keys.event_seq()), *queries])
        try:  # every event up to the counter, as of the same revision, is in what was read
            cursor = max(after, self._counter(counter.kvs)[0])
        except DecodeError:
            cursor = after
        events, skipped, cursor = self._collect(found_rings, after, job, cursor)
        events.sort(key=lambda e: e.seq)
        if limit is not None:
            events = events[-limit:] if limit else []
        return Page(events, skipped, cursor)

    def _collect(
        self, found_rings: list[Found], after: int, job: str | None, cursor: int
    ) -> tuple[list[Stored], list[Skipped], int]:
        """The events a read found above ``after`` (``job``'s, or every one), what it skipped,
        and the cursor moved past every key it read."""
        events: list[Stored] = []
        skipped: list[Skipped] = []
        for found in found_rings:
            for kv in found.kvs:
                if job is not None and older_job(kv.key) not in (None, job):
                    continue  # another job's older event, passed by unparsed (the ring holds every job's)
                match self._read_one(kv):
                    case Stored() as stored:
                        cursor = max(cursor, stored.seq)
                        if stored.seq > after and (job is None or stored.event.job == job):
                            events.append(stored)
                    case (Skipped() as bad, seq):
                        skipped.append(bad)
                        cursor = max(cursor, seq)
        return events, skipped, cursor

    def _read_one(self, kv: KeyValue) -> Stored | tuple[Skipped, int]:
        """One key a read found: its event; or what is skipped, and the sequence number its key
        names as far as one reads (0: none)."""
        rel = self._keys.relative(kv.key)
        try:
            return self._decode(parse_event(rel), kv)
        except DecodeError as exc:
            return Skipped(rel, str(exc)), seq_named(rel)

    def _decode(self, where: EventKey, kv: KeyValue) -> Stored:
        """An event, checked against its key (``where``): the job its ring names (the cluster
        ring's are of no job, or removals of jobs)."""
        if len(kv.value) > MAX_VALUE_BYTES:
            raise DecodeError("", f"is {len(kv.value)} bytes, more than an event takes ({MAX_VALUE_BYTES})")
        event = ClusterEvent.from_json(parse_json(kv.value))
        if where.job is not None and event.job != where.job:
            raise DecodeError("job", "is not the job the key names")
        return Stored(where.seq, event)


def _first(prefix: str) -> Query:
    return Query(prefix, prefix=True, first_only=True)


def _ring(found: Found) -> Ring:
    return Ring(found.count, found.kvs[0] if found.kvs else None)

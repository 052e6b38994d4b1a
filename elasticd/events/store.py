"""The event history in etcd: ``events/<seq>``, the last ``keep`` events, cluster-wide.

Appending is one transaction: it moves the ``event_seq`` counter by compare-and-swap, puts the
new event, and deletes the event that falls out of the window (``seq - keep``). The size is
therefore bounded by construction, with no sweeper, and every node can append. Its cost: one
transaction and one read per event, and events are rare (rounds, failures, drains).

Reading decodes every event through ``ClusterEvent.from_json``; an event that does not decode
is skipped and reported (``Skipped``), never passed on. Calls block: run them in a thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticd.decode import DecodeError, decode_as, parse_json
from elasticd.etcd.keys import Keys, event_seq
from elasticd.etcd.kv import KV
from elasticd.etcd.types import Compare, KeyValue, Put, Query
from elasticd.events.model import ClusterEvent

KEEP = 1000  # events kept cluster-wide
MAX_TRIES = 8  # appends racing other nodes' appends
MAX_VALUE_BYTES = 8192  # an event's stored size; a bigger value is not one we wrote


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
    def __init__(self, kv: KV, keys: Keys, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self._kv = kv
        self._keys = keys
        self.keep = keep

    def _counter(self) -> tuple[int, int]:
        """The counter's value and mod revision ((0, 0) before the first event)."""
        kv = self._kv.get(self._keys.event_seq())
        if kv is None:
            return 0, 0
        try:
            value = decode_as(int, parse_json(kv.value))
        except DecodeError as exc:
            raise DecodeError("", f"event_seq {exc.why}") from None
        if value < 0:
            raise DecodeError("", "event_seq is negative")
        return value, kv.mod_revision

    def append(self, event: ClusterEvent) -> int:
        """Record ``event``; its sequence number. AppendConflict when others kept winning;
        DecodeError when the counter is not a number (it is not advanced over)."""
        key = self._keys.event_seq()
        for _ in range(MAX_TRIES):
            seq, mod = self._counter()
            nxt = seq + 1
            puts = [Put(key, nxt), Put(self._keys.event(nxt), event.to_json())]
            gone = [self._keys.event(nxt - self.keep)] if nxt > self.keep else []
            if self._kv.txn([Compare(key, "mod", mod)], puts, gone):
                return nxt
        raise AppendConflict(f"the event counter moved {MAX_TRIES} times while appending")

    def read(self, after: int = 0, limit: int | None = None) -> Page:
        """Events with a sequence number above ``after``, oldest first; the last ``limit`` of
        them when given. Events beyond the window (a stray key) are not returned."""
        query = Query(self._keys.event(after + 1), end=self._keys.events() + "~")
        counter = Query(self._keys.event_seq())
        found, seq_found = self._kv.read_many([query, counter])
        last = _last_seq(seq_found.kvs)
        events: list[Stored] = []
        skipped: list[Skipped] = []
        for kv in found.kvs:
            name = self._keys.relative(kv.key)
            try:
                stored = self._decode(kv)
            except DecodeError as exc:
                skipped.append(Skipped(name, str(exc)))
                continue
            if last is not None and stored.seq <= last - self.keep:
                continue
            events.append(stored)
        cursor = max([after, *(e.seq for e in events), *(_seq_or_zero(self._keys, s.key) for s in skipped)])
        if limit is not None:
            events = events[-limit:] if limit else []
        return Page(events, skipped, cursor)

    def _decode(self, kv: KeyValue) -> Stored:
        seq = event_seq(kv.key.rsplit("/", 1)[-1])
        if len(kv.value) > MAX_VALUE_BYTES:
            raise DecodeError("", f"is {len(kv.value)} bytes, more than an event takes ({MAX_VALUE_BYTES})")
        return Stored(seq, ClusterEvent.from_json(parse_json(kv.value)))


def _last_seq(kvs: list[KeyValue]) -> int | None:
    try:
        return int(decode_as(int, parse_json(kvs[0].value))) if kvs else None
    except DecodeError:
        return None


def _seq_or_zero(keys: Keys, name: str) -> int:
    try:
        return event_seq(name.rsplit("/", 1)[-1])
    except DecodeError:
        return 0

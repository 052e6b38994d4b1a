"""``MemoryKV``: the ``KV`` seam in memory, a faithful fake of etcd for unit and property tests.

It follows etcd v3 rather than simplifying it, so that code tested against it behaves the same
on a real etcd; ``tests/contract/test_kv_contract.py`` runs one suite against both. One revision
counter, 1 when fresh: each put, and each delete, transaction or ended lease that changes
something, takes exactly one new revision. Keys keep create_revision across puts and get a new
one after a delete. Leases have whole-second TTLs of at least 2 s (what a default etcd grants)
on an injected clock, are expired at the start of every call, and delete their keys as they end.

Refusals are what ``EtcdClient`` raises today: a put on an unknown lease, or a transaction that
names a key twice, is ``EtcdUnavailable`` (the client wraps every refusal so), writing nothing.
``status`` reports the sizes and alarms a test sets (``db_size``, ``db_size_in_use``,
``alarms``); while NOSPACE is raised, what etcd refuses is refused (``EtcdNoSpace``): puts,
transactions with puts, lease grants. Reads, deletes and keep-alives go on.
Watch callbacks run in revision order from a caller's thread, outside the lock, so they may call
the store. For outages: ``available = False``, ``fail_next(n)`` and ``break_watches()``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from elasticd import log
from elasticd.errors import EtcdNoSpace, EtcdUnavailable
from elasticd.etcd.kv import ALL_KEYS, prefix_end
from elasticd.etcd.types import Compare, EtcdStatus, Found, KeyValue, Put, Query, WatchEvent

_log = log.get("elasticd.etcd.memory")

MIN_LEASE_TTL_S = 2  # a default etcd raises shorter TTLs to 1.5 election timeouts, rounded up


@dataclass
class _Lease:
    ttl: int
    deadline: float
    keys: set[str] = field(default_factory=set)


@dataclass(eq=False)
class _Watch:
    start: str
    end: str
    on_change: Callable[[str, bool], None]
    on_broken: Callable[[], None]
    deletes_only: bool = False
    active: bool = True
    on_events: Callable[[list[WatchEvent]], None] | None = None  # (``watch_from``)

    def covers(self, key: str) -> bool:
        return in_range(key, self.start, self.end)


def in_range(key: str, start: str, end: str) -> bool:
    """[start, end) in code-point order, which is UTF-8 byte order: etcd's key order."""
    return start <= key and (end == ALL_KEYS or key < end)


_Event = tuple[_Watch, WatchEvent | None]  # None: the watch broke
HISTORY = 10_000  # changes kept for ``watch_from``; one older counts as compacted


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _covers(q: Query, key: str) -> bool:
    """Whether the range ``q`` names ``key`` (as etcd checks a txn's puts against its deletes:
    by the ranges, whether the key exists or not)."""
    if q.prefix:
        return key.startswith(q.key)
    return in_range(key, q.key, q.end) if q.end is not None else key == q.key


class MemoryKV:
    """Thread-safe under one lock; watch callbacks run outside it, one at a time, in order."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._revision = 1
        self._kvs: dict[str, KeyValue] = {}
        self._versions: dict[str, int] = {}
        self._leases: dict[int, _Lease] = {}
        self._next_lease = 0x5EED0001
        self._watches: list[_Watch] = []
        self._pending: deque[_Event] = deque()
        self._history: deque[WatchEvent] = deque(maxlen=HISTORY)
        self._dispatching = False
        self._failures = 0
        self._compacted = 0
        self.available = True
        self.db_size: int | None = None  # None: the bytes of the keys and values stored
        self.db_size_in_use: int | None = None  # None: db_size
        self.alarms: set[str] = set()

    # -- outages ----------------------------------------------------------------------------
    def fail_next(self, n: int = 1) -> None:
        """The next ``n`` calls raise ``EtcdUnavailable``."""
        with self._lock:
            self._failures = n

    def break_watches(self) -> None:
        """Every watch is told ``on_broken`` once and gets nothing more (its stream ended)."""
        with self._lock:
            self._pending.extend((w, None) for w in self._watches)
            self._watches.clear()
        self._flush()

    def health(self) -> str:
        with self._op():
            return "memory"

    def status(self) -> EtcdStatus | None:
        with self._op():
            stored = sum(len(k) + len(kv.value) for k, kv in self._kvs.items())
            size = stored if self.db_size is None else self.db_size
            in_use = size if self.db_size_in_use is None else self.db_size_in_use
            return EtcdStatus(size, in_use, self._revision, tuple(sorted(self.alarms)))

    def compact(self, revision: int) -> None:
        with self._op():
            if revision > self._revision:
                raise EtcdUnavailable(
                    "etcd refused the request: mvcc: required revision is a future revision"
                )
            self._compacted = max(self._compacted, revision)

    def _check_space(self) -> None:
        """What etcd refuses while NOSPACE is raised: anything that would grow the database."""
        if "NOSPACE" in self.alarms:
            raise EtcdNoSpace("etcd refused a write: etcdserver: mvcc: database space exceeded")

    def close(self) -> None:
        with self._lock:
            self._watches.clear()

    # -- key/value ---------------------------------------------------------------------------
    def get(self, key: str) -> KeyValue | None:
        with self._op():
            return self._kvs.get(key)

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        return self.read_many([Query(prefix, prefix=True)])[0].kvs

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        with self._op():
            return [replace(self._read(q), revision=self._revision) for q in queries]

    def put_json(self, key: str, value: Any, lease: int | None = None) -> None:
        self.txn([], [Put(key, value, lease)])

    def txn(
        self, compare: Sequence[Compare], puts: Sequence[Put], deletes: Sequence[str | Query] = ()
    ) -> bool:
        return self.write_and_read(compare, puts, deletes, ()) is not None

    def write_and_read(
        self,
        compare: Sequence[Compare],
        puts: Sequence[Put],
        deletes: Sequence[str | Query],
        reads: Sequence[Query],
    ) -> list[Found] | None:
        data = [(p.key, _encode(p.value), p.lease or 0) for p in puts]
        ranges = [d if isinstance(d, Query) else Query(d) for d in deletes]
        with self._op():
            written = {p.key for p in puts}
            if len(written) < len(puts) or any(_covers(q, k) for q in ranges for k in written):
                raise EtcdUnavailable("etcd refused the request: duplicate key given in txn request")
            if puts:
                self._check_space()  # (etcd refuses before it compares, as the request would grow it)
            if not all(self._holds(c) for c in compare):
                return None
            if any(lease and lease not in self._leases for _, _, lease in data):
                raise EtcdUnavailable("etcd refused the request: requested lease not found")
            for key, value, lease in data:
                self._set(key, value, lease)
            removed = [self._remove(kv.key) for q in ranges for kv in self._read(q).kvs]
            if data or any(removed):
                self._revision += 1
            return [self._read(q) for q in reads]

    def delete(self, key: str) -> bool:
        with self._op():
            if not self._remove(key):
                return False
            self._revision += 1
            return True

    def delete_prefix(self, prefix: str) -> None:
        with self._op():
            keys = [kv.key for kv in self._read(Query(prefix, prefix=True)).kvs]
            for key in keys:
                self._remove(key)
            if keys:
                self._revision += 1

    def watch_range(
        self,
        start: str,
        end: str,
        on_change: Callable[[str, bool], None],
        on_broken: Callable[[], None],
        deletes_only: bool = False,
    ) -> Callable[[], None]:
        watch = _Watch(start, end, on_change, on_broken, deletes_only)
        with self._op():
            self._watches.append(watch)

        def cancel() -> None:
            with self._lock:
                watch.active = False
                if watch in self._watches:
                    self._watches.remove(watch)

        return cancel

    def watch_prefix(
        self, prefix: str, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        return self.watch_range(prefix, prefix_end(prefix), on_change, on_broken)

    def watch_from(
        self,
        start: str,
        end: str,
        revision: int,
        on_events: Callable[[list[WatchEvent]], None],
        on_broken: Callable[[], None],
    ) -> Callable[[], None]:
        watch = _Watch(start, end, lambda _k, _d: None, on_broken, on_events=on_events)
        with self._op():
            oldest = self._history[0].kv.mod_revision if len(self._history) == HISTORY else 0
            if revision < self._compacted or (oldest and revision < oldest):
                self._pending.append((watch, None))  # as etcd cancels it: compacted
            else:
                self._pending.extend(
                    (watch, e)
                    for e in self._history
                    if e.kv.mod_revision >= revision and watch.covers(e.kv.key)
                )
                self._watches.append(watch)

        def cancel() -> None:
            with self._lock:
                watch.active = False
                if watch in self._watches:
                    self._watches.remove(watch)

        return cancel

    # -- leases ------------------------------------------------------------------------------
    def grant_lease(self, ttl_s: float) -> int:
        with self._op():
            self._check_space()
            ttl = max(MIN_LEASE_TTL_S, round(ttl_s))
            lease_id, self._next_lease = self._next_lease, self._next_lease + 1
            self._leases[lease_id] = _Lease(ttl, self._clock() + ttl)
            return lease_id

    def refresh_lease(self, lease_id: int) -> int:
        with self._op():
            lease = self._leases.get(lease_id)
            if lease is None:
                return 0
            lease.deadline = self._clock() + lease.ttl
            return lease.ttl

    def revoke_lease(self, lease_id: int) -> None:
        with self._op():
            self._end_lease(lease_id)

    def expire_leases(self) -> None:
        """End every lease past its deadline now (every other call does this first, too)."""
        with self._op():
            pass

    # -- internals (called with the lock held) -------------------------------------------------
    @contextlib.contextmanager
    def _op(self) -> Iterator[None]:
        try:
            with self._lock:
                now = self._clock()
                for lease_id in sorted(i for i, lease in self._leases.items() if lease.deadline <= now):
                    self._end_lease(lease_id)
                if not self.available or self._failures > 0:
                    self._failures = max(0, self._failures - 1)
                    raise EtcdUnavailable("etcd is unreachable (simulated outage of the memory KV)")
                yield
        finally:
            self._flush()

    def _read(self, q: Query) -> Found:
        if q.prefix:
            kvs = [kv for k, kv in self._kvs.items() if k.startswith(q.key)]
        elif q.end is not None:
            kvs = [kv for k, kv in self._kvs.items() if in_range(k, q.key, q.end)]
        else:
            kvs = [self._kvs[q.key]] if q.key in self._kvs else []
        if q.count_only:  # no keys, as Query says
            return Found([], len(kvs))
        if q.min_mod_revision:  # etcd filters the keys but counts the whole range
            return Found(sorted((kv for kv in kvs if kv.mod_revision >= q.min_mod_revision),
                                key=lambda kv: kv.key), len(kvs))  # fmt: skip
        if q.oldest_only:
            return Found(sorted(kvs, key=lambda kv: kv.create_revision)[:1], len(kvs))
        if q.first_only or q.limit:
            return Found(sorted(kvs, key=lambda kv: kv.key)[: q.limit or 1], len(kvs))
        return Found(sorted(kvs, key=lambda kv: kv.key), len(kvs))

    def _holds(self, c: Compare) -> bool:
        kv = self._kvs.get(c.key)
        if kv is None:
            return c.revision == 0
        actual = {"create": kv.create_revision, "mod": kv.mod_revision, "lease": kv.lease}[c.target]
        return actual == c.revision

    def _set(self, key: str, value: bytes, lease: int) -> None:
        """Write at the next revision; the caller moves the counter once for the whole change."""
        revision = self._revision + 1
        old = self._kvs.get(key)
        if old is not None and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        created = revision if old is None else old.create_revision
        self._kvs[key] = kv = KeyValue(key, value, created, revision, lease)
        self._versions[key] = self._versions.get(key, 0) + 1
        if lease:
            self._leases[lease].keys.add(key)
        self._notify(WatchEvent(kv, deleted=False))

    def _remove(self, key: str) -> bool:
        old = self._kvs.pop(key, None)
        if old is None:
            return False
        del self._versions[key]
        if old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        self._notify(WatchEvent(KeyValue(key, b"", 0, self._revision + 1, 0), deleted=True))
        return True

    def _end_lease(self, lease_id: int) -> None:
        """Revoke or expire: the lease's keys go in one revision, as etcd deletes them."""
        lease = self._leases.pop(lease_id, None)
        if lease is None or not lease.keys:
            return
        for key in sorted(lease.keys):
            self._remove(key)
        self._revision += 1

    def _notify(self, event: WatchEvent) -> None:
        self._history.append(event)
        key, deleted = event.kv.key, event.deleted
        self._pending.extend(
            (w, event) for w in self._watches if w.covers(key) and (deleted or not w.deletes_only)
        )

    # -- watch delivery (without the lock) ---------------------------------------------------
    def _flush(self) -> None:
        """Deliver pending events in order. One thread delivers at a time; a change made by a
        callback (or by another thread meanwhile) is queued and delivered by this same loop."""
        with self._lock:
            if self._dispatching:
                return
            self._dispatching = True
        while (event := self._next_event()) is not None:
            watch, change = event
            try:
                if change is None:
                    watch.on_broken()
                elif watch.on_events is not None:
                    watch.on_events([change])
                else:
                    watch.on_change(change.kv.key, change.deleted)
            except Exception:  # as EtcdClient does: logged, and the writer and later events carry on
                _log.exception("watch.callback_failed", start=watch.start, key=change and change.kv.key)

    def _next_event(self) -> _Event | None:
        with self._lock:
            while self._pending:
                event = self._pending.popleft()
                if event[0].active:
                    return event
            self._dispatching = False
            return None

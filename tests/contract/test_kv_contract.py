"""The ``KV`` contract: the same tests against ``MemoryKV`` and a real etcd (``EtcdClient``).

The shared etcd may see writes of other tests meanwhile, so revision checks compare revisions
with each other (equal, greater); exact numbers are checked on the memory KV alone, at the end,
with the behaviours only a fake clock or a simulated outage can show.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from elasticd.errors import ElasticdError, EtcdNoSpace, EtcdUnavailable
from elasticd.etcd.kv import ALL_KEYS, KV, prefix_end
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.types import Compare, Found, KeyValue, Put, Query
from tests.contract.conftest import Alarm
from tests.support import wait_for

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10.0


class Events:
    """What a watch reported, collected from whichever thread calls back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: list[tuple[str, bool]] = []
        self.broken = 0

    def on_change(self, key: str, deleted: bool) -> None:
        with self._lock:
            self._seen.append((key, deleted))

    def on_broken(self) -> None:
        with self._lock:
            self.broken += 1

    def seen(self) -> list[tuple[str, bool]]:
        with self._lock:
            return list(self._seen)

    def wait(self, key: str, deleted: bool) -> list[tuple[str, bool]]:
        wait_for(lambda: (key, deleted) in self.seen(), WAIT_S, 0.01, f"watch event {key} {deleted}")
        return self.seen()


def must_get(kv: KV, key: str) -> KeyValue:
    found = kv.get(key)
    assert found is not None, key
    return found


# -- keys and values ---------------------------------------------------------------------------
def test_put_get_and_prefix_in_key_order(kv: KV, base: str) -> None:
    assert kv.get(f"{base}/absent") is None
    kv.put_json(f"{base}/b", {"x": [1, 2], "y": "z"})
    kv.put_json(f"{base}/a/2", 2)
    kv.put_json(f"{base}/a/1", None)
    kv.put_json(f"{base}/ab", "sibling")

    b = must_get(kv, f"{base}/b")
    assert b.value == b'{"x":[1,2],"y":"z"}' and b.json() == {"x": [1, 2], "y": "z"} and b.lease == 0
    assert must_get(kv, f"{base}/a/1").json() is None
    assert [x.key for x in kv.get_prefix(f"{base}/a/")] == [f"{base}/a/1", f"{base}/a/2"]
    assert [x.key for x in kv.get_prefix(f"{base}/")] == [
        f"{base}/a/1",
        f"{base}/a/2",
        f"{base}/ab",
        f"{base}/b",
    ]
    assert kv.get_prefix(f"{base}/none/") == []


def test_create_and_mod_revisions(kv: KV, base: str) -> None:
    key = f"{base}/k"
    kv.put_json(key, 1)
    first = must_get(kv, key)
    assert first.create_revision == first.mod_revision > 1

    kv.put_json(key, 1)  # the same value is still a write
    second = must_get(kv, key)
    assert second.create_revision == first.create_revision and second.mod_revision > first.mod_revision

    kv.put_json(f"{base}/other", 0)
    assert must_get(kv, f"{base}/other").create_revision > second.mod_revision

    assert kv.delete(key)
    kv.put_json(key, 2)
    again = must_get(kv, key)
    assert again.create_revision == again.mod_revision > second.mod_revision


def test_delete_says_whether_the_key_existed(kv: KV, base: str) -> None:
    kv.put_json(f"{base}/k", 1)
    assert kv.delete(f"{base}/k") is True
    assert kv.get(f"{base}/k") is None
    assert kv.delete(f"{base}/k") is False


def test_delete_prefix_removes_only_under_the_prefix(kv: KV, base: str) -> None:
    for key in ("d/1", "d/2/x", "dd", "e"):
        kv.put_json(f"{base}/{key}", key)
    kv.delete_prefix(f"{base}/d/")
    assert [x.key for x in kv.get_prefix(f"{base}/")] == [f"{base}/dd", f"{base}/e"]
    kv.delete_prefix(f"{base}/nothing/")  # no error


# -- transactions ------------------------------------------------------------------------------
def test_txn_compare_on_create_revision(kv: KV, base: str) -> None:
    key = f"{base}/k"
    assert kv.txn([Compare(key, "create", 0)], [Put(key, "mine")])
    created = must_get(kv, key)
    assert not kv.txn([Compare(key, "create", 0)], [Put(key, "theirs")])
    assert must_get(kv, key) == created  # nothing applied on failure
    assert kv.txn([Compare(key, "create", created.create_revision)], [Put(key, "mine again")])
    assert must_get(kv, key).json() == "mine again"


def test_txn_compare_on_mod_revision_fences_stale_writers(kv: KV, base: str) -> None:
    key = f"{base}/k"
    kv.put_json(key, 1)
    seen = must_get(kv, key)
    kv.put_json(key, 2)  # someone else wrote meanwhile
    assert not kv.txn([Compare(key, "mod", seen.mod_revision)], [Put(key, 3)])
    assert must_get(kv, key).json() == 2
    current = must_get(kv, key)
    assert kv.txn([Compare(key, "mod", current.mod_revision)], [Put(key, 3)])
    assert must_get(kv, key).json() == 3
    assert not kv.txn([Compare(f"{base}/absent", "mod", current.mod_revision)], [Put(key, 4)])
    assert kv.txn([Compare(f"{base}/absent", "mod", 0)], [])


def test_txn_compare_on_lease_lands_only_beside_a_key_of_that_lease(kv: KV, base: str) -> None:
    key, beside = f"{base}/k", f"{base}/beside"
    mine, other = kv.grant_lease(60), kv.grant_lease(60)
    try:
        kv.put_json(key, 1, mine)
        assert not kv.txn([Compare(key, "lease", other)], [Put(beside, "no", other)])
        assert kv.get(beside) is None
        assert kv.txn([Compare(key, "lease", mine)], [Put(beside, "yes", mine)])
        assert must_get(kv, beside).lease == mine
        assert kv.txn([Compare(f"{base}/absent", "lease", 0)], [])  # an absent key holds no lease
        assert not kv.txn([Compare(f"{base}/absent", "lease", mine)], [])
    finally:
        kv.revoke_lease(mine)
        kv.revoke_lease(other)
    assert kv.get(beside) is None  # gone with the lease it was guarded by


def test_write_and_read_reads_what_it_wrote_at_one_revision_or_nothing(kv: KV, base: str) -> None:
    kv.put_json(f"{base}/j/a", 1)
    kv.put_json(f"{base}/gone", 1)
    reads = [Query(f"{base}/j/", prefix=True, count_only=True), Query(f"{base}/j/b"), Query(f"{base}/gone")]
    found = kv.write_and_read(
        [Compare(f"{base}/j/b", "create", 0)], [Put(f"{base}/j/b", 2)], [f"{base}/gone"], reads
    )
    assert found is not None
    count, mine, gone = found
    assert count.count == 2 and mine.kvs[0].json() == 2 and gone.kvs == []  # its own writes seen
    assert mine.kvs[0].mod_revision == must_get(kv, f"{base}/j/b").mod_revision
    assert (
        kv.write_and_read([Compare(f"{base}/j/b", "create", 0)], [Put(f"{base}/j/b", 3)], [], reads) is None
    )
    assert must_get(kv, f"{base}/j/b").json() == 2  # a failed comparison: nothing written


def test_txn_applies_puts_and_deletes_at_one_revision(kv: KV, base: str) -> None:
    kv.put_json(f"{base}/old", 0)
    kv.put_json(f"{base}/keep", 0)
    guard = [Compare(f"{base}/keep", "create", must_get(kv, f"{base}/keep").create_revision)]
    assert kv.txn(guard, [Put(f"{base}/a", 1), Put(f"{base}/b", 2)], [f"{base}/old", f"{base}/absent"])
    a, b = must_get(kv, f"{base}/a"), must_get(kv, f"{base}/b")
    assert a.create_revision == a.mod_revision == b.create_revision == b.mod_revision
    assert kv.get(f"{base}/old") is None

    stale = [Compare(f"{base}/a", "mod", a.mod_revision - 1)]
    assert not kv.txn(stale, [Put(f"{base}/c", 3)], [f"{base}/a"])
    assert kv.get(f"{base}/c") is None and must_get(kv, f"{base}/a") == a


def test_txn_deletes_ranges_with_keys_at_one_revision(kv: KV, base: str) -> None:
    for key in ("j/1/a", "j/1/b", "j/10/a", "s/1", "s/10"):
        kv.put_json(f"{base}/{key}", key)
    assert kv.txn([], [Put(f"{base}/other", 0)], [Query(f"{base}/j/1/", prefix=True), f"{base}/s/1"])
    left = [x.key for x in kv.get_prefix(f"{base}/")]
    assert left == [f"{base}/{k}" for k in ("j/10/a", "other", "s/10")]
    assert kv.txn([], [], [Query(f"{base}/j/", end=f"{base}/j/2")])
    assert kv.get(f"{base}/j/10/a") is None
    with pytest.raises(ElasticdError):  # a put inside a deleted range names its key twice
        kv.txn([], [Put(f"{base}/s/10/x", 1)], [Query(f"{base}/s/", prefix=True)])
    assert kv.get(f"{base}/s/10") is not None


def test_a_range_since_a_revision_has_its_changes_and_counts_every_key(kv: KV, base: str) -> None:
    for key in ("a", "b", "c"):
        kv.put_json(f"{base}/r/{key}", key)
    since = max(x.mod_revision for x in kv.get_prefix(f"{base}/r/")) + 1
    assert kv.read_many([Query(f"{base}/r/", prefix=True, min_mod_revision=since)]) == [Found([], 3)]
    kv.put_json(f"{base}/r/b", "again")
    kv.delete(f"{base}/r/c")
    (found,) = kv.read_many([Query(f"{base}/r/", prefix=True, min_mod_revision=since)])
    assert [x.key for x in found.kvs] == [f"{base}/r/b"] and found.count == 2


def test_txn_naming_a_key_twice_is_refused(kv: KV, base: str) -> None:
    with pytest.raises(ElasticdError):
        kv.txn([], [Put(f"{base}/k", 1), Put(f"{base}/k", 2)])
    with pytest.raises(ElasticdError):
        kv.txn([], [Put(f"{base}/k", 1)], [f"{base}/k"])
    assert kv.get(f"{base}/k") is None


# -- read_many ---------------------------------------------------------------------------------
def test_read_many_ranges(kv: KV, base: str) -> None:
    for key in ("r/z", "r/b", "r/a", "s/1", "s/2", "s/3", "t"):  # r/z is the oldest
        kv.put_json(f"{base}/{key}", key)
    r = f"{base}/r/"
    found = kv.read_many(
        [
            Query(r, prefix=True),
            Query(r, prefix=True, oldest_only=True),
            Query(r, prefix=True, count_only=True),
            Query(f"{base}/s/1", end=f"{base}/s/3"),
            Query(f"{base}/t"),
            Query(f"{base}/absent"),
            Query(f"{base}/none/", prefix=True, oldest_only=True),
            Query(r, prefix=True, first_only=True),
        ]
    )
    assert len(found) == 8
    assert [x.key for x in found[0].kvs] == [f"{r}a", f"{r}b", f"{r}z"] and found[0].count == 3
    assert [x.key for x in found[1].kvs] == [f"{r}z"] and found[1].count == 3
    assert found[2] == Found([], 3)  # count_only: the count, no keys
    assert [x.key for x in found[3].kvs] == [f"{base}/s/1", f"{base}/s/2"] and found[3].count == 2
    assert found[4] == Found([must_get(kv, f"{base}/t")], 1)
    assert found[5] == Found([], 0) and found[6] == Found([], 0)
    assert [x.key for x in found[7].kvs] == [f"{r}a"] and found[7].count == 3  # first_only: in key order


def test_a_range_is_read_in_pages_with_a_limit(kv: KV, base: str) -> None:
    """``limit``: the first keys in key order, and the whole range counted, so that the next page
    starts after the last key read."""
    for key in ("r/d", "r/a", "r/c", "r/b", "r/e"):
        kv.put_json(f"{base}/{key}", key)
    r = f"{base}/r/"
    (first,) = kv.read_many([Query(r, prefix=True, limit=2)])
    assert [x.key for x in first.kvs] == [f"{r}a", f"{r}b"] and first.count == 5
    (rest,) = kv.read_many([Query(first.kvs[-1].key + "\0", end=prefix_end(r), limit=2)])
    assert [x.key for x in rest.kvs] == [f"{r}c", f"{r}d"] and rest.count == 3


def test_read_many_reads_one_revision(kv: KV, base: str) -> None:
    """A writer moves two keys together; every read of both sees them equal."""
    a, b = f"{base}/a", f"{base}/b"
    kv.txn([], [Put(a, 0), Put(b, 0)])
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            kv.txn([], [Put(a, n), Put(b, n)])

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        values: set[int] = set()

        def read_both() -> bool:
            fa, fb = kv.read_many([Query(a), Query(b)])
            assert fa.kvs[0].json() == fb.kvs[0].json()
            assert fa.kvs[0].mod_revision == fb.kvs[0].mod_revision
            values.add(fa.kvs[0].json())
            return len(values) >= 20  # reads interleaved with many writes

        wait_for(read_both, WAIT_S, 0, "reads between writes")
    finally:
        stop.set()
        thread.join(WAIT_S)


# -- leases ------------------------------------------------------------------------------------
def test_lease_owns_its_keys_until_revoked(kv: KV, base: str) -> None:
    lease = kv.grant_lease(5)
    assert kv.refresh_lease(lease) == 5
    kv.put_json(f"{base}/held/1", 1, lease=lease)
    assert kv.txn([], [Put(f"{base}/held/2", 2, lease)])
    kv.put_json(f"{base}/moved", 3, lease=lease)
    kv.put_json(f"{base}/moved", 3)  # a put without the lease detaches the key from it
    kv.put_json(f"{base}/free", 4)
    assert must_get(kv, f"{base}/held/1").lease == lease == must_get(kv, f"{base}/held/2").lease
    assert must_get(kv, f"{base}/moved").lease == 0

    kv.revoke_lease(lease)
    assert kv.get_prefix(f"{base}/held/") == []
    assert kv.get(f"{base}/moved") is not None and kv.get(f"{base}/free") is not None
    assert kv.refresh_lease(lease) <= 0
    kv.revoke_lease(lease)  # already gone: no error


def test_revoking_an_unknown_lease_is_no_error(kv: KV) -> None:
    kv.revoke_lease(0x7EADBEEF)
    assert kv.refresh_lease(0x7EADBEEF) <= 0


def test_put_with_a_dead_lease_is_refused_and_writes_nothing(kv: KV, base: str) -> None:
    lease = kv.grant_lease(5)
    kv.revoke_lease(lease)
    with pytest.raises(ElasticdError):
        kv.put_json(f"{base}/k", 1, lease=lease)
    with pytest.raises(ElasticdError):
        kv.txn([], [Put(f"{base}/k", 1, lease)])
    assert kv.get(f"{base}/k") is None
    # A failed comparison applies nothing, so the dead lease is never looked at.
    assert not kv.txn([Compare(f"{base}/k", "create", 1)], [Put(f"{base}/k", 1, lease)])


# -- watches -----------------------------------------------------------------------------------
def test_watch_sees_puts_and_deletes_under_its_prefix_only(kv: KV, base: str) -> None:
    w = f"{base}/w/"
    events = Events()
    cancel = kv.watch_prefix(w, events.on_change, events.on_broken)
    try:
        lease = kv.grant_lease(30)
        kv.put_json(f"{base}/outside", 0)
        kv.put_json(f"{base}/w", 0)  # the prefix without its slash: outside too
        kv.put_json(f"{w}a", 1)
        kv.txn([], [Put(f"{w}b", 2, lease), Put(f"{w}c", 3)])
        kv.put_json(f"{w}a", 4)
        kv.delete(f"{w}a")
        kv.revoke_lease(lease)
        kv.delete_prefix(w)
        seen = events.wait(f"{w}c", True)
    finally:
        cancel()
    assert seen == [
        (f"{w}a", False),
        (f"{w}b", False),
        (f"{w}c", False),
        (f"{w}a", False),
        (f"{w}a", True),
        (f"{w}b", True),  # its lease was revoked
        (f"{w}c", True),
    ]
    assert events.broken == 0


def test_a_deletes_only_watch_gets_deletions_and_lease_ends_but_no_puts(kv: KV, base: str) -> None:
    """The filter is etcd's (``NOPUT``): a put is never sent, so the first event is the delete."""
    w = f"{base}/w/"
    events, everything = Events(), Events()
    cancel = kv.watch_range(w, prefix_end(w), events.on_change, events.on_broken, deletes_only=True)
    cancel_all = kv.watch_prefix(w, everything.on_change, everything.on_broken)
    try:
        lease = kv.grant_lease(30)
        kv.put_json(f"{w}a", 1)
        kv.txn([], [Put(f"{w}b", 2, lease), Put(f"{w}c", 3)])
        kv.put_json(f"{w}a", 4)
        kv.delete(f"{w}a")
        kv.revoke_lease(lease)
        kv.put_json(f"{w}d", 5)
        kv.delete(f"{w}c")
        seen = events.wait(f"{w}c", True)
        everything.wait(f"{w}c", True)
    finally:
        cancel()
        cancel_all()
    assert seen == [(f"{w}a", True), (f"{w}b", True), (f"{w}c", True)]  # b: its lease was revoked
    assert events.broken == 0


def test_cancelled_watch_gets_nothing_more(kv: KV, base: str) -> None:
    w = f"{base}/w/"
    cancelled, active = Events(), Events()
    cancel = kv.watch_prefix(w, cancelled.on_change, cancelled.on_broken)
    cancel_active = kv.watch_prefix(w, active.on_change, active.on_broken)
    try:
        kv.put_json(f"{w}before", 0)
        cancelled.wait(f"{w}before", False)
        cancel()
        kv.put_json(f"{w}after", 1)
        kv.put_json(f"{w}last", 2)
        # Events come in revision order: once the live watch has "last", "after" was delivered.
        assert active.wait(f"{w}last", False) == [
            (f"{w}before", False),
            (f"{w}after", False),
            (f"{w}last", False),
        ]
    finally:
        cancel_active()
    assert cancelled.seen() == [(f"{w}before", False)]
    cancel()  # twice: no error


def test_a_failing_callback_neither_fails_the_writer_nor_ends_the_watch(kv: KV, base: str) -> None:
    w = f"{base}/w/"
    events = Events()

    def fails_first(key: str, deleted: bool) -> None:
        events.on_change(key, deleted)
        if key == f"{w}first":
            raise RuntimeError("a bug in a watcher")

    cancel = kv.watch_prefix(w, fails_first, events.on_broken)
    try:
        kv.put_json(f"{w}first", 1)
        kv.put_json(f"{w}second", 2)
        assert events.wait(f"{w}second", False) == [(f"{w}first", False), (f"{w}second", False)]
    finally:
        cancel()


def test_watch_range_sees_only_keys_in_start_to_end(kv: KV, base: str) -> None:
    start, end = f"{base}/r/b", f"{base}/r/d"
    events = Events()
    cancel = kv.watch_range(start, end, events.on_change, events.on_broken)
    try:
        for key in ("r/a", "r/b", "r/bz", "r/c/1", "r/d", "r/e", "r"):
            kv.put_json(f"{base}/{key}", key)
        kv.delete(f"{base}/r/a")  # outside
        kv.delete(f"{base}/r/bz")
        kv.delete_prefix(f"{base}/r/")
        seen = events.wait(f"{base}/r/c/1", True)
    finally:
        cancel()
    assert seen == [
        (start, False),  # the start is in the range
        (f"{base}/r/bz", False),
        (f"{base}/r/c/1", False),
        (f"{base}/r/bz", True),
        (start, True),  # delete_prefix: one revision, key order
        (f"{base}/r/c/1", True),
    ]  # never the end itself, nor anything before start or after end
    assert events.broken == 0


def test_watch_range_to_all_keys_and_prefix_end(kv: KV, base: str) -> None:
    assert prefix_end("/a/") == "/a0" and prefix_end("") == ALL_KEYS
    events = Events()
    cancel = kv.watch_range(f"{base}/z", ALL_KEYS, events.on_change, events.on_broken)
    try:
        kv.put_json(f"{base}/a", 0)
        kv.put_json(f"{base}/z", 1)
        kv.put_json(f"{base}/zz/\u00e9", 2)
        seen = events.wait(f"{base}/zz/\u00e9", False)
    finally:
        cancel()
    assert [key for key, _ in seen if key.startswith(base)] == [f"{base}/z", f"{base}/zz/\u00e9"]


def test_cancel_stops_a_range_watch_without_on_broken_even_from_its_callback(kv: KV, base: str) -> None:
    events = Events()
    cancels: list[Callable[[], None]] = []

    def cancel_on_stop(key: str, deleted: bool) -> None:
        events.on_change(key, deleted)
        if key.endswith("/stop"):
            cancels[0]()  # from the watch's own thread: no deadlock, nothing more delivered

    cancels.append(kv.watch_range(f"{base}/", f"{base}0", cancel_on_stop, events.on_broken))
    witness = Events()
    cancel_witness = kv.watch_range(f"{base}/", f"{base}0", witness.on_change, witness.on_broken)
    try:
        kv.put_json(f"{base}/stop", 0)
        kv.put_json(f"{base}/after", 1)
        witness.wait(f"{base}/after", False)  # in revision order: "after" reached every watch
    finally:
        cancel_witness()
    assert events.seen() == [(f"{base}/stop", False)] and events.broken == 0
    cancels[0]()  # again: no error


def test_a_broken_watch_calls_on_broken_once_and_nothing_after(
    breakable: tuple[KV, Callable[[], None]],
) -> None:
    kv, break_it = breakable
    events = Events()
    cancel = kv.watch_range("/b/", "/b0", events.on_change, events.on_broken)
    kv.put_json("/b/1", 1)
    events.wait("/b/1", False)
    break_it()
    wait_for(lambda: events.broken > 0, WAIT_S, 0.01, "on_broken")
    if isinstance(kv, MemoryKV):
        kv.put_json("/b/2", 2)  # delivered synchronously, if at all
    cancel()  # after the break: no error, and no second on_broken
    assert events.seen() == [("/b/1", False)] and events.broken == 1


# -- the memory KV alone: exact revisions, time, outages ---------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_memory_revisions_count_like_a_fresh_etcd() -> None:
    kv = MemoryKV()
    kv.put_json("/a", 1)
    assert must_get(kv, "/a").mod_revision == 2  # a fresh etcd is at revision 1
    kv.txn([], [Put("/b", 1), Put("/c", 1)])
    assert must_get(kv, "/b").mod_revision == must_get(kv, "/c").mod_revision == 3
    assert not kv.delete("/absent")
    kv.delete_prefix("/none/")
    kv.txn([], [], ["/absent"])
    kv.revoke_lease(kv.grant_lease(5))  # no keys: nothing changes
    kv.put_json("/d", 1)
    assert must_get(kv, "/d").mod_revision == 4
    kv.delete_prefix("/")  # three keys, one revision
    kv.put_json("/a", 2)
    assert must_get(kv, "/a").create_revision == 6


def test_memory_leases_expire_on_the_clock() -> None:
    clock = FakeClock()
    kv = MemoryKV(clock=clock)
    events = Events()
    kv.watch_prefix("/", events.on_change, events.on_broken)
    short, long = kv.grant_lease(0.2), kv.grant_lease(10)
    assert kv.refresh_lease(short) == 2  # etcd's shortest TTL
    kv.put_json("/short", 1, lease=short)
    kv.put_json("/long", 1, lease=long)

    clock.now += 1.5
    assert kv.refresh_lease(short) == 2  # the deadline moves to now + 2
    clock.now += 1.5
    assert kv.get("/short") is not None
    clock.now += 0.5
    kv.expire_leases()
    assert events.seen()[-1] == ("/short", True)  # delivered before the call returned
    assert kv.get("/short") is None and kv.refresh_lease(short) == 0
    with pytest.raises(EtcdUnavailable, match="lease not found"):
        kv.put_json("/short", 2, lease=short)

    clock.now += 7.0  # without an explicit expire: any call ends what is due
    assert kv.get("/long") is None and kv.refresh_lease(long) == 0


def test_memory_outages_and_broken_watches() -> None:
    kv = MemoryKV()
    events = Events()
    kv.watch_prefix("/", events.on_change, events.on_broken)
    kv.fail_next(2)
    for _ in range(2):
        with pytest.raises(EtcdUnavailable):
            kv.put_json("/a", 1)
    kv.put_json("/a", 1)
    kv.available = False
    with pytest.raises(EtcdUnavailable):
        kv.get("/a")
    with pytest.raises(EtcdUnavailable):
        kv.health()
    kv.available = True
    assert kv.health()
    kv.break_watches()
    kv.put_json("/b", 1)
    assert events.seen() == [("/a", False)] and events.broken == 1


def test_memory_callbacks_may_write_and_events_stay_in_order() -> None:
    kv = MemoryKV()
    events = Events()

    def echo(key: str, deleted: bool) -> None:
        events.on_change(key, deleted)
        if key == "/in/a":
            kv.put_json("/in/b", 1)  # from inside a callback: queued, delivered next

    kv.watch_prefix("/in/", echo, events.on_broken)
    kv.put_json("/in/a", 1)
    kv.put_json("/in/c", 1)
    assert events.seen() == [("/in/a", False), ("/in/b", False), ("/in/c", False)]


def test_two_ranges_watch_a_prefix_but_a_subtree_and_watch_prefix_is_the_whole_range(
    kv: KV, base: str
) -> None:
    """What a daemon watches (``Keys.watched``): all but one subtree, each key once."""
    skip = f"{base}/p/s/"
    ranges, whole = Events(), Events()
    cancels = [
        kv.watch_range(f"{base}/p/", skip, ranges.on_change, ranges.on_broken),
        kv.watch_range(prefix_end(skip), prefix_end(f"{base}/p/"), ranges.on_change, ranges.on_broken),
        kv.watch_prefix(f"{base}/p/", whole.on_change, whole.on_broken),
    ]
    try:
        keys = [f"{base}/p/{k}" for k in ("a", "r", "s", "s/1", "s/2/x", "s0", "t", "z/1")]
        for key in keys:
            kv.put_json(key, 0)
        kv.put_json(f"{base}/p0", 0)  # outside the prefix, just past its end
        kv.put_json(f"{base}/p/~end", 0)
        whole.wait(f"{base}/p/~end", False)
        seen = ranges.wait(f"{base}/p/~end", False)
    finally:
        for cancel in cancels:
            cancel()
    assert sorted(k for k, _ in seen) == sorted(
        [k for k in keys if not k.startswith(skip)] + [f"{base}/p/~end"]
    )
    assert [k for k, _ in whole.seen()] == [*keys, f"{base}/p/~end"]


def test_prefix_end_bounds_a_prefix_as_etcd_does(kv: KV, base: str) -> None:
    for key in ("q/", "q/a", "q/\u00e9", "q/\u00ff/x", "q0", "q.", "qa"):
        kv.put_json(f"{base}/{key}", 0)
    for prefix in (f"{base}/q/", f"{base}/q/\u00ff"):
        (ranged,) = kv.read_many([Query(prefix, end=prefix_end(prefix))])
        assert ranged.kvs == kv.get_prefix(prefix) != []
    assert prefix_end("/a/") == "/a0" and prefix_end("") == "\0"


# -- the database's size, alarms and compaction ------------------------------------------------
def test_status_reports_size_revision_and_no_alarm(kv: KV, base: str) -> None:
    kv.put_json(f"{base}/k", "x" * 1000)
    status = kv.status()
    assert status is not None
    assert status.db_size > 0 and 0 < status.db_size_in_use <= status.db_size
    assert status.alarms == ()
    kv.put_json(f"{base}/k", "y")
    later = kv.status()
    assert later is not None and later.revision > status.revision


def test_compaction_keeps_the_keys_and_a_second_one_is_no_error(kv: KV, base: str) -> None:
    kv.put_json(f"{base}/k", 1)
    kv.put_json(f"{base}/k", 2)
    status = kv.status()
    assert status is not None
    kv.compact(status.revision)
    kv.compact(status.revision)  # already compacted: nothing to do
    assert must_get(kv, f"{base}/k").json() == 2
    with pytest.raises(EtcdUnavailable):
        kv.compact(status.revision + 1000)  # a future revision


def test_under_nospace_writes_that_grow_are_refused_the_rest_goes_on(
    alarmable: tuple[KV, Alarm],
) -> None:
    """What etcd does under NOSPACE: puts, transactions with puts and lease grants are refused
    (``EtcdNoSpace``, an ``EtcdUnavailable``); reads, deletes, delete-only transactions,
    keep-alives and revokes still work, so a node keeps its lease and can make room."""
    kv, alarm = alarmable
    lease = kv.grant_lease(10)
    kv.put_json("/nospace/a", 1, lease)
    kv.put_json("/nospace/b", 2)
    alarm("NOSPACE", True)
    status = kv.status()
    assert status is not None and status.alarms == ("NOSPACE",)
    with pytest.raises(EtcdNoSpace, match=r"quota|space"):
        kv.put_json("/nospace/c", 3)
    with pytest.raises(EtcdNoSpace):
        kv.txn([Compare("/nospace/b", "create", 0)], [Put("/nospace/c", 3)])  # even when it would not apply
    with pytest.raises(EtcdNoSpace):
        kv.grant_lease(10)
    assert isinstance(EtcdNoSpace("x"), EtcdUnavailable)
    assert kv.refresh_lease(lease) > 0
    assert must_get(kv, "/nospace/a").json() == 1
    assert kv.txn([], [], ["/nospace/b"]) and kv.get("/nospace/b") is None
    assert kv.delete("/nospace/a")
    kv.revoke_lease(lease)
    alarm("NOSPACE", False)
    status = kv.status()
    assert status is not None and status.alarms == ()
    kv.put_json("/nospace/c", 3)
    assert must_get(kv, "/nospace/c").json() == 3


def test_memory_status_reports_the_sizes_a_test_sets() -> None:
    memory = MemoryKV()
    memory.put_json("/k", "v")
    memory.db_size, memory.db_size_in_use = 900, 300
    memory.alarms.add("CORRUPT")
    status = memory.status()
    assert status is not None and (status.db_size, status.db_size_in_use, status.alarms) == (
        900,
        300,
        ("CORRUPT",),
    )

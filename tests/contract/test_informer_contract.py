"""The informer's contract: the same tests against ``MemoryKV`` and a real etcd (gateway, grpc).

One copy of a key range, listed at a revision and kept current by a watch from the one after:
what is written shows, what is deleted goes, a writer that waits for its write's revision sees
it, a compacted revision makes it list again, and what it holds is bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from elasticd.etcd.kv import KV, prefix_end
from elasticd.etcd.types import KeyValue, WatchEvent
from elasticd.informer.informer import Informer, Phase
from elasticd.informer.store import Bound, Completeness, Store

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10.0


UNBOUNDED = Bound()


def _store(base: str, bound: Bound = UNBOUNDED) -> Store[dict[str, bytes]]:
    """Groups are the first path element under ``base``; a group reads as its values by key."""

    def group_of(key: str) -> str | None:
        rest = key[len(base) + 1 :]
        return rest.split("/", 1)[0] if "/" in rest else None

    def decode(group: str, kvs: list[KeyValue]) -> dict[str, bytes]:
        return {kv.key[len(base) + 1 :]: kv.value for kv in kvs}

    return Store([(base + "/", prefix_end(base + "/"))], group_of, decode, bound)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 40))


async def _until(check: Callable[[], bool], what: str) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _informer(kv: KV, base: str, store: Store[dict[str, bytes]]) -> Informer[dict[str, bytes]]:
    return Informer(kv, store, name="test")


def test_a_write_waited_for_by_its_revision_is_in_the_copy(kv: KV, base: str) -> None:
    kv.put_json(f"{base}/a/x", 1)

    async def body() -> None:
        informer = _informer(kv, base, _store(base))
        task = asyncio.ensure_future(informer.run())
        try:
            await informer.listed(WAIT_S)
            assert informer.reads() == {"a": {"a/x": b"1"}}
            await asyncio.to_thread(kv.put_json, f"{base}/b/y", 2)
            written = await asyncio.to_thread(kv.get, f"{base}/b/y")
            assert written is not None
            assert await informer.wait_for(written.mod_revision, WAIT_S)
            assert informer.reads()["b"] == {"b/y": b"2"}
            await _until(lambda: informer.phase is Phase.WATCHING, "the watch")
            assert informer.lists == 1
        finally:
            task.cancel()

    _run(body)


def test_a_deleted_key_leaves_the_copy_and_an_unchanged_read_is_the_same_object(kv: KV, base: str) -> None:
    kv.put_json(f"{base}/a/x", 1)
    kv.put_json(f"{base}/a/y", 2)
    kv.put_json(f"{base}/b/z", 3)

    async def body() -> None:
        informer = _informer(kv, base, _store(base))
        task = asyncio.ensure_future(informer.run())
        try:
            await informer.listed(WAIT_S)
            before = informer.reads()
            await asyncio.to_thread(kv.delete, f"{base}/a/y")
            await asyncio.to_thread(kv.delete, f"{base}/b/z")
            await _until(lambda: "b" not in informer.reads(), "the deletes")
            after = informer.reads()
            assert after == {"a": {"a/x": b"1"}}
            assert after is informer.reads()  # nothing changed since: the very same mapping
            assert before["a"] is not after["a"]
        finally:
            task.cancel()

    _run(body)


def test_a_compacted_revision_makes_it_list_again(kv: KV, base: str) -> None:
    """Stopped (its watch gone), then the keys change and etcd compacts past the copy's
    revision: the watch cannot resume from it, so the informer lists again."""
    kv.put_json(f"{base}/a/x", 1)
    store = _store(base)

    async def body() -> None:
        informer = _informer(kv, base, store)
        task = asyncio.ensure_future(informer.run())
        await informer.listed(WAIT_S)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        kv.delete(f"{base}/a/x")
        kv.put_json(f"{base}/c/w", 4)
        status = kv.status()
        assert status is not None
        kv.compact(status.revision)
        again = _informer(kv, base, store)
        task = asyncio.ensure_future(again.run())
        try:
            await _until(lambda: again.lists == 1 and again.phase is Phase.WATCHING, "the relist")
            assert again.reads() == {"c": {"c/w": b"4"}}
            await asyncio.to_thread(kv.put_json, f"{base}/c/v", 5)
            await _until(lambda: "c/v" in again.reads().get("c", {}), "news after the relist")
        finally:
            task.cancel()

    _run(body)


def test_the_copy_is_bounded_and_says_so(kv: KV, base: str) -> None:
    for i in range(3):
        kv.put_json(f"{base}/g{i}/k", i)

    async def body() -> None:
        store = _store(base, Bound(keys=2))
        informer = _informer(kv, base, store)
        task = asyncio.ensure_future(informer.run())
        try:
            await informer.listed(WAIT_S)
            assert len(store) == 2 and store.state is Completeness.OVER_BOUND and store.left_out == 1
            await asyncio.to_thread(kv.put_json, f"{base}/g9/k", 9)  # past the bound: left out
            await asyncio.to_thread(kv.put_json, f"{base}/g0/k", 10)  # held: still changed
            await _until(lambda: informer.reads().get("g0") == {"g0/k": b"10"}, "the held key's change")
            assert "g9" not in informer.reads() and len(store) == 2
        finally:
            task.cancel()

    _run(body)


def test_caught_up_holds_a_delete_made_before_it(kv: KV, base: str) -> None:
    """A writer that does not know its write's revision (a delete) asks for the copy to catch up
    with etcd; after it, the copy shows the write. The same with a watch that heard nothing
    (a stalled stream): the copy is listed again."""
    kv.put_json(f"{base}/a/x", 1)
    kv.put_json(f"{base}/b/y", 2)

    async def body() -> None:
        informer = _informer(kv, base, _store(base))
        task = asyncio.ensure_future(informer.run())
        try:
            await _until(lambda: informer.phase is Phase.WATCHING, "the watch")
            await asyncio.to_thread(kv.delete, f"{base}/a/x")
            await informer.caught_up(WAIT_S)
            assert informer.lists == 1  # (the watch's news of the delete)
            assert "a" not in informer.reads()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(kv.delete, f"{base}/b/y")  # no watch hears it
        await asyncio.to_thread(kv.put_json, f"{base}/c/z", 3)
        await informer.caught_up(0.2)
        assert informer.reads() == {"c": {"c/z": b"3"}} and informer.lists == 2

    _run(body)


def test_a_watch_wider_than_the_copy_reports_every_change_and_holds_its_ranges_only(
    kv: KV, base: str
) -> None:
    kv.put_json(f"{base}/held/a/x", 1)
    seen: list[str | None] = []

    async def body() -> None:
        held = f"{base}/held/"
        store: Store[int] = Store([(held, prefix_end(held))], lambda k: k[len(held) :].split("/")[0],
                                  lambda g, kvs: len(kvs))  # fmt: skip

        def heard(events: list[WatchEvent] | None) -> None:
            seen.extend([None] if events is None else [e.kv.key for e in events])

        informer = Informer(kv, store, watched=[(base + "/", prefix_end(base + "/"))], on_events=heard)
        task = asyncio.ensure_future(informer.run())
        try:
            await informer.listed(WAIT_S)
            await asyncio.to_thread(kv.put_json, f"{base}/other", 1)
            await asyncio.to_thread(kv.put_json, f"{base}/held/b/y", 2)
            await _until(lambda: f"{base}/held/b/y" in seen, "the news")
            assert seen == [None, f"{base}/other", f"{base}/held/b/y"]
            assert informer.reads() == {"a": 1, "b": 1} and len(store) == 2
        finally:
            task.cancel()

    _run(body)

"""RecentRead: what ``status`` answers from. A held read is given out only while no change was
seen since it began and it is younger than max_age; callers share reads; errors are not held."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.manager.jobmanager import JobManager
from elasticd.manager.sharedread import RecentRead
from elasticd.rendezvous.store import InlineJobStore
from tests.fakes import bare_manager, make_spec

T = TypeVar("T")
MAX_AGE, REFRESH = 1.0, 0.25


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Store:
    """What the reads read: a version that each write bumps. A read can be held open (``gate``)."""

    def __init__(self) -> None:
        self.version = 0
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def read(self) -> int:
        seen = self.version
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return seen


def run(body: Callable[[Store, Clock, RecentRead[int]], Awaitable[T]]) -> T:
    async def main() -> T:
        store, clock = Store(), Clock()
        return await body(store, clock, RecentRead(store.read, clock, MAX_AGE, REFRESH))

    return asyncio.run(main())


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_valid_read_is_given_out_again_without_reading() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        assert await recent.get() == 0
        store.version = 1  # a part's change: no one says
        clock.t += REFRESH / 2
        assert await recent.get() == 0
        assert recent.held() == 0
        assert recent.reads == 1

    run(body)


def test_a_change_seen_makes_the_next_caller_read() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        await recent.get()
        store.version = 1
        recent.invalidate()
        assert recent.held() is None
        assert await recent.get() == 1
        assert recent.reads == 2

    run(body)


def test_a_read_as_old_as_max_age_is_not_given_out() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        await recent.get()
        store.version = 1
        clock.t += MAX_AGE
        assert recent.held() is None
        assert await recent.get() == 1

    run(body)


def test_past_refresh_the_caller_is_served_at_once_and_one_read_runs_behind() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        await recent.get()
        store.version = 1
        store.gate = asyncio.Event()  # the background read will wait: the callers must not
        clock.t += REFRESH
        assert await asyncio.wait_for(recent.get(), 1) == 0
        assert await asyncio.wait_for(recent.get(), 1) == 0
        await settle()
        assert recent.reads == 2  # one read behind both callers
        store.gate.set()
        await settle()
        assert recent.held() == 1

    run(body)


def test_callers_with_nothing_held_share_one_read() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        store.gate = asyncio.Event()
        callers = [asyncio.ensure_future(recent.get()) for _ in range(20)]
        await settle()
        store.gate.set()
        assert await asyncio.gather(*callers) == [0] * 20
        assert recent.reads == 1

    run(body)


def test_a_caller_after_a_change_does_not_join_the_read_that_began_before_it() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        store.gate = asyncio.Event()
        early = asyncio.ensure_future(recent.get())
        await settle()  # the first read has seen version 0
        store.version = 1
        recent.invalidate()
        late = asyncio.ensure_future(recent.get())
        await settle()
        store.gate.set()
        assert await early == 0
        assert await late == 1
        assert recent.reads == 2
        assert recent.held() == 1  # the read that began before the change is not held

    run(body)


def test_a_failed_read_goes_to_its_callers_and_leaves_nothing_held() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        store.fail = EtcdUnavailable("etcd is down")
        with pytest.raises(EtcdUnavailable):
            await recent.get()
        assert recent.held() is None
        store.fail = None
        assert await recent.get() == 0
        assert recent.reads == 2

    run(body)


def test_a_failed_background_read_keeps_the_held_value_until_max_age() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        await recent.get()
        store.fail = EtcdUnavailable("etcd is down")
        clock.t += REFRESH
        assert await recent.get() == 0
        await settle()  # the background read failed (and its error was retrieved)
        assert recent.held() == 0
        clock.t += MAX_AGE
        with pytest.raises(EtcdUnavailable):
            await recent.get()

    run(body)


def test_a_caller_that_goes_away_leaves_the_read_to_the_others() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        store.gate = asyncio.Event()
        gone = asyncio.ensure_future(recent.get())
        stays = asyncio.ensure_future(recent.get())
        await settle()
        gone.cancel()
        await settle()
        store.gate.set()
        assert await stays == 0
        assert recent.reads == 1

    run(body)


def test_an_advanced_read_is_given_to_the_scan_as_a_new_read_would_be() -> None:
    """This process's own write, read back and put in the held read, costs no read: not for
    ``status`` (``get``) and not for the scan (``fresh``), which otherwise always reads."""

    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        assert await recent.fresh() == 0
        since = recent.generation
        store.version = 1  # the write; its watch news is the writer's own: no invalidate
        assert recent.advance(since, lambda old: old + 1) == 1
        assert await recent.fresh() == 1 and await recent.get() == 1
        assert recent.reads == 1
        recent.invalidate()  # anyone else's change: read again
        assert await recent.fresh() == 1 and recent.reads == 2
        assert await recent.fresh() == 1 and recent.reads == 3  # a plain held read: fresh reads

    run(body)


def test_an_advance_after_another_change_drops_the_read() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        await recent.get()
        since = recent.generation
        store.version = 2
        recent.invalidate()  # someone else's change, seen between the read and the write
        assert recent.advance(since, lambda old: old + 1) is None
        assert recent.held() is None and await recent.get() == 2

    run(body)


def test_an_advance_of_a_read_past_max_age_drops_it() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        await recent.get()
        since = recent.generation
        clock.t += MAX_AGE
        assert recent.advance(since, lambda old: old + 1) is None
        assert recent.held() is None

    run(body)


def test_a_read_begun_before_an_advance_is_not_held_after_it() -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        await recent.get()
        store.gate = asyncio.Event()
        clock.t += REFRESH
        assert await recent.get() == 0  # and a background read begins, seeing version 0
        await settle()
        since = recent.generation
        store.version = 1
        assert recent.advance(since, lambda old: 1) == 1
        store.gate.set()
        await settle()
        assert recent.held() == 1 and await recent.fresh() == 1

    run(body)


def test_refresh_must_not_exceed_max_age() -> None:
    async def read() -> int:
        return 0

    with pytest.raises(ValueError):
        RecentRead(read, max_age_s=0.5, refresh_s=1.0)


# Any history of watched writes (each followed by the watch's invalidate), this process's own
# writes (read back and advanced, their watch news not counted), unwatched writes, time passing
# and calls: every answer is at least as new as the last watched write before the call, and as
# etcd was max_age before it.
OPS = st.lists(
    st.one_of(
        st.just(("watched",)),
        st.just(("own",)),
        st.just(("part",)),
        st.tuples(st.just("wait"), st.floats(0.0, 1.5)),
        st.just(("get",)),
        st.just(("fresh",)),
        st.just(("settle",)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_an_answer_is_never_older_than_the_last_change_nor_max_age(ops: list[tuple[object, ...]]) -> None:
    async def body(store: Store, clock: Clock, recent: RecentRead[int]) -> None:
        history = [(clock.t, 0)]  # (when, version from then on)
        last_watched = 0
        for op in ops:
            if op[0] == "own":
                since = recent.generation
                store.version += 1
                history.append((clock.t, store.version))
                last_watched = store.version
                recent.advance(since, lambda _: store.version)  # (read back: the version now)
            elif op[0] in ("watched", "part"):
                store.version += 1
                history.append((clock.t, store.version))
                if op[0] == "watched":
                    last_watched = store.version
                    recent.invalidate()
            elif op[0] == "wait":
                assert isinstance(op[1], float)
                clock.t += op[1]
            elif op[0] == "settle":
                await settle()
            else:
                got = await (recent.fresh() if op[0] == "fresh" else recent.get())
                assert got >= last_watched
                as_of = clock.t - MAX_AGE
                floor = max((v for t, v in history if t < as_of), default=0)
                assert got >= floor

    run(body)


async def _until_armed(manager: JobManager) -> None:
    """Until the manager's watch is armed (arming drops the held read)."""
    async with asyncio.timeout(10):
        while manager.jobwatch._armed is None:
            await asyncio.sleep(0.01)


def test_the_managers_watch_drops_the_held_read_when_any_job_key_changes(tmp_path: Path) -> None:
    """The wiring: ``JobManager.watch`` turns a change of a job's key, made by anyone, into
    ``recent.invalidate`` (``JobManager.wake``)."""

    async def main() -> None:
        kv, keys = MemoryKV(), Keys("/t")
        manager = bare_manager(kv, keys, tmp_path)
        watch = asyncio.ensure_future(manager.jobwatch.watch())
        try:
            await _until_armed(manager)
            for key in (keys.job_spec("j1"), keys.job_final("j2")):
                await manager.recent.get()
                assert manager.recent.held() is not None
                await asyncio.to_thread(kv.put_json, key, {"any": "value"})
                async with asyncio.timeout(10):
                    while manager.recent.held() is not None:
                        await asyncio.sleep(0.01)
        finally:
            watch.cancel()

    asyncio.run(main())


def test_the_news_of_a_job_this_node_created_leaves_the_held_read_but_a_later_change_drops_it(
    tmp_path: Path,
) -> None:
    """The watch's news of the keys a submit wrote is the submitter's own (it reads the job back
    and advances the read); any other change of that job, as of every other, drops the read."""

    async def main() -> None:
        kv, keys = MemoryKV(), Keys("/t")
        manager = bare_manager(kv, keys, tmp_path)
        watch = asyncio.ensure_future(manager.jobwatch.watch())
        try:
            await _until_armed(manager)
            async with asyncio.timeout(10):
                await manager.recent.get()
                heard = manager.jobwatch.expect_head("j1")
                assert await InlineJobStore(kv, keys, "j1").create(make_spec(id="j1"))
                await heard.wait()
                assert manager.recent.held() is not None
                await asyncio.to_thread(kv.put_json, keys.job_round("j1"), {"any": "value"})
                while manager.recent.held() is not None:
                    await asyncio.sleep(0.01)
        finally:
            manager.jobwatch.forget_head("j1")
            watch.cancel()

    asyncio.run(main())

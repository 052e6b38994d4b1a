"""What a daemon's scan and ``status`` read and write with many jobs queued: never a job's full
spec (``specs/``), which only a node about to take part reads (and checks against the head);
no job decoded again while its keys are unchanged; no pending note written again while it holds;
the copy of every job (``ClusterCopy``), kept by its watch, is what a full read gives."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.types import Compare, Found, KeyValue, Put, Query
from elasticd.informer.informer import Phase
from elasticd.jobs.view import job_row
from elasticd.manager import statusviews
from elasticd.manager.clustercopy import ClusterCopy
from elasticd.manager.facts import NodeFacts
from elasticd.manager.jobmanager import JobManager
from elasticd.manager.service import CommandService
from elasticd.rendezvous.jobparse import parse_jobs
from elasticd.rendezvous.jobread import JobRead
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.state import EndReason, JobState
from tests.fakes import bare_manager, make_spec

KEYS = Keys("/t")


class CountingKV(MemoryKV):
    """``MemoryKV`` that records every key or range it is asked to read, and every key written."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []
        self.written: list[str] = []

    def get(self, key: str) -> KeyValue | None:
        self.read.append(key)
        return super().get(key)

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        self.read.extend(q.key for q in queries)
        return super().read_many(queries)

    def txn(
        self, compare: Sequence[Compare], puts: Sequence[Put], deletes: Sequence[str | Query] = ()
    ) -> bool:
        self.written.extend(p.key for p in puts)
        return super().txn(compare, puts, deletes)

    def reset(self) -> None:
        self.read.clear()
        self.written.clear()


def queue(kv: MemoryKV, n: int, **spec: Any) -> list[str]:
    """``n`` jobs of 4 KiB of environment each, from 5 users, as a submit writes them."""
    jobs = [f"q{i:03d}" for i in range(n)]
    for i, job in enumerate(jobs):
        user = i % 5
        s = make_spec(
            id=job, uid=2000 + user, gid=2000 + user, user=f"u{user}", env={"E": "x" * 4096}, **spec
        )
        assert run_inline(InlineJobStore(kv, KEYS, job).create(s))
    return jobs


def manager(kv: MemoryKV, tmp: Path) -> JobManager:
    return bare_manager(kv, KEYS, tmp, lease=kv.grant_lease(30))


def test_the_scan_and_status_never_read_a_full_spec(tmp_path: Path) -> None:
    kv = CountingKV()
    jobs = queue(kv, 40, nodes=("elsewhere",))
    m = manager(kv, tmp_path)
    kv.reset()
    asyncio.run(m.scan())
    reads = asyncio.run(m.cluster.current())
    assert sorted(reads) == jobs and all(s.head is not None and s.head.user for s in reads.values())
    assert kv.read and not [k for k in kv.read if k.startswith(KEYS.specs())]


def test_unchanged_jobs_are_not_decoded_again(tmp_path: Path) -> None:
    kv = CountingKV()
    queue(kv, 30, nodes=("elsewhere",))
    m = manager(kv, tmp_path)
    asyncio.run(m.scan())
    store = m.cluster.informer.store
    first = store.decoded
    assert first == 30  # every job, once
    asyncio.run(m.scan())
    asyncio.run(m.cluster.current())
    assert store.decoded == first
    run_inline(InlineJobStore(kv, KEYS, "q007").finalize(JobState.KILLED, EndReason.KILLED, "by u"))
    run_inline(InlineJobStore(kv, KEYS, "q007").remove())
    asyncio.run(m.scan())
    assert store.decoded == first and len(asyncio.run(m.cluster.current())) == 29  # the removed job's dropped


def test_a_pending_note_is_written_once_while_it_holds(tmp_path: Path) -> None:
    kv = CountingKV()
    jobs = queue(kv, 20, nodes=("n1",), nproc_per_node=4)  # n1 has 2 slots: all wait
    m = manager(kv, tmp_path)
    kv.reset()
    asyncio.run(m.scan())
    notes = [k for k in kv.written if k.startswith(KEYS.all_notes())]
    assert sorted(notes) == sorted(KEYS.pending_note(j, "n1") for j in jobs)
    kv.reset()
    asyncio.run(m.scan())
    assert not [k for k in kv.written if k.startswith(KEYS.all_notes())]


def test_a_full_spec_that_is_missing_or_disagrees_with_its_head_fails_only_its_job(tmp_path: Path) -> None:
    kv = CountingKV()
    good, missing, rogue = queue(kv, 3, nodes=("n1",), nproc_per_node=1, nnodes=make_spec().nnodes)
    kv.delete(KEYS.job_body(missing))
    kv.put_json(KEYS.job_body(rogue), make_spec(id=rogue, uid=0, user="root").to_json())
    kv.delete(KEYS.job_body(good))  # so that no agent starts here: it fails the same way
    m = manager(kv, tmp_path)
    kv.reset()
    asyncio.run(m.scan())
    assert sorted(k for k in kv.read if k.startswith(KEYS.specs())) == [
        KEYS.job_body(j)
        for j in (good, missing, rogue)  # read by the node taking part, once each
    ]
    reads = asyncio.run(m.cluster.current())
    for job, why in (
        (missing, "missing: the job has a head but no spec"),
        (rogue, "disagrees with the job's head"),
    ):
        final = reads[job].final
        assert final is not None and final.state is JobState.FAILED and final.code is EndReason.INVALID_RECORD
        assert final.reason.startswith(f"invalid record at specs/{job}: ") and why in final.reason
    assert not m.agents and not m.admitter.allocator.held


async def watching(copy: ClusterCopy) -> asyncio.Future[None]:
    """The copy's informer, run until its watch is open."""
    task = asyncio.ensure_future(copy.run())
    async with asyncio.timeout(10):
        while copy.informer.phase is not Phase.WATCHING:
            await asyncio.sleep(0.01)
    return task


def full_read(kv: MemoryKV) -> dict[str, Any]:
    return parse_jobs(KEYS, kv.get_prefix(KEYS.jobs()) + kv.get_prefix(KEYS.all_notes()))[0]


def test_a_copy_with_nothing_changed_asks_nothing_and_gives_the_same_objects(tmp_path: Path) -> None:
    kv = CountingKV()
    queue(kv, 30, nodes=("elsewhere",))
    m = manager(kv, tmp_path)
    informer = m.cluster.informer

    async def run() -> None:
        task = await watching(m.cluster)
        try:
            first = await m.cluster.current()
            kv.reset()
            assert await m.cluster.current() is first and not kv.read and informer.lists == 1
            lease = kv.grant_lease(30)
            await InlineJobStore(kv, KEYS, "q003").note_pending("n9", "n9 is busy", lease)
            await InlineJobStore(kv, KEYS, "q004").finalize(JobState.KILLED, EndReason.KILLED, "by u")
            await m.cluster.caught_up()
            again = await m.cluster.current()  # keys created and changed: the watch's news
            assert again["q003"].pending == {"n9": "n9 is busy"} and again["q004"].final is not None
            assert all(again[j] is first[j] for j in first if j not in ("q003", "q004"))
            await asyncio.to_thread(kv.delete, KEYS.pending_note("q003", "n9"))  # a deletion: heard too
            await m.cluster.caught_up()
            last = await m.cluster.current()
            assert not last["q003"].pending and last["q004"].final is not None
            assert last == full_read(kv) and informer.lists == 1
        finally:
            task.cancel()

    asyncio.run(run())


def test_the_safety_nets_scan_stops_when_nothing_changed(tmp_path: Path) -> None:
    kv = CountingKV()
    queue(kv, 10, nodes=("elsewhere",))
    m = manager(kv, tmp_path)
    asyncio.run(m.scan())
    kv.reset()
    asyncio.run(m.scan(quiet=True))
    assert not kv.written and KEYS.janitor() not in kv.read  # no janitor's round, no admission
    asyncio.run(m.scan())  # a scan something asked for does it all
    assert KEYS.janitor() in kv.read
    kv.reset()
    run_inline(InlineJobStore(kv, KEYS, "q001").finalize(JobState.KILLED, EndReason.KILLED, "by u"))
    asyncio.run(m.scan(quiet=True))  # a change the watch did not report is found
    assert KEYS.janitor() in kv.read


OPS = st.lists(
    st.tuples(
        st.sampled_from(["create", "final", "note", "unnote", "remove", "junk", "status"]),
        st.sampled_from(["a1", "a2", "a3"]),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
async def _apply(kv: MemoryKV, lease: int, op: str, job: str) -> None:
    """One of ``OPS``' changes, through the job store as the daemons write it."""
    store = InlineJobStore(kv, KEYS, job)
    match op:
        case "create":
            await store.create(make_spec(id=job))
        case "final":
            await store.finalize(JobState.KILLED, EndReason.KILLED, "by u")
        case "note":
            await store.note_pending("n1", f"note {len(kv.get_prefix(KEYS.all_notes()))}", lease)
        case "unnote":
            await store.note_pending("n1", None, lease)
        case "remove":
            await store.remove()
        case "junk":
            kv.put_json(KEYS.job(job) + "junk", 1)
        case "status":
            await store.put_node_status("n2", {"state": "RUNNING"}, lease)


@given(ops=OPS)
def test_a_copy_kept_by_its_watch_is_what_a_full_read_gives(ops: list[tuple[str, str]]) -> None:
    kv = MemoryKV()
    lease = kv.grant_lease(3600)
    copy = ClusterCopy(kv, KEYS, "n1", wake=lambda change: None)

    async def check() -> None:
        task = await watching(copy)
        try:
            for op, job in ops:
                await _apply(kv, lease, op, job)
                await copy.caught_up()
                assert await copy.current() == full_read(kv), op
            assert copy.informer.lists == 1  # every change came as the watch's news
        finally:
            task.cancel()

    asyncio.run(check())


class SlowKV(MemoryKV):
    """Reads at once, but the next read it is told to hold returns only when released."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = threading.Event()
        self.release = threading.Event()

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        found = super().read_many(queries)
        if self.hold.is_set():
            self.hold.clear()
            assert self.release.wait(10)
        return found


def test_a_late_list_never_brings_back_an_older_value(tmp_path: Path) -> None:
    kv = SlowKV()
    queue(kv, 3, nodes=("elsewhere",))
    copy = ClusterCopy(kv, KEYS, "n1", wake=lambda change: None)
    lease = kv.grant_lease(30)
    store = InlineJobStore(kv, KEYS, "q001")

    async def race() -> None:
        run_inline(store.note_pending("n1", "old", lease))
        kv.hold.set()
        late = asyncio.ensure_future(copy.caught_up())  # lists "old", returns later
        await asyncio.sleep(0.05)
        run_inline(store.note_pending("n1", "new", lease))
        newer = asyncio.ensure_future(copy.caught_up())
        await asyncio.sleep(0.05)
        kv.release.set()
        await asyncio.gather(late, newer)
        assert (await copy.current())["q001"].pending == {"n1": "new"}

    asyncio.run(race())


class SlowSpecKV(CountingKV):
    def get(self, key: str) -> KeyValue | None:
        if key.startswith(KEYS.specs()):
            time.sleep(0.2)  # (in the scan's worker thread)
        return super().get(key)


def test_two_scans_at_once_take_a_node_into_a_job_once(tmp_path: Path) -> None:
    kv = SlowSpecKV()
    (job,) = queue(kv, 1, nodes=("n1",), nproc_per_node=1, nnodes=make_spec().nnodes)
    kv.delete(KEYS.job_body(job))  # no agent starts here: the one that would fails the job
    m = manager(kv, tmp_path)
    kv.reset()

    async def both() -> None:
        await asyncio.gather(m.scan(clean_up=False), m.scan())  # a submit's and the watch's

    asyncio.run(both())
    assert [k for k in kv.read if k.startswith(KEYS.specs())] == [KEYS.job_body(job)]


def test_status_json_is_the_views_with_their_queue_places_and_reuses_unchanged_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status`` of every job sends each view as encoded when its job last changed, with its
    queue place spliced in: a submit moves places, never the views of jobs that did not change."""
    kv = CountingKV()
    queue(kv, 12, nodes=("elsewhere",))
    m = manager(kv, tmp_path)
    facts = NodeFacts("n", 0.0, (), True, False, 10.0, tmp_path)
    service = CommandService(facts, m, None, kv, KEYS)  # type: ignore[arg-type]  # reads only
    views = asyncio.run(service.jobs.views())
    assert json.loads(asyncio.run(service.jobs.views_json())) == views
    assert all("queue" in v for v in views) and {v["queue"]["of"] for v in views} == {12}
    rows = json.loads(asyncio.run(service.jobs.views_json(rows=True)))  # the table's: a row per job
    assert rows == [job_row(v) | {"queue": {"place": v["queue"]["place"], "of": 12}} for v in views]
    encoded: list[str] = []
    held = statusviews.held

    def counted(read: JobRead, *args: Any) -> statusviews.Held:
        encoded.append(read.job_id)
        return held(read, *args)

    monkeypatch.setattr(statusviews, "held", counted)
    assert run_inline(InlineJobStore(kv, KEYS, "q999").create(make_spec(id="q999", nodes=("elsewhere",))))
    after = json.loads(asyncio.run(service.jobs.views_json()))
    assert {v["queue"]["of"] for v in after} == {13} and after == asyncio.run(service.jobs.views())
    assert encoded == ["q999"]  # the others' views are not made nor encoded again


def test_a_scan_reads_its_drain_record_again_only_after_news_of_a_drain(tmp_path: Path) -> None:
    """The drain record is watched: while the watch is armed, a scan reads it again only after
    news of ``drain/`` (or for the safety net, which trusts no news)."""
    kv = CountingKV()
    queue(kv, 3, nodes=("elsewhere",))
    m = manager(kv, tmp_path)
    mine = KEYS.drain("n1")

    async def run() -> None:
        watch = await watching(m.cluster)
        try:
            async with asyncio.timeout(10):
                await m.scan()
                kv.reset()
                await m.scan()
                assert mine not in kv.read
                news = m.cluster._drain_news
                await asyncio.to_thread(kv.put_json, KEYS.drain("n2"), {"any": "value"})
                while m.cluster._drain_news == news:
                    await asyncio.sleep(0.01)
                await m.scan()
                assert mine in kv.read
                kv.reset()
                await m.scan(quiet=True)
                assert mine in kv.read
        finally:
            watch.cancel()

    asyncio.run(run())

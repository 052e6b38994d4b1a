"""What a daemon's scan and ``status`` read and write with many jobs queued: never a job's full
spec (``specs/``), which only a node about to take part reads (and checks against the head);
no record decoded again while it is unchanged; no pending note written again while it holds."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.types import Compare, Found, KeyValue, Put, Query
from elasticd.jobs.view import job_row
from elasticd.manager.facts import NodeFacts
from elasticd.manager.jobmanager import JobManager
from elasticd.manager.jobsread import JobsRead
from elasticd.manager.service import CommandService
from elasticd.manager.wakes import CREATED_KINDS
from elasticd.rendezvous.snapshot import parse_jobs
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
    snaps = asyncio.run(m.jobwatch.snapshots())
    assert sorted(snaps) == jobs and all(s.head is not None and s.head.user for s in snaps.values())
    assert kv.read and not [k for k in kv.read if k.startswith(KEYS.specs())]


def test_unchanged_records_are_not_decoded_again(tmp_path: Path) -> None:
    kv = CountingKV()
    queue(kv, 30, nodes=("elsewhere",))
    m = manager(kv, tmp_path)
    asyncio.run(m.scan())
    first = m.jobwatch._jobs.records.decoded
    assert first >= 60  # every head and round, once
    asyncio.run(m.scan())
    asyncio.run(m.jobwatch.snapshots())
    assert m.jobwatch._jobs.records.decoded == first
    run_inline(InlineJobStore(kv, KEYS, "q007").finalize(JobState.KILLED, EndReason.KILLED, "by u"))
    run_inline(InlineJobStore(kv, KEYS, "q007").remove())
    asyncio.run(m.scan())
    assert (
        m.jobwatch._jobs.records.decoded == first and len(m.jobwatch._jobs.records) == 2 * 29
    )  # the removed job's are dropped


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
    snaps = asyncio.run(m.jobwatch.snapshots())
    for job, why in (
        (missing, "missing: the job has a head but no spec"),
        (rogue, "disagrees with the job's head"),
    ):
        final = snaps[job].final
        assert final is not None and final.state is JobState.FAILED and final.code is EndReason.INVALID_RECORD
        assert final.reason.startswith(f"invalid record at specs/{job}: ") and why in final.reason
    assert not m.agents and not m.admitter.allocator.held


def test_a_read_with_nothing_changed_is_one_small_request_and_the_same_objects(tmp_path: Path) -> None:
    kv = CountingKV()
    queue(kv, 30, nodes=("elsewhere",))
    m = manager(kv, tmp_path)
    first = asyncio.run(m.jobwatch.snapshots())
    assert m.jobwatch._jobs.full_reads == 1
    assert asyncio.run(m.jobwatch.snapshots()) is first and m.jobwatch._jobs.full_reads == 1
    run_inline(InlineJobStore(kv, KEYS, "q003").note_pending("n9", "n9 is busy", kv.grant_lease(30)))
    run_inline(InlineJobStore(kv, KEYS, "q004").finalize(JobState.KILLED, EndReason.KILLED, "by u"))
    again = asyncio.run(m.jobwatch.snapshots())  # keys created and changed: applied to the held read
    assert m.jobwatch._jobs.full_reads == 1 and again["q003"].pending == {"n9": "n9 is busy"}
    assert again["q004"].final is not None
    assert all(again[j] is first[j] for j in first if j not in ("q003", "q004"))
    kv.delete(KEYS.pending_note("q003", "n9"))  # a deletion: read again
    last = asyncio.run(m.jobwatch.snapshots())
    assert m.jobwatch._jobs.full_reads == 2 and not last["q003"].pending and last["q004"].final is not None
    assert asyncio.run(m.jobwatch.snapshots()) == asyncio.run(
        bare_manager(kv, KEYS, tmp_path).jobwatch.snapshots()
    )


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
def test_a_held_read_brought_up_to_date_is_what_a_full_read_gives(ops: list[tuple[str, str]]) -> None:
    kv = MemoryKV()
    lease = kv.grant_lease(3600)
    reader = JobsRead(kv, KEYS)

    async def check() -> None:
        for op, job in ops:
            await _apply(kv, lease, op, job)
            got = await reader.read()
            want = parse_jobs(KEYS, kv.get_prefix(KEYS.jobs()) + kv.get_prefix(KEYS.all_notes()))
            assert got == want, op

    asyncio.run(check())


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_a_read_that_trusts_the_watch_for_jobs_is_what_a_full_read_gives(ops: list[tuple[str, str]]) -> None:
    """With the news of ``jobs/`` counted (as the watch brings it), a read asks about ``parts/``
    alone while there is none, and is still what a full read gives."""
    kv = MemoryKV()
    lease = kv.grant_lease(3600)
    news = [0]
    seen = kv.watch_range(KEYS.jobs(), prefix_end(KEYS.jobs()), lambda k, d: news.__setitem__(0, news[0] + 1),
                          lambda: None)  # fmt: skip
    reader = JobsRead(kv, KEYS, changes=lambda: news[0])

    async def check() -> None:
        for op, job in ops:
            await _apply(kv, lease, op, job)
            got = await reader.read()  # (the memory KV tells its watches before a write returns)
            want = parse_jobs(KEYS, kv.get_prefix(KEYS.jobs()) + kv.get_prefix(KEYS.all_notes()))
            assert got == want, op
        last, probes, full = await reader.read(), reader.parts_probes, reader.full_reads
        assert await reader.read() is last and reader.parts_probes == probes + 1 and reader.full_reads == full

    try:
        asyncio.run(check())
    finally:
        seen()


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


def test_a_late_read_never_brings_back_an_older_value(tmp_path: Path) -> None:
    kv = SlowKV()
    queue(kv, 3, nodes=("elsewhere",))
    reader = JobsRead(kv, KEYS)
    lease = kv.grant_lease(30)
    store = InlineJobStore(kv, KEYS, "q001")

    async def race() -> None:
        await reader.read()
        run_inline(store.note_pending("n1", "old", lease))
        kv.hold.set()
        late = asyncio.ensure_future(reader.read())  # reads "old", returns later
        await asyncio.sleep(0.05)
        run_inline(store.note_pending("n1", "new", lease))
        newer = asyncio.ensure_future(reader.read())
        await asyncio.sleep(0.05)
        kv.release.set()
        await asyncio.gather(late, newer)
        assert (await reader.read())[0]["q001"].pending == {"n1": "new"}

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


def test_status_json_is_the_views_with_their_queue_places_and_reuses_unchanged_views(tmp_path: Path) -> None:
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
    held = {j: cached[2] for j, cached in service.jobs.status_views.held.items()}
    assert run_inline(InlineJobStore(kv, KEYS, "q999").create(make_spec(id="q999", nodes=("elsewhere",))))
    m.recent.invalidate()
    after = json.loads(asyncio.run(service.jobs.views_json()))
    assert {v["queue"]["of"] for v in after} == {13} and after == asyncio.run(service.jobs.views())
    assert all(
        service.jobs.status_views.held[j][2] is encoded for j, encoded in held.items()
    )  # not encoded again


def test_a_submit_waits_to_hear_of_every_key_create_writes_under_jobs_and_no_other() -> None:
    """``Created``: the news a submitter waits for (at most ``HEAR_S``) and does not count as a change."""
    kv = CountingKV()
    assert run_inline(InlineJobStore(kv, KEYS, "j").create(make_spec(id="j")))
    routed = [KEYS.route(k, False) for k in kv.written if k.startswith(KEYS.jobs())]
    assert {c.kind for c in routed if c is not None} == CREATED_KINDS and len(routed) == len(CREATED_KINDS)


def test_a_scan_reads_its_drain_record_again_only_after_news_of_a_drain(tmp_path: Path) -> None:
    """The drain record is watched: while the watch is armed, a scan reads it again only after
    news of ``drain/`` (or for the safety net, which trusts no news)."""
    kv = CountingKV()
    queue(kv, 3, nodes=("elsewhere",))
    m = manager(kv, tmp_path)
    mine = KEYS.drain("n1")

    async def run() -> None:
        watch = asyncio.ensure_future(m.jobwatch.watch())
        try:
            async with asyncio.timeout(10):
                while m.jobwatch._armed is None:
                    await asyncio.sleep(0.01)
                await m.scan()
                kv.reset()
                await m.scan()
                assert mine not in kv.read
                news = m.jobwatch._drain_news
                await asyncio.to_thread(kv.put_json, KEYS.drain("n2"), {"any": "value"})
                while m.jobwatch._drain_news == news:
                    await asyncio.sleep(0.01)
                await m.scan()
                assert mine in kv.read
                kv.reset()
                await m.scan(quiet=True)
                assert mine in kv.read
        finally:
            watch.cancel()

    asyncio.run(run())

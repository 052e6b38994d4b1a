"""The event history: which typed records become cluster events, their record, the bounded log in
a KV (MemoryKV; the integration tests use a real etcd), the recorder, and the records' bus."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd import log
from elasticd.decode import DecodeError
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.eventkeys import EventRing
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.happenings import bus
from elasticd.happenings.records import (
    Happening,
    JobFailed,
    JobJoining,
    JobSubmitted,
    LeaseLost,
    NodeDrained,
    RoundBumped,
    RoundComplete,
    WorkerFailed,
    WorkerHung,
)
from elasticd.history.model import MAX_FIELD_TEXT, ClusterEvent
from elasticd.history.recorder import EventRecorder
from elasticd.history.rings import Limits
from elasticd.history.select import EventKind, select
from elasticd.history.store import AppendConflict, EventLog
from elasticd.terms.state import EndReason, FailureKind, Fault, RoundReason

KEYS = Keys("/e/v1")
NOW = 1_700_000_000.0


def event(i: int = 0, job: str | None = "job-1", kind: str = "round") -> ClusterEvent:
    return ClusterEvent(NOW + i, kind, job, "n1", f"event {i}", {"round": i})


# -- select ---------------------------------------------------------------------------------------
def test_a_failed_job_carries_its_root_cause() -> None:
    got = select(
        JobFailed("job-1", EndReason.WORKER_FAILED, "no restarts left", 2, FailureKind.USER_CODE,
                  "rank 1 (local 1 on n2) failed with exit code 3"),
        "n1", NOW,
    )  # fmt: skip
    assert got is not None and got.kind == EventKind.FAILED and got.job == "job-1"
    assert got.node is None  # the job's end is the cluster's, not the writing node's
    assert got.fields["cause"] == "user_code" and "exit code 3" in got.fields["root_cause"]
    assert "root cause: rank 1" in got.message


def test_events_happen_on_the_logging_node_unless_they_name_one() -> None:
    hung = select(WorkerHung("j", 0, 3, "t.py:9 in f", 12.0), "n1", NOW)
    assert hung is not None and (hung.kind, hung.node, hung.fields["rank"]) == ("hang", "n1", 3)
    drain = select(NodeDrained("n7", None, None, "root", ("a", "b"), False), "n1", NOW)
    assert drain is not None and (drain.node, drain.job, drain.fields["jobs"]) == ("n7", None, "a,b")
    bump = select(RoundBumped("j", 1, RoundReason.WORKER_FAILED, True, 1, "x"), "n1", NOW)
    assert bump is not None and bump.kind == "restart" and bump.message.startswith("round 1 opened")


def test_events_with_odd_ids_are_not_recorded_and_long_fields_are_clipped() -> None:
    assert select(LeaseLost("../n1", 1, "expired"), "n1", NOW) is None  # not a node id
    assert select(JobSubmitted("../../etc", "u", (), "1"), "n1", NOW) is None  # not a job id
    got = select(WorkerFailed("j", "n1", 0, FailureKind.OOM, "x" * 5000), "n1", NOW)
    assert got is not None and len(got.fields["summary"]) == MAX_FIELD_TEXT and len(got.message) <= 500
    assert isinstance(got.fields["cause"], str)


def test_the_record_refuses_what_it_cannot_show() -> None:
    for bad in (
        {"time": -1, "kind": "round"},
        {"time": NOW, "kind": "Round!"},
        {"time": NOW, "kind": "round", "job": "a/b"},
        {"time": NOW, "kind": "round", "message": "two\nlines"},
        {"time": NOW, "kind": "round", "fields": {"nested": {"a": 1}}},
        {"time": NOW, "kind": "round", "fields": {"x": "y" * (MAX_FIELD_TEXT + 1)}},
        {"time": NOW, "kind": "round", "fields": {f"f{i}": i for i in range(17)}},
        {"time": NOW},
    ):
        with pytest.raises(DecodeError):
            ClusterEvent.from_json(bad)
    assert ClusterEvent.from_json(event(3).to_json() | {"newer": 1}) == event(3)  # unknown fields ignored


# -- the log in etcd ----------------------------------------------------------------------------
def test_keys_of_the_history_parse_and_route_to_no_job() -> None:
    assert KEYS.event(EventRing.CLUSTER, 12) == "/e/v1/events/cluster/0000000000000012"
    assert KEYS.event(EventRing.RECENT, 12, "j-1") == "/e/v1/events/recent/j-1/0000000000000012"
    assert KEYS.event(EventRing.OLDER, 12, "j-1") == "/e/v1/events/older/0000000000000012/j-1"
    for ring, job in ((EventRing.CLUSTER, None), (EventRing.RECENT, "j-1"), (EventRing.OLDER, "j-1")):
        assert KEYS.parse(KEYS.event(ring, 12, job)).kind is KeyKind.EVENT
        change = KEYS.route(KEYS.event(ring, 1, job), False)
        assert change is not None and change.job is None and change.kind is KeyKind.EVENT
    assert KEYS.parse(KEYS.event_seq()).kind is KeyKind.EVENT_SEQ
    for bad in ("/e/v1/events/cluster/12", "/e/v1/events/cluster/0000000000000000",
                "/e/v1/events/recent/j-1/000000000000001x", "/e/v1/events/recent/../0000000000000001",
                "/e/v1/events/0000000000000001", "/e/v1/events/older/0000000000000001",
                "/e/v1/events/older/j-1/0000000000000001"):  # fmt: skip
        with pytest.raises(DecodeError):
            KEYS.parse(bad)


def test_append_and_read_in_order_with_a_cursor() -> None:
    log_ = EventLog(MemoryKV(), KEYS)
    jobs = ["job-1", None, "job-2", "job-1", None]
    assert [log_.append(event(i, job)) for i, job in enumerate(jobs)] == [1, 2, 3, 4, 5]
    page = log_.read()
    assert [s.seq for s in page.events] == [1, 2, 3, 4, 5] and page.cursor == 5 and not page.skipped
    assert page.events[2].event == event(2, "job-2")
    later = log_.read(after=3)
    assert [s.seq for s in later.events] == [4, 5] and later.cursor == 5
    assert log_.read(after=5).events == [] and log_.read(after=5).cursor == 5
    assert [s.seq for s in log_.read(limit=2).events] == [4, 5]
    assert [s.seq for s in log_.read(job="job-1").events] == [1, 4]
    assert [s.seq for s in log_.read(after=1, job="job-1").events] == [4]
    assert log_.read(job="job-2").cursor == 5  # what follows is read from the counter on


def test_a_jobs_events_beyond_its_recent_ones_move_to_the_older_ring() -> None:
    kv = MemoryKV()
    log_ = EventLog(kv, KEYS, Limits(recent=2, total=5, cluster=3))
    for i in range(7):
        log_.append(event(i, "job-1"))
    assert [kv_.key for kv_ in kv.get_prefix(KEYS.events())] == [
        KEYS.event(EventRing.OLDER, n, "job-1") for n in (3, 4, 5)
    ] + [KEYS.event(EventRing.RECENT, n, "job-1") for n in (6, 7)]
    assert [s.seq for s in log_.read(job="job-1").events] == [3, 4, 5, 6, 7]
    log_.append(event(8, "job-2"))
    assert [s.seq for s in log_.read(job="job-1").events] == [4, 5, 6, 7]  # its oldest older one went
    for i in range(5):
        log_.append(event(i, None))
    assert [s.seq for s in log_.read().events] == [4, 5, 6, 7, 8, 11, 12, 13]  # 3 events of no job


def test_a_flood_of_other_jobs_events_removes_the_surplus_first_then_the_least_recent() -> None:
    kv = MemoryKV()
    log_ = EventLog(kv, KEYS, Limits(recent=2, total=10, cluster=5))
    for i in range(5):
        log_.append(event(i, "victim", "failed" if i == 4 else "round"))
    for i in range(40):  # 4 jobs of 10 events each: 4 times what the history holds
        log_.append(event(i, f"flood-{i % 4}"))
    victim = log_.read(job="victim").events
    assert [s.event.kind for s in victim] == ["round", "failed"]  # its last 2 (its older ones went first)
    assert len(kv.get_prefix(KEYS.events())) == 10
    for i in range(6):  # past total / recent jobs: the least recently active job's go
        log_.append(event(i, f"more-{i}"))
    assert log_.read(job="victim").events == []
    assert len(kv.get_prefix(KEYS.events())) == 10


def test_removing_a_job_drops_its_events_and_its_removal_is_kept_with_the_clusters() -> None:
    kv = MemoryKV()
    log_ = EventLog(kv, KEYS, Limits(recent=1, total=10, cluster=5))
    for i in range(3):
        log_.append(event(i, "job-1"))
    log_.drop_jobs({"job-1"})
    assert kv.get_prefix(KEYS.events()) == []
    log_.append(event(9, "job-1", kind=EventKind.REMOVED))
    assert [kv_.key for kv_ in kv.get_prefix(KEYS.events())] == [KEYS.event(EventRing.CLUSTER, 4)]
    assert [s.event.kind for s in log_.read().events] == ["removed"]
    assert [s.event.kind for s in log_.read(job="job-1").events] == ["removed"]
    assert log_.read(job="job-2").events == []


def test_a_malformed_event_is_skipped_with_its_reason() -> None:
    kv = MemoryKV()
    log_ = EventLog(kv, KEYS)
    log_.append(event(1))
    kv.put_json(KEYS.event(EventRing.RECENT, 2, "job-1"), {"time": "yesterday", "kind": "round"})
    kv.put_json(KEYS.event_seq(), 2)
    log_.append(event(3))
    kv.put_json(KEYS.event(EventRing.RECENT, 4, "job-2"), event(4, "job-1").to_json())  # another job's
    kv.put_json(KEYS.events() + "junk", {"time": NOW, "kind": "round"})
    page = log_.read()
    assert [s.seq for s in page.events] == [1, 3]
    assert [s.key for s in page.skipped] == [
        "events/junk",
        "events/recent/job-1/0000000000000002",
        "events/recent/job-2/0000000000000004",
    ]
    assert "event key" in page.skipped[0].why and "time" in page.skipped[1].why
    assert "job" in page.skipped[2].why
    assert page.cursor == 4


def test_an_unreadable_counter_stops_appends_with_a_reason() -> None:
    kv = MemoryKV()
    kv.put_json(KEYS.event_seq(), "many")
    with pytest.raises(DecodeError, match="event_seq"):
        EventLog(kv, KEYS).append(event())


def test_concurrent_appenders_each_get_their_own_sequence_number() -> None:
    kv = MemoryKV()
    a, b = EventLog(kv, KEYS), EventLog(kv, KEYS)
    seqs = [x.append(event(i)) for i in range(5) for x in (a, b)]
    assert seqs == list(range(1, 11))


def test_appenders_on_threads_lose_no_event_and_keep_the_bounds() -> None:
    """Appenders racing on threads: each append that returns got its own number, the bounds
    hold, and every job keeps its last events (fewer jobs than ``total / recent``)."""
    kv = MemoryKV()
    limits = Limits(recent=2, total=30, cluster=5)
    logs = [EventLog(kv, KEYS, limits) for _ in range(4)]
    appended: list[tuple[int, str]] = []
    lock = threading.Lock()

    def run(w: int) -> None:
        for i in range(25):
            job = f"job-{(w * 25 + i) % 10}"
            for _ in range(20):  # an AppendConflict after 8 lost races: try again, as a test may
                try:
                    seq = logs[w].append(event(i, job))
                    break
                except AppendConflict:
                    continue
            with lock:
                appended.append((seq, job))

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    seqs = sorted(s for s, _ in appended)
    assert seqs == list(range(1, 101))
    kept = {s.seq for s in logs[0].read().events}
    assert len(kept) <= 30
    for job in {j for _, j in appended}:
        last = sorted(s for s, j in appended if j == job)[-2:]
        assert set(last) <= kept, job


@settings(max_examples=60, deadline=None)
@given(
    appends=st.lists(st.one_of(st.none(), st.integers(0, 7)), min_size=1, max_size=120),
    recent=st.integers(1, 3),
)
def test_no_flood_removes_a_jobs_last_events_and_the_size_stays_bounded(
    appends: list[int | None], recent: int
) -> None:
    """Any sequence of appends from 8 jobs and none: at most ``total`` job events and ``cluster``
    others; every job keeps its last ``recent`` events (8 jobs * recent <= total), and the events
    kept are the newest of each job (what goes is a job's oldest)."""
    limits = Limits(recent=recent, total=8 * recent + 4, cluster=3)
    kv = MemoryKV()
    log_ = EventLog(kv, KEYS, limits)
    sent: list[tuple[int, str | None]] = []
    for i, j in enumerate(appends):
        job = None if j is None else f"job-{j}"
        sent.append((log_.append(event(i, job)), job))
    page = log_.read()
    kept = {s.seq for s in page.events}
    assert not page.skipped
    assert sum(1 for s in page.events if s.event.job is None) <= limits.cluster
    assert sum(1 for s in page.events if s.event.job is not None) <= limits.total
    for job in {j for _, j in sent if j is not None}:
        mine = sorted(s for s, j in sent if j == job)
        assert set(mine[-recent:]) <= kept, job
        held = [s for s in mine if s in kept]
        assert held == mine[len(mine) - len(held) :], job  # a suffix: its newest
        assert [s.seq for s in log_.read(job=job).events] == held
    others = sorted(s for s, j in sent if j is None)
    assert set(others[-limits.cluster :]) <= kept


# -- the recorder ---------------------------------------------------------------------------------
class FlakyLog:
    """An EventLog whose first ``down`` appends find etcd unreachable."""

    def __init__(self, down: int = 0) -> None:
        self.down = down
        self.appended: list[ClusterEvent] = []

    def append(self, ev: ClusterEvent) -> int:
        if self.down:
            self.down -= 1
            raise EtcdUnavailable("down")
        self.appended.append(ev)
        return len(self.appended)


def test_the_recorder_selects_queues_retries_and_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("elasticd.history.recorder.RETRY_S", 0.01)

    async def run() -> FlakyLog:
        store = FlakyLog(down=2)
        rec = EventRecorder(store, "n1", clock=lambda: NOW)  # type: ignore[arg-type]
        rec.start()
        rec.offer(JobSubmitted("../j", "u", (), "1"))  # not a cluster event: no valid job id
        rec.offer(JobSubmitted("j-1", "u", ("train.py",), "1"))
        await asyncio.to_thread(rec.offer, JobJoining("j-1", "n1", ""))  # another thread
        await rec.close(flush_s=5)
        return store

    store = asyncio.run(run())
    assert [(e.kind, e.job, e.node) for e in store.appended] == [
        ("submitted", "j-1", "n1"),
        ("joined", "j-1", "n1"),
    ]


# -- the bus ----------------------------------------------------------------------------------------
def test_the_bus_hands_records_to_subscribers_whatever_the_level(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Happening] = []

    def bad(h: Happening) -> None:
        raise RuntimeError("a broken subscriber")

    monkeypatch.setattr(bus, "_log", log.get("elasticd.happenings"))  # not one cached for another stderr
    log.configure("json", "warning")
    undo = [bus.subscribe(bad), bus.subscribe(seen.append)]
    try:
        bus.publish(RoundComplete("j", 1, 1, ("n1",), "", None, None))  # below the level: not printed
        bus.publish(WorkerFailed("j", "n1", 1, FailureKind.OOM, "killed"))
    finally:
        for u in undo:
            u()
        structlog.reset_defaults()
    assert [h.EVENT for h in seen] == ["round.complete", "worker.failed"]
    assert isinstance(seen[0], RoundComplete) and seen[0].round == 1
    printed = [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines()]
    assert "round.complete" not in printed and "worker.failed" in printed
    assert printed.count("log.subscriber_failed") == 2  # reported, and the others still ran


def test_gpu_records_are_events_and_counted() -> None:
    from elasticd.happenings.records import GpuReturned, GpuUnhealthy

    bad = select(
        GpuUnhealthy("n1", "GPU-1", Fault.ECC, "uncorrectable ECC errors: 1 (was 0)", "job-a"), "n1", NOW
    )
    assert bad is not None and bad.kind == "gpu_unhealthy" and bad.job == "job-a" and bad.node == "n1"
    assert "GPU-1 unhealthy" in bad.message
    back = select(GpuReturned("n2", "GPU-1", "root"), "n1", NOW)
    assert back is not None and back.kind == "gpu_returned" and back.node == "n2"

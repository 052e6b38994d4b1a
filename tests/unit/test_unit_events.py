"""The event history: which log events become cluster events, their record, the bounded log in a
KV (MemoryKV; the integration tests use a real etcd), the recorder, and the log's event bus."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest
import structlog

from elasticd import log
from elasticd.decode import DecodeError
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import KeyKind, Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.events.model import MAX_FIELD_TEXT, ClusterEvent
from elasticd.events.recorder import EventRecorder
from elasticd.events.select import EventKind, select
from elasticd.events.store import EventLog

KEYS = Keys("/e/v1")
NOW = 1_700_000_000.0


def event(i: int = 0, job: str | None = "job-1", kind: str = "round") -> ClusterEvent:
    return ClusterEvent(NOW + i, kind, job, "n1", f"event {i}", {"round": i})


# -- select ---------------------------------------------------------------------------------------
def test_a_failed_job_carries_its_root_cause() -> None:
    got = select(
        "job.failed",
        {"job": "job-1", "code": "worker_failed", "reason": "no restarts left", "round": 2,
         "cause": "user_code", "root_cause": "rank 1 (local 1 on n2) failed with exit code 3"},
        "n1", NOW,
    )  # fmt: skip
    assert got is not None and got.kind == EventKind.FAILED and got.job == "job-1"
    assert got.node is None  # the job's end is the cluster's, not the writing node's
    assert got.fields["cause"] == "user_code" and "exit code 3" in got.fields["root_cause"]
    assert "root cause: rank 1" in got.message


def test_events_happen_on_the_logging_node_unless_they_name_one() -> None:
    hung = select("worker.hung", {"job": "j", "rank": 3, "frame": "t.py:9 in f", "silent_s": 12.0}, "n1", NOW)
    assert hung is not None and (hung.kind, hung.node, hung.fields["rank"]) == ("hang", "n1", 3)
    drain = select("node.drain", {"node": "n7", "job": None, "by": "root", "jobs": ["a", "b"]}, "n1", NOW)
    assert drain is not None and (drain.node, drain.job, drain.fields["jobs"]) == ("n7", None, "a,b")
    bump = select(
        "round.bumped", {"job": "j", "round": 1, "reason": "worker_failed", "detail": "x"}, "n1", NOW
    )
    assert bump is not None and bump.kind == "restart" and bump.message.startswith("round 1 opened")


def test_other_log_events_are_not_recorded_and_odd_fields_are_dropped_or_clipped() -> None:
    assert select("lease.granted", {"node": "n1"}, "n1", NOW) is None
    assert select("job.submitted", {"job": "../../etc", "user": "u"}, "n1", NOW) is None  # not a job id
    got = select("worker.failed", {"job": "j", "summary": "x" * 5000, "cause": object()}, "n1", NOW)
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
    assert KEYS.event(12) == "/e/v1/events/0000000000000012"
    assert KEYS.parse(KEYS.event(12)).kind is KeyKind.EVENT
    assert KEYS.parse(KEYS.event_seq()).kind is KeyKind.EVENT_SEQ
    for bad in ("/e/v1/events/12", "/e/v1/events/0000000000000000", "/e/v1/events/000000000000001x"):
        with pytest.raises(DecodeError):
            KEYS.parse(bad)
    change = KEYS.route(KEYS.event(1), False)
    assert change is not None and change.job is None and change.kind is KeyKind.EVENT


def test_append_and_read_in_order_with_a_cursor() -> None:
    log_ = EventLog(MemoryKV(), KEYS)
    assert [log_.append(event(i)) for i in range(5)] == [1, 2, 3, 4, 5]
    page = log_.read()
    assert [s.seq for s in page.events] == [1, 2, 3, 4, 5] and page.cursor == 5 and not page.skipped
    assert page.events[2].event == event(2)
    later = log_.read(after=3)
    assert [s.seq for s in later.events] == [4, 5] and later.cursor == 5
    assert log_.read(after=5).events == [] and log_.read(after=5).cursor == 5
    assert [s.seq for s in log_.read(limit=2).events] == [4, 5]


def test_the_size_is_bounded_the_oldest_go_first() -> None:
    kv = MemoryKV()
    log_ = EventLog(kv, KEYS, keep=10)
    for i in range(25):
        log_.append(event(i))
    stored = kv.get_prefix(KEYS.events())
    assert len(stored) == 10
    assert [s.seq for s in log_.read().events] == list(range(16, 26))


def test_a_malformed_event_is_skipped_with_its_reason() -> None:
    kv = MemoryKV()
    log_ = EventLog(kv, KEYS)
    log_.append(event(1))
    kv.put_json(KEYS.event(2), {"time": "yesterday", "kind": "round"})
    kv.put_json(KEYS.event_seq(), 2)
    log_.append(event(3))
    kv.put_json(KEYS.events() + "junk", {"time": NOW, "kind": "round"})
    page = log_.read()
    assert [s.seq for s in page.events] == [1, 3]
    assert [s.key for s in page.skipped] == ["events/0000000000000002", "events/junk"]
    assert "time" in page.skipped[0].why and "sequence" in page.skipped[1].why
    assert page.cursor == 3


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
    monkeypatch.setattr("elasticd.events.recorder.RETRY_S", 0.01)

    async def run() -> FlakyLog:
        store = FlakyLog(down=2)
        rec = EventRecorder(store, "n1", clock=lambda: NOW)  # type: ignore[arg-type]
        rec.start()
        rec.offer("lease.granted", {"node": "n1"})  # not a cluster event
        rec.offer("job.submitted", {"job": "j-1", "user": "u", "nnodes": "1"})
        await asyncio.to_thread(rec.offer, "job.joining", {"job": "j-1", "node": "n1"})  # another thread
        await rec.close(flush_s=5)
        return store

    store = asyncio.run(run())
    assert [(e.kind, e.job, e.node) for e in store.appended] == [
        ("submitted", "j-1", "n1"),
        ("joined", "j-1", "n1"),
    ]


# -- the bus ----------------------------------------------------------------------------------------
def test_the_log_hands_events_to_subscribers_whatever_the_level(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def good(name: str, fields: Mapping[str, Any]) -> None:
        seen.append((name, dict(fields)))

    def bad(name: str, fields: Mapping[str, Any]) -> None:
        raise RuntimeError("a broken subscriber")

    log.configure("json", "warning")
    undo = [log.subscribe(bad), log.subscribe(good)]
    try:
        logger = log.get("test")
        logger.info("round.complete", job="j", round=1)  # below the level: not printed, but published
        logger.warning("worker.failed", job="j")
        logger.debug("worker.started", job="j")  # below info: not published
    finally:
        for u in undo:
            u()
        structlog.reset_defaults()
    assert [name for name, _ in seen] == ["round.complete", "worker.failed"]
    assert seen[0][1]["round"] == 1
    printed = [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines()]
    assert "round.complete" not in printed and "worker.failed" in printed
    assert printed.count("log.subscriber_failed") == 2  # reported, and the others still ran

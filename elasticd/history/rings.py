"""Which keys one append to the event history writes and deletes: pure (no I/O).

The history is three rings (``Keys.event``), all numbered by one cluster-wide sequence:

- ``events/recent/<job>/<seq>``: each job's newest ``recent`` events (a per-job cap);
- ``events/older/<seq>/<job>``: every job's events before those, oldest first in key order;
- ``events/cluster/<seq>``: events of no job (nodes up and down, drains, a job's removal), the
  last ``cluster``.

An append puts the event in its job's recent ring; when that ring is full, the job's oldest
recent event moves to the older ring. When the jobs' events number more than ``total``, the
oldest *older* event goes: only a job holding more than its ``recent`` events loses one, so the
jobs holding the most give first. Only when no job holds more does a recent event go, the oldest
(the least recently active job's). So a flood of events from many jobs never removes another
job's last ``recent`` events while fewer than ``total / recent`` jobs have events (a job's events
go with the job: ``EventLog.drop_jobs``), and the size is bounded: ``total + cluster`` events of
at most ``MAX_VALUE_BYTES`` each.

Every count and key comes from the one read before the transaction, and each is cheap for etcd:
count-only ranges, and first-key ranges (a limit of one in key order, which etcd answers without
a sort). Only the rare fallback (no older event left, the history full) asks for the oldest recent
event, a sort by creation over that ring, in a second read. The transaction compares the
counter's revision, so concurrent appenders serialise: the loser reads again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticd.decode import DecodeError, parse_json
from elasticd.etcd.eventkeys import EventRing, event_seq
from elasticd.etcd.keys import Keys
from elasticd.etcd.types import KeyValue


@dataclass(frozen=True)
class Limits:
    recent: int = 3  # a job's newest events: what a flood of other jobs' events cannot remove
    total: int = 5000  # every job's events
    cluster: int = 1000  # events of no job

    def __post_init__(self) -> None:
        if not 1 <= self.recent <= self.total or self.cluster < 1:
            raise ValueError("limits must satisfy 1 <= recent <= total, and cluster >= 1")


@dataclass(frozen=True)
class Ring:
    """What the read said of one range: how many keys, and its first (or oldest) one."""

    count: int = 0
    first: KeyValue | None = None


@dataclass(frozen=True)
class Seen:
    """The read before an append. For an event of no job, ``own`` is the cluster ring and the
    other rings are not read. ``recent.first`` is read only when ``needs_oldest_recent`` says."""

    own: Ring  # the job's recent ring (or the cluster ring), with its oldest event
    recent: Ring = Ring()  # every job's recent events (counted; the oldest when asked for)
    older: Ring = Ring()  # every job's older events, with the oldest


@dataclass(frozen=True)
class Plan:
    puts: list[tuple[str, Any]]  # (key, value to write JSON-encoded)
    deletes: list[str]


def needs_oldest_recent(limits: Limits, seen: Seen) -> bool:
    """Whether this append must remove a recent event: the history is full and no job holds more
    than its recent events, and the appender's own move does not make room."""
    full = seen.recent.count + seen.older.count + 1 > limits.total
    return full and seen.older.count == 0 and seen.own.count < limits.recent


def plan(keys: Keys, limits: Limits, seen: Seen, seq: int, event: dict[str, Any], job: str | None) -> Plan:
    """The puts and deletes (besides the counter's) that append ``event`` as number ``seq``."""
    if job is None:
        gone = [seen.own.first.key] if seen.own.count >= limits.cluster and seen.own.first else []
        return Plan([(keys.event(EventRing.CLUSTER, seq), event)], gone)
    puts: list[tuple[str, Any]] = [(keys.event(EventRing.RECENT, seq, job), event)]
    deletes: list[str] = []
    moved: tuple[str, Any] | None = None
    moving = seen.own.first if seen.own.count >= limits.recent else None
    if moving is not None:  # the job's recent ring is full: its oldest leaves it
        deletes.append(moving.key)
        moved = _moved(keys, moving, job)
    grows = moving is None or moved is not None  # the jobs' events number one more after this
    if grows and seen.recent.count + seen.older.count + 1 > limits.total:
        if seen.older.first is not None:  # a job holding more than its recent events gives one
            deletes.append(seen.older.first.key)
        elif moved is not None:
            moved = None  # the one leaving its job's recent ring is the only older event: it goes
        elif seen.recent.first is not None:  # no job holds more: the least recently active gives
            deletes.append(seen.recent.first.key)
    if moved is not None:
        puts.append(moved)
    return Plan(puts, list(dict.fromkeys(deletes)))


def _moved(keys: Keys, kv: KeyValue, job: str) -> tuple[str, Any] | None:
    """The recent event ``kv`` at its place in the older ring; None if it does not read (it goes)."""
    try:
        return keys.event(EventRing.OLDER, event_seq(kv.key.rsplit("/", 1)[-1]), job), parse_json(kv.value)
    except DecodeError:
        return None

"""Which keys one append to the event history writes and deletes: pure (no I/O).

The history is three rings (``Keys.event``), all numbered by one cluster-wide sequence:

- ``events/cluster/<seq>``: events of no job (nodes up and down, drains), the last ``cluster``;
- ``events/recent/<job>/<seq>``: each job's newest ``recent`` events;
- ``events/older/<job>/<seq>``: each job's events before those, at most ``per_job - recent``.

An append puts the event in its job's recent ring; when that ring is full, the job's oldest
recent event moves to its older ring (whose own oldest goes, when that ring is full). When the
jobs' events number more than ``total``, the oldest *older* event of any job goes first: only a
job that holds more than its ``recent`` events loses one. Only when no job holds more does the
oldest recent event go (the least recently active job's). So a flood of events from many jobs
never removes another job's last ``recent`` events while fewer than ``total / recent`` jobs
have events (jobs' events go with the job: ``EventLog.drop_job``), and the size is bounded:
``total + cluster`` events of at most ``MAX_VALUE_BYTES`` each.

Every count and oldest key comes from the one read before the transaction (count-only and
oldest-only ranges: no key is listed), and the transaction compares the counter's revision, so
concurrent appenders serialise as before: the loser reads again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticd.decode import DecodeError, parse_json
from elasticd.etcd.keys import EventRing, Keys, event_seq
from elasticd.etcd.types import KeyValue


@dataclass(frozen=True)
class Limits:
    recent: int = 3  # a job's newest events: what a flood of other jobs' events cannot remove
    per_job: int = 12  # a job's events in all, recent and older
    total: int = 5000  # every job's events
    cluster: int = 1000  # events of no job

    def __post_init__(self) -> None:
        if not 1 <= self.recent <= self.per_job <= self.total or self.cluster < 1:
            raise ValueError("limits must satisfy 1 <= recent <= per_job <= total, and cluster >= 1")


@dataclass(frozen=True)
class Ring:
    """What the read said of one range: how many keys, and the one created first."""

    count: int = 0
    oldest: KeyValue | None = None


@dataclass(frozen=True)
class Seen:
    """The read before an append. For an event of no job, ``own`` is the cluster ring and the
    other rings are not read."""

    own: Ring  # the job's recent ring (or the cluster ring)
    own_older: Ring = Ring()  # the job's older ring
    recent: Ring = Ring()  # every job's recent events
    older: Ring = Ring()  # every job's older events


@dataclass(frozen=True)
class Plan:
    puts: list[tuple[str, Any]]  # (key, value to write JSON-encoded)
    deletes: list[str]


def plan(keys: Keys, limits: Limits, seen: Seen, seq: int, event: dict[str, Any], job: str | None) -> Plan:
    """The puts and deletes (besides the counter's) that append ``event`` as number ``seq``."""
    if job is None:
        gone = [seen.own.oldest.key] if seen.own.count >= limits.cluster and seen.own.oldest else []
        return Plan([(keys.event(EventRing.CLUSTER, seq), event)], gone)
    puts: list[tuple[str, Any]] = [(keys.event(EventRing.RECENT, seq, job), event)]
    deletes: list[str] = []
    moved: tuple[str, Any] | None = None
    grows = True  # whether the jobs' events number one more after this append
    moving = seen.own.oldest if seen.own.count >= limits.recent else None
    if moving is not None:  # the job's recent ring is full: its oldest leaves it
        deletes.append(moving.key)
        moved = _moved(keys, moving, job) if limits.per_job > limits.recent else None
        if moved is None:
            grows = False  # it goes (the job keeps no older events, or it does not read)
        elif seen.own_older.count >= limits.per_job - limits.recent and seen.own_older.oldest:
            deletes.append(seen.own_older.oldest.key)  # the job's cap: its oldest event goes
            grows = False
    if grows and seen.recent.count + seen.older.count + 1 > limits.total:
        if seen.older.oldest is not None:  # a job holding more than its recent events gives one
            deletes.append(seen.older.oldest.key)
        elif moved is not None:
            moved = None  # the one leaving the job's recent ring is the only surplus: it goes
        elif seen.recent.oldest is not None:  # no job holds more: the least recently active gives
            deletes.append(seen.recent.oldest.key)
    if moved is not None:
        puts.append(moved)
    return Plan(puts, list(dict.fromkeys(deletes)))


def _moved(keys: Keys, kv: KeyValue, job: str) -> tuple[str, Any] | None:
    """The recent event ``kv`` at its place in the job's older ring; None if it does not read."""
    try:
        return keys.event(EventRing.OLDER, event_seq(kv.key.rsplit("/", 1)[-1]), job), parse_json(kv.value)
    except DecodeError:
        return None

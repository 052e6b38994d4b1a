"""The event history's part of the key layout (``elasticd.etcd.keys``): build its keys, parse them.

Three rings under ``history/`` (``elasticd.history.rings``) and the ``event_seq`` counter beside
them. An event's key carries its sequence number zero-padded to ``EVENT_SEQ_DIGITS``, so key order
is sequence order and the first key of a ring is its oldest. Parsing is strict, as ``Keys.parse``
is: a key that is not one of these raises ``DecodeError`` naming the part. Pure: no etcd client.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from elasticd.decode import DecodeError
from elasticd.terms.ids import valid_job_id

EVENT_SEQ_DIGITS = 16  # an event's <seq> zero-padded, so that key order is sequence order


class EventRing(StrEnum):
    """The event history's rings (``elasticd.history.rings``): events of no job; each job's newest
    events; every job's older events, the first to go when the history is full."""

    CLUSTER = "cluster"
    RECENT = "recent"
    OLDER = "older"


class EventKey(NamedTuple):
    """What an event's key names: its ring, its sequence number, and its job (None: the cluster
    ring's events are of no job, or of a job removed). A tuple: a read parses every key."""

    ring: EventRing
    seq: int
    job: str | None


def events(prefix: str) -> str:
    """The whole event history (``elasticd.history.store``): three rings, below."""
    return f"{prefix}/events/"


def event_ring(prefix: str, ring: EventRing, job_id: str | None = None) -> str:
    """A ring's prefix; with ``job_id``, that job's recent events."""
    base = f"{prefix}/events/{ring.value}/"
    return base if job_id is None else f"{base}{job_id}/"


def event(prefix: str, ring: EventRing, seq: int, job_id: str | None = None) -> str:
    """An event's key: ``events/cluster/<seq>``, ``events/recent/<job>/<seq>`` or
    ``events/older/<seq>/<job>`` (the older ring in sequence order across jobs: its first key is
    the oldest of every job's)."""
    number = f"{seq:0{EVENT_SEQ_DIGITS}d}"
    if ring is EventRing.OLDER:
        return f"{prefix}/events/older/{number}/{job_id}"
    return f"{event_ring(prefix, ring, job_id)}{number}"


def event_counter(prefix: str) -> str:
    """``event_seq``: the last event's sequence number."""
    return f"{prefix}/event_seq"


def parse_event(key: str) -> EventKey:
    """What the event key ``key`` (relative to the prefix: ``events/...``) names; DecodeError if
    it is none."""
    match key.split("/"):
        case ["events", "cluster", seq]:
            return EventKey(EventRing.CLUSTER, event_seq(seq), None)
        case ["events", "recent", job, seq]:
            return EventKey(EventRing.RECENT, event_seq(seq), _job(job))
        case ["events", "older", seq, job]:
            return EventKey(EventRing.OLDER, event_seq(seq), _job(job))
        case _:
            raise DecodeError("", "is no event key: events/cluster|recent/<job>|older/<seq>...")


def older_job(key: str) -> str | None:
    """The job a key of the older ring (``[<prefix>/]events/older/<seq>/<job>``) names, unchecked;
    None for a key of another ring. Cheap: a reader of one job's events passes every other job's
    older events by without parsing them (the older ring holds every job's)."""
    head, _, tail = key.rpartition("/")
    return tail if head.rsplit("/", 2)[-2:-1] == ["older"] else None


def seq_named(key: str) -> int:
    """The sequence number an event key that does not parse names, as far as one reads (0: none):
    a reader's cursor moves past it."""
    for part in reversed(key.rsplit("/", 2)[1:]):  # <seq> last, or before the job (older ring)
        try:
            return event_seq(part)
        except DecodeError:
            continue
    return 0


def event_seq(text: str) -> int:
    """An event's sequence number in its key: exactly ``EVENT_SEQ_DIGITS`` decimal digits, > 0."""
    if len(text) == EVENT_SEQ_DIGITS and text.isascii() and text.isdigit() and (number := int(text)):
        return number
    raise DecodeError("", f"{text[:20]!r} in the key is not an event sequence number")


def _job(text: str) -> str:
    if not valid_job_id(text):
        raise DecodeError("", "the job id in the key is not a valid job id")
    return text

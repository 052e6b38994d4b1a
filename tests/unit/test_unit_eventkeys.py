"""The event history's keys: every key built parses back to what built it; nothing else parses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.decode import DecodeError
from elasticd.etcd import eventkeys
from elasticd.etcd.eventkeys import EVENT_SEQ_DIGITS, EventKey, EventRing, older_job, parse_event, seq_named
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys

KEYS = Keys("/e/v1")
JOBS = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
SEQS = st.integers(1, 10**EVENT_SEQ_DIGITS - 1)


@given(st.sampled_from(EventRing), SEQS, JOBS)
def test_every_event_key_parses_back_to_what_built_it(ring: EventRing, seq: int, job: str) -> None:
    named = None if ring is EventRing.CLUSTER else job
    key = KEYS.relative(KEYS.event(ring, seq, named))
    assert parse_event(key) == EventKey(ring, seq, named)
    assert KEYS.parse(KEYS.event(ring, seq, named)).kind is KeyKind.EVENT
    assert seq_named(key) == seq
    assert older_job(key) == (job if ring is EventRing.OLDER else None)


@given(SEQS, SEQS)
def test_key_order_is_sequence_order(a: int, b: int) -> None:
    first, second = (eventkeys.event("/p", EventRing.OLDER, s, "j") for s in (a, b))
    assert (first < second) == (a < b)


@pytest.mark.parametrize(
    ("key", "part"),
    [
        ("events/cluster/12", "sequence number"),  # not zero-padded
        ("events/cluster/0000000000000000", "sequence number"),  # no event is 0
        ("events/cluster/000000000000001x", "sequence number"),
        ("events/recent/j-1/00000000000000012", "sequence number"),  # one digit too many
        ("events/recent/Not_A_Job!/0000000000000012", "job id"),
        ("events/older/0000000000000012/bad/job", "event key"),
        ("events/older/j-1/0000000000000012", "sequence number"),  # the older ring: <seq>/<job>
        ("events/junk", "event key"),
        ("events/cluster", "event key"),
        ("event_seq", "event key"),
    ],
)
def test_a_key_that_is_no_event_key_is_refused_naming_the_part(key: str, part: str) -> None:
    with pytest.raises(DecodeError, match=part):
        parse_event(key)
    if key.startswith("events/"):
        with pytest.raises(DecodeError):
            KEYS.parse(f"/e/v1/{key}")


def test_a_bad_key_names_what_it_can_so_a_reader_moves_past_it() -> None:
    assert seq_named("events/junk") == 0 and older_job("events/junk") is None
    assert seq_named("events/recent/Bad!/0000000000000007") == 7
    assert older_job("events/recent/Bad!/0000000000000007") is None
    assert seq_named("events/older/0000000000000007/Bad!") == 7
    assert older_job("events/older/0000000000000007/Bad!") == "Bad!"
    assert (seq_named("events/older/xx/j-2"), older_job("events/older/xx/j-2")) == (0, "j-2")


def test_the_counter_is_beside_the_rings() -> None:
    assert KEYS.event_seq() == "/e/v1/event_seq" and not KEYS.event_seq().startswith(KEYS.events())
    assert KEYS.parse(KEYS.event_seq()).kind is KeyKind.EVENT_SEQ

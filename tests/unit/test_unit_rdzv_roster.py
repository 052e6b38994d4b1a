"""A closed round as stored: its head, one assignment per member, and the leader's batches.

Whatever the round's size (up to 100,000 nodes), every value stays under ``RECORD_BOUND``, every
transaction within etcd's limits, and the head and assignments give back the round exactly."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.decode import DecodeError
from elasticd.rendezvous import roster
from elasticd.rendezvous.decider import build_result, ring_neighbours
from elasticd.rendezvous.model import Assignment, Join, Member, RoundHead
from elasticd.terms.ids import MAX_ROUND
from elasticd.terms.spec import MAX_NODES, MAX_NPROC_PER_NODE

LONG_NODE = "n" * 55  # node ids are at most 63 characters; the widest values make the worst case
LONG_ADDRESS = "h" * 255
ETCD_MAX_TXN_OPS = 128
ETCD_MAX_REQUEST_BYTES = 1536 * 1024


def joins(n: int, wide: bool) -> list[Join]:
    node = LONG_NODE if wide else "n"
    address = LONG_ADDRESS if wide else "10.0.0.1"
    lws = MAX_NPROC_PER_NODE if wide else 8
    return [Join(f"{node}{i}", address, 65535, lws, i + 1, liveness_port=65535) for i in range(n)]


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 2000) | st.sampled_from([1, 2, 3, 120, 121, 241]), wide=st.booleans())
def test_any_round_stays_within_the_bounds_and_names_every_rank_once(n: int, wide: bool) -> None:
    check_round(n, wide)


def test_a_round_of_max_nodes_of_the_widest_members_stays_within_the_bounds() -> None:
    """At 100,000 nodes, each with the longest id and address and the most local ranks, the
    largest numbers a record holds: the last member's assignment and the head stay under the
    bound, and the leader's batches of such records within etcd's limits."""
    n, lws = MAX_NODES, MAX_NPROC_PER_NODE
    last = [Member(f"{LONG_NODE}{i}", LONG_ADDRESS, i, i * lws, lws, 65535) for i in (n - 2, n - 1, 0)]
    worst = Assignment(MAX_ROUND, 2**62, last[1], (last[0], last[2]))
    head = RoundHead(MAX_ROUND, 2**62, n, n * lws, LONG_ADDRESS, 65535, 1.7e9)
    assert len(roster.encoded(worst.to_json())) <= roster.RECORD_BOUND
    assert len(roster.encoded(head.to_json())) <= roster.RECORD_BOUND
    key = f"/elasticd/v6/rounds/{'j' * 63}/{MAX_ROUND}/{LONG_NODE}99999"
    txns = roster.batches([(key, worst.to_json())] * n)
    assert len(txns) == -(-n // roster.MAX_TXN_PUTS)
    assert all(sum(len(k) + len(roster.encoded(v)) for k, v in t) <= roster.MAX_TXN_BYTES for t in txns)


def check_round(n: int, wide: bool) -> None:
    result = build_result(7, joins(n, wide), 1.5, epoch=1)
    items = [
        (f"/elasticd/v6/rounds/{'j' * 63}/7/{a.member.node}", a.to_json()) for a in roster.assignments(result)
    ]
    txns = roster.batches(items)
    assert [key for txn in txns for key, _ in txn] == [key for key, _ in items]  # all, once, in order
    for txn in txns:
        assert len(txn) <= roster.MAX_TXN_PUTS < ETCD_MAX_TXN_OPS - 3  # the 3 compares ride along
        size = sum(len(k) + len(roster.encoded(v)) for k, v in txn)
        assert size <= roster.MAX_TXN_BYTES < ETCD_MAX_REQUEST_BYTES
        assert all(len(roster.encoded(v)) <= roster.RECORD_BOUND for _, v in txn)
    assert len(roster.encoded(result.head().to_json())) <= roster.RECORD_BOUND
    found = [Assignment.from_json(v) for _, v in items]
    assert sorted(a.member.group_rank for a in found) == list(range(n))
    ranks = sorted(
        r
        for a in found
        for r in range(a.member.rank_offset, a.member.rank_offset + a.member.local_world_size)
    )
    assert ranks == list(range(result.world_size))
    assert roster.assemble(RoundHead.from_json(result.head().to_json()), found) == result


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9])
def test_each_assignment_names_the_members_ring_neighbours(n: int) -> None:
    result = build_result(0, joins(n, False), 1.0)
    for a in roster.assignments(result):
        assert sorted(p.node for p in a.peers) == sorted(
            m.node for m in ring_neighbours(result, a.member.node)
        )


def test_own_takes_only_the_heads_epoch_and_round() -> None:
    result = build_result(3, joins(3, False), 1.0, epoch=5)
    head, mine = result.head(), roster.assignments(result)[1]
    assert roster.own(head, mine) == mine
    assert roster.own(head, replace(mine, epoch=4)) is None  # a leader's that did not close the round
    assert roster.own(head, None) is None


def test_assemble_leaves_a_failed_leaders_assignments_out() -> None:
    """A leader that lost its place after some batches leaves assignments of another epoch: the
    round its successor closed is assembled from that one's alone."""
    first = build_result(2, joins(4, False), 1.0, epoch=1)
    second = build_result(2, joins(3, False), 2.0, epoch=2)
    stale = roster.assignments(first)[3]  # n3: not a member of the round that closed
    assert roster.assemble(second.head(), [*roster.assignments(second), stale]) == second
    with pytest.raises(DecodeError, match="2 of its 3"):
        roster.assemble(second.head(), [*roster.assignments(second)[:2], stale])


def test_an_oversized_value_is_refused_before_it_is_decoded() -> None:
    with pytest.raises(DecodeError, match="over the bound"):
        roster.bounded(b"x" * (roster.RECORD_BOUND + 1), "an assignment")
    with pytest.raises(ValueError, match="over the bound"):
        roster.batches([("k", {"x": "y" * roster.RECORD_BOUND})])

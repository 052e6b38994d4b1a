"""Property checks for the rendezvous rules over many random, seeded cases.

Invariants (elasticd/rendezvous/decider.py): ranks are a permutation of 0..world-1, every member
appears once, survivors keep their relative order and are preferred over newcomers, newcomers follow
in join order, and a result never exceeds max_nodes. ``hypothesis`` is not a test dependency of the
project, so cases come from ``random.Random(seed)``: deterministic, and the seed names a failure.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from elasticd.rendezvous import roster
from elasticd.rendezvous.decider import Close, build_result, decide_close, leader, order_members
from elasticd.rendezvous.model import Join, RoundInfo, RoundResult
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import RoundReason

POOL = [f"n{i:02d}" for i in range(12)]
SEEDS = range(40)
CASES_PER_SEED = 25


@dataclass
class Case:
    joins: list[Join]
    previous: RoundResult | None
    max_nodes: int


def _random_case(rng: random.Random) -> Case:
    joined = rng.sample(POOL, rng.randint(1, len(POOL)))
    revisions = rng.sample(range(1, 10_000), len(joined))  # etcd revisions are unique
    joins = [
        Join(n, f"10.0.0.{POOL.index(n)}", rng.randint(1024, 65535), rng.randint(1, 8), rev)
        for n, rev in zip(joined, revisions, strict=True)
    ]
    previous = None
    if rng.random() < 0.75:
        old = rng.sample(POOL, rng.randint(1, len(POOL)))
        previous = build_result(
            rng.randint(0, 5), [Join(n, "old", 1, rng.randint(1, 4), 0) for n in old], 0.0
        )
    return Case(joins, previous, rng.randint(1, len(POOL) + 2))


def _cases(seed: int) -> list[Case]:
    rng = random.Random(seed)
    return [_random_case(rng) for _ in range(CASES_PER_SEED)]


@pytest.mark.parametrize("seed", SEEDS)
def test_order_members_properties(seed: int) -> None:
    for case in _cases(seed):
        ordered = order_members(case.joins, case.previous, case.max_nodes)
        names = [j.node for j in ordered]
        old_rank = {m.node: m.group_rank for m in case.previous.members} if case.previous else {}
        by_node = {j.node: j for j in case.joins}

        assert len(ordered) == min(len(case.joins), case.max_nodes), seed
        assert len(set(names)) == len(names), seed  # each node once
        assert all(by_node[j.node] is j for j in ordered), seed  # only joined nodes, unchanged

        survivors = [n for n in names if n in old_rank]
        newcomers = [n for n in names if n not in old_rank]
        assert names == survivors + newcomers, seed  # survivors first
        assert survivors == sorted(survivors, key=old_rank.__getitem__), seed  # their old relative order
        revs = [by_node[n].create_revision for n in newcomers]
        assert revs == sorted(revs), seed  # newcomers by join order

        left_out = set(by_node) - set(names)
        if any(n in old_rank for n in left_out):
            assert newcomers == [], seed  # survivors are preferred when capping
        if newcomers:
            # the earliest newcomers got the seats
            cutoff = max(revs)
            assert all(by_node[n].create_revision > cutoff for n in left_out if n not in old_rank), seed

        # the joins' arrival order (as listed) does not matter
        shuffled = list(case.joins)
        random.Random(seed).shuffle(shuffled)
        assert order_members(shuffled, case.previous, case.max_nodes) == ordered, seed


@pytest.mark.parametrize("seed", SEEDS)
def test_build_result_properties(seed: int) -> None:
    for round_no, case in enumerate(_cases(seed)):
        ordered = order_members(case.joins, case.previous, case.max_nodes)
        result = build_result(round_no, ordered, float(seed))
        members = result.members

        assert len(members) <= case.max_nodes, seed
        assert result.nodes == tuple(j.node for j in ordered), seed
        assert len(set(result.nodes)) == len(result.nodes), seed
        assert sorted(m.group_rank for m in members) == list(range(len(members))), seed
        assert [m.group_rank for m in members] == list(range(len(members))), seed
        assert result.world_size == sum(j.local_world_size for j in ordered), seed

        # every global rank belongs to exactly one member's local ranks
        ranks = [r for m in members for r in range(m.rank_offset, m.rank_offset + m.local_world_size)]
        assert ranks == list(range(result.world_size)), seed
        assert (result.master_addr, result.master_port) == (ordered[0].address, ordered[0].port), seed
        for m, j in zip(members, ordered, strict=True):
            assert (m.node, m.address, m.local_world_size) == (j.node, j.address, j.local_world_size), seed
            assert result.member(m.node) == m, seed

        assert roster.assemble(result.head(), roster.assignments(result)) == result, seed


@pytest.mark.parametrize("seed", SEEDS)
def test_stable_ranks_across_rounds(seed: int) -> None:
    """Chained rounds: whoever survives from one round to the next keeps their relative order."""
    rng = random.Random(seed)
    previous: RoundResult | None = None
    for round_no in range(8):
        joined = rng.sample(POOL, rng.randint(1, len(POOL)))
        joins = [Join(n, n, 1, 1, rev) for rev, n in enumerate(joined, start=100 * round_no)]
        result = build_result(round_no, order_members(joins, previous, rng.randint(1, 8)), 0.0)
        if previous is not None:
            kept = [n for n in result.nodes if n in previous.nodes]
            assert kept == [n for n in previous.nodes if n in kept], seed
        previous = result


@pytest.mark.parametrize("seed", SEEDS)
def test_decide_close_properties(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(CASES_PER_SEED):
        lo = rng.randint(1, 5)
        nnodes = NodeRange(lo, rng.randint(lo, 6))
        joined = rng.sample(POOL, rng.randint(0, 7))
        joins = [Join(n, n, 1, 1, i + 1) for i, n in enumerate(joined)]
        expect = tuple(rng.sample(POOL, rng.randint(0, 4)))
        alive = set(rng.sample(POOL, rng.randint(0, len(POOL)))) | set(joined)
        left = set(rng.sample(POOL, rng.randint(0, 2)))
        opened = 1000.0
        last_join_at = opened + rng.uniform(0, 20)
        last_call_s, grace, timeout = rng.uniform(0, 5), rng.uniform(0, 30), rng.uniform(1, 60)
        now = opened + rng.uniform(0, 80)
        info = RoundInfo(1, RoundReason.MEMBER_LOST, opened, expect)

        d = decide_close(
            info,
            joins,
            alive,
            nnodes,
            now=now,
            last_join_at=last_join_at,
            last_call_s=last_call_s,
            join_timeout_s=timeout,
            expect_grace_s=grace,
            left=left,
            expect=expect,
        )
        missing = [n for n in expect if n in alive and n not in joined and n not in left]
        count = len(joins)

        if count < nnodes.min:
            assert d.verdict is not Close.NOW, seed
            assert (d.verdict is Close.FAIL) == (now >= opened + timeout), seed
        else:
            assert d.verdict is not Close.FAIL, seed  # enough nodes never fail
        if count >= nnodes.max and (not missing or now >= opened + grace):
            assert d.verdict is Close.NOW, seed
        if count >= nnodes.min and expect and not missing:
            assert d.verdict is Close.NOW, seed  # the fast path
        if d.verdict is Close.NOW and missing:
            assert now >= opened + grace, seed  # never cut a live expected node's grace short
        if d.verdict is Close.WAIT:
            assert d.recheck_at is not None and d.recheck_at > now, seed
        else:
            assert d.recheck_at is None, seed
        assert leader(joins) == (joined[0] if joined else None), seed

"""elasticd.rendezvous.decider: leader, member order, the result, when to close, bumps, expectations."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import pytest

from elasticd.rendezvous import roster
from elasticd.rendezvous.decider import (
    BumpPlan,
    Close,
    CloseDecision,
    build_result,
    decide_close,
    expected,
    leader,
    next_expect,
    order_members,
    plan_bump,
    ring_neighbours,
)
from elasticd.rendezvous.model import MAX_EXPECT, Assignment, Join, Member, RoundHead, RoundInfo, RoundResult
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import RoundReason


def j(node: str, rev: int, lws: int = 1, port: int | None = None) -> Join:
    return Join(node, f"addr-{node}", port if port is not None else 29000 + rev, lws, rev)


def prev(*nodes: str, round_no: int = 1) -> RoundResult:
    """A previous round's result whose members are ``nodes``, in that group-rank order."""
    return build_result(round_no, [j(n, 100 + i) for i, n in enumerate(nodes)], 0.0)


# -- leader ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("joins", "expected"),
    [
        ([], None),
        ([j("a", 5)], "a"),
        ([j("a", 5), j("b", 3), j("c", 9)], "b"),
        ([j("c", 9), j("b", 3), j("a", 5)], "b"),
        ([j("z", 1), j("a", 2)], "z"),  # revision, not name
        ([j("late", 1000), j("early", 999)], "early"),
    ],
)
def test_leader(joins: list[Join], expected: str | None) -> None:
    assert leader(joins) == expected


# -- order_members -----------------------------------------------------------------------------------


def _names(joins: Sequence[Join]) -> list[str]:
    return [x.node for x in joins]


@pytest.mark.parametrize(
    ("joins", "previous", "max_nodes", "expected"),
    [
        # first round: join order
        ([j("a", 3), j("b", 1), j("c", 2)], None, 8, ["b", "c", "a"]),
        ([j("a", 3), j("b", 1), j("c", 2)], None, 2, ["b", "c"]),
        ([], None, 4, []),
        ([], prev("a", "b"), 4, []),
        # survivors keep their old order even when they rejoined in another order
        ([j("a", 1), j("b", 2), j("c", 3)], prev("c", "a", "b"), 8, ["c", "a", "b"]),
        ([j("c", 7), j("b", 1)], prev("a", "b", "c"), 8, ["b", "c"]),  # a lost: order closes up
        # newcomers follow, by join order
        ([j("new2", 2), j("b", 9), j("new1", 1), j("a", 10)], prev("a", "b"), 8, ["a", "b", "new1", "new2"]),
        ([j("x", 5), j("y", 4)], prev("a", "b"), 8, ["y", "x"]),  # no survivors
        # capping prefers survivors over newcomers, even early ones
        ([j("new", 1), j("b", 5), j("a", 6)], prev("a", "b"), 2, ["a", "b"]),
        ([j("new", 1), j("b", 5), j("a", 6), j("c", 7)], prev("c", "b", "a"), 2, ["c", "b"]),
        ([j("n2", 2), j("n1", 1), j("a", 9)], prev("a"), 2, ["a", "n1"]),
        ([j("a", 1)], prev("a"), 1, ["a"]),
    ],
)
def test_order_members(
    joins: list[Join], previous: RoundResult | None, max_nodes: int, expected: list[str]
) -> None:
    assert _names(order_members(joins, previous, max_nodes)) == expected


def test_order_members_returns_the_joins_themselves() -> None:
    joins = [j("a", 2, lws=4, port=1), j("b", 1, lws=2, port=2)]
    assert order_members(joins, None, 4) == [joins[1], joins[0]]


def test_order_members_does_not_mutate_input() -> None:
    joins = [j("a", 3), j("b", 1)]
    before = list(joins)
    order_members(joins, prev("b", "a"), 1)
    assert joins == before


# -- build_result ------------------------------------------------------------------------------------


def test_build_result_ranks_and_offsets() -> None:
    ordered = [j("b", 7, lws=4, port=1111), j("a", 3, lws=2, port=2222), j("c", 9, lws=8, port=3333)]
    result = build_result(5, ordered, 123.5)
    assert result.round == 5
    assert result.closed_at == 123.5
    assert result.members == (
        Member("b", "addr-b", 0, 0, 4),
        Member("a", "addr-a", 1, 4, 2),
        Member("c", "addr-c", 2, 6, 8),
    )
    assert result.world_size == 14
    assert (result.master_addr, result.master_port) == ("addr-b", 1111)  # the first member, not the leader
    assert result.nodes == ("b", "a", "c")


@pytest.mark.parametrize(
    ("sizes", "offsets", "world"),
    [
        ([1], [0], 1),
        ([8], [0], 8),
        ([1, 1, 1, 1], [0, 1, 2, 3], 4),
        ([3, 1, 2], [0, 3, 4], 6),
        ([1024, 1], [0, 1024], 1025),
    ],
)
def test_build_result_offsets_are_cumulative(sizes: list[int], offsets: list[int], world: int) -> None:
    ordered = [j(f"n{i}", i + 1, lws=s) for i, s in enumerate(sizes)]
    result = build_result(0, ordered, 0.0)
    assert [m.rank_offset for m in result.members] == offsets
    assert [m.group_rank for m in result.members] == list(range(len(sizes)))
    assert [m.local_world_size for m in result.members] == sizes
    assert result.world_size == world


def test_build_result_round_trips_through_its_head_and_assignments() -> None:
    result = build_result(2, [j("a", 1, lws=2), j("b", 2, lws=3)], 9.0, 1)
    head = RoundHead.from_json(result.head().to_json())
    assert (
        roster.assemble(head, [Assignment.from_json(a.to_json()) for a in roster.assignments(result)])
        == result
    )


# -- decide_close ------------------------------------------------------------------------------------

OPENED = 1000.0


def decide(
    joined: Sequence[str],
    *,
    now: float,
    nnodes: tuple[int, int] = (2, 4),
    expect: Sequence[str] = (),
    alive: Collection[str] | None = None,
    last_join_at: float = OPENED,
    last_call_s: float = 2.0,
    join_timeout_s: float = 600.0,
    expect_grace_s: float = 10.0,
    left: Collection[str] = (),
    running: Collection[str] = (),
) -> CloseDecision:
    joins = [j(n, i + 1) for i, n in enumerate(joined)]
    info = RoundInfo(1, RoundReason.MEMBER_LOST, OPENED, tuple(expect))
    if alive is None:
        alive = {*joined, *expect, *left}
    return decide_close(
        info,
        joins,
        alive,
        NodeRange(*nnodes),
        now=now,
        last_join_at=last_join_at,
        last_call_s=last_call_s,
        join_timeout_s=join_timeout_s,
        expect_grace_s=expect_grace_s,
        left=left,
        running=running,
        expect=tuple(expect),
    )


def _case(joined: str, want: tuple[Close, str, float | None], **kw: Any) -> Any:
    return pytest.param(list(joined.split()) if joined else [], kw, want)


# (joined nodes, keyword args, (verdict, why, recheck_at))
CLOSE_CASES = {
    # MAX nodes joined closes at once
    "max-joined": _case("a b c d", (Close.NOW, "4 of at most 4 nodes joined", None), now=OPENED),
    "above-max": _case("a b c d e", (Close.NOW, "5 of at most 4 nodes joined", None), now=OPENED),
    "max-equals-min": _case(
        "a b", (Close.NOW, "2 of at most 2 nodes joined", None), now=OPENED, nnodes=(2, 2)
    ),
    "max-one-node": _case("a", (Close.NOW, "1 of at most 1 nodes joined", None), now=OPENED, nnodes=(1, 1)),
    "max-expected-all-joined": _case(
        "a b c d", (Close.NOW, "4 of at most 4 nodes joined", None), now=OPENED, expect=["a", "b"]
    ),
    # ... unless an expected live node is missing and its grace has not passed
    "max-missing-in-grace": _case(
        "a b c d", (Close.WAIT, "last call", OPENED + 10), now=OPENED + 5, expect=["a", "x"]
    ),
    "max-missing-in-grace-quiet-later": _case(
        "a b c d",
        (Close.WAIT, "last call", OPENED + 30),
        now=OPENED + 5,
        expect=["x"],
        last_join_at=OPENED + 28,
    ),
    "max-missing-grace-passed": _case(
        "a b c d", (Close.NOW, "4 of at most 4 nodes joined", None), now=OPENED + 10, expect=["x"]
    ),
    "max-missing-but-dead": _case(
        "a b c d", (Close.NOW, "4 of at most 4 nodes joined", None), now=OPENED, expect=["x"], alive={"a"}
    ),
    "max-missing-but-left": _case(
        "a b c d", (Close.NOW, "4 of at most 4 nodes joined", None), now=OPENED, expect=["x"], left={"x"}
    ),
    # MIN joined and every expected live node joined (or left): close at once, no last call
    "fast-path": _case(
        "a b", (Close.NOW, "every expected node rejoined", None), now=OPENED, expect=["a", "b"]
    ),
    "fast-path-extra-joiner": _case(
        "a b c", (Close.NOW, "every expected node rejoined", None), now=OPENED, expect=["a", "b"]
    ),
    "fast-path-expected-left": _case(
        "a b",
        (Close.NOW, "every expected node rejoined", None),
        now=OPENED,
        expect=["a", "b", "x"],
        left={"x"},
    ),
    "fast-path-expected-dead": _case(
        "a b",
        (Close.NOW, "every expected node rejoined", None),
        now=OPENED,
        expect=["a", "b", "x"],
        alive={"a", "b"},
    ),
    "fast-path-needs-min": _case(
        "a", (Close.WAIT, "1 of 2 nodes joined", OPENED + 600), now=OPENED, expect=["a"]
    ),
    "fast-path-left-not-counted-for-min": _case(
        "a", (Close.WAIT, "1 of 2 nodes joined", OPENED + 600), now=OPENED, expect=["a", "b"], left={"b"}
    ),
    "no-fast-path-without-expect": _case("a b", (Close.WAIT, "last call", OPENED + 2), now=OPENED),
    # last call: MIN joined and no new join for last_call_s
    "last-call-waits": _case("a b", (Close.WAIT, "last call", OPENED + 2), now=OPENED + 1.999),
    "last-call-passes": _case("a b", (Close.NOW, "last call: 2 nodes joined", None), now=OPENED + 2),
    "last-call-long-after": _case("a b c", (Close.NOW, "last call: 3 nodes joined", None), now=OPENED + 500),
    "last-call-reset-by-join": _case(
        "a b c", (Close.WAIT, "last call", OPENED + 52), now=OPENED + 51, last_join_at=OPENED + 50
    ),
    "last-call-zero": _case("a b", (Close.NOW, "last call: 2 nodes joined", None), now=OPENED, last_call_s=0),
    # grace for expected live nodes that have not joined yet
    "grace-holds-last-call": _case(
        "a b", (Close.WAIT, "last call", OPENED + 10), now=OPENED + 5, expect=["a", "b", "c"]
    ),
    "grace-passed-quiet-not": _case(
        "a b",
        (Close.WAIT, "last call", OPENED + 21),
        now=OPENED + 20,
        expect=["c"],
        last_join_at=OPENED + 19,
    ),
    "grace-and-quiet-passed": _case(
        "a b", (Close.NOW, "last call: 2 nodes joined", None), now=OPENED + 10, expect=["a", "b", "c"]
    ),
    "grace-for-one-of-two-missing": _case(
        "a b",
        (Close.WAIT, "last call", OPENED + 10),
        now=OPENED + 3,
        expect=["c", "d"],
        alive={"a", "b", "d"},
    ),
    # fewer than MIN: wait until the join timeout, then fail
    "too-few-waits": _case("a", (Close.WAIT, "1 of 2 nodes joined", OPENED + 600), now=OPENED + 599),
    "none-waits": _case("", (Close.WAIT, "0 of 2 nodes joined", OPENED + 600), now=OPENED),
    "too-few-fails": _case(
        "a", (Close.FAIL, "only 1 of the 2 nodes needed joined within 600s", None), now=OPENED + 600
    ),
    "none-fails": _case(
        "", (Close.FAIL, "only 0 of the 2 nodes needed joined within 600s", None), now=OPENED + 601
    ),
    "fail-fractional-timeout": _case(
        "a b",
        (Close.FAIL, "only 2 of the 3 nodes needed joined within 0.5s", None),
        now=OPENED + 1,
        nnodes=(3, 4),
        join_timeout_s=0.5,
    ),
    "fail-despite-expected-missing": _case(
        "a",
        (Close.FAIL, "only 1 of the 2 nodes needed joined within 60s", None),
        now=OPENED + 60,
        expect=["b"],
        join_timeout_s=60,
    ),
    "too-few-ignores-last-call": _case(
        "a", (Close.WAIT, "1 of 2 nodes joined", OPENED + 600), now=OPENED + 100, last_call_s=0
    ),
}


@pytest.mark.parametrize(("joined", "kw", "want"), list(CLOSE_CASES.values()), ids=list(CLOSE_CASES))
def test_decide_close(joined: list[str], kw: dict[str, Any], want: tuple[Close, str, float | None]) -> None:
    decision = decide(joined, **kw)
    assert (decision.verdict, decision.why, decision.recheck_at) == want
    if decision.verdict is Close.WAIT:
        assert decision.recheck_at is not None and decision.recheck_at > kw["now"]


def test_decide_close_dead_expected_node_is_not_waited_for() -> None:
    kw: dict[str, Any] = {"now": OPENED + 3, "expect": ["a", "b", "c"]}
    waiting = decide(["a", "b"], alive={"a", "b", "c"}, **kw)
    closing = decide(["a", "b"], alive={"a", "b"}, **kw)
    assert (waiting.verdict, waiting.recheck_at) == (Close.WAIT, OPENED + 10)
    assert closing.verdict is Close.NOW


def test_decide_close_left_counts_as_arrived_at_max() -> None:
    kw: dict[str, Any] = {"now": OPENED + 1, "expect": ["x"], "nnodes": (1, 2)}
    assert decide(["a", "b"], **kw).verdict is Close.WAIT
    assert decide(["a", "b"], left={"x"}, **kw).verdict is Close.NOW


def test_decide_close_wait_then_close_as_time_passes() -> None:
    """Re-evaluated at its recheck_at, a WAIT closes if nothing changed."""
    kw: dict[str, Any] = {"expect": ["a", "b", "c"], "last_join_at": OPENED + 4}
    first = decide(["a", "b"], now=OPENED + 5, **kw)
    assert first.verdict is Close.WAIT and first.recheck_at == OPENED + 10
    assert decide(["a", "b"], now=first.recheck_at, **kw).verdict is Close.NOW


def test_decide_close_too_few_then_fail_at_recheck() -> None:
    first = decide(["a"], now=OPENED)
    assert first.verdict is Close.WAIT and first.recheck_at is not None
    assert decide(["a"], now=first.recheck_at).verdict is Close.FAIL


@pytest.mark.parametrize("joined", [["a", "b", "c", "d"], ["a", "b"]], ids=["max", "last-call"])
def test_decide_close_never_closes_over_a_previous_member_that_may_still_run(joined: list[str]) -> None:
    """An expected member of the previous round that has not rejoined (it stops its workers
    first), not reported ``left``, and whose lease lives, may still run its workers (its requests
    fail, it retries at its own pace): no grace closes over it, only its news or its lease's end."""
    kw: dict[str, Any] = {"expect": ["a", "b", "x"], "running": {"a", "b", "x"}, "join_timeout_s": 60.0}
    past_grace = decide(joined, now=OPENED + 20, **kw)
    assert past_grace.verdict is Close.WAIT and past_grace.recheck_at == OPENED + 60
    assert "x" in past_grace.why
    assert decide(joined, now=OPENED + 20, **(kw | {"left": {"x"}})).verdict is Close.NOW
    assert decide(joined, now=OPENED + 20, alive=set(joined), **kw).verdict is Close.NOW  # lease gone
    assert decide([*joined[:-1], "x", joined[-1]], now=OPENED + 20, **kw).verdict is Close.NOW
    failed = decide(joined, now=OPENED + 60, **kw)
    assert failed.verdict is Close.FAIL and "x" in failed.why and "may still run" in failed.why


def test_decide_close_gives_only_a_grace_to_newcomers_and_done_members() -> None:
    """An expected node not in ``running`` (an announced newcomer, or a member whose workers are
    done) has no workers to wait for: past the grace, the round closes without it."""
    kw: dict[str, Any] = {"now": OPENED + 20, "expect": ["a", "b", "x"], "running": {"a", "b"}}
    assert decide(["a", "b"], **kw).verdict is Close.NOW
    assert decide(["a", "b", "c", "d"], **kw).verdict is Close.NOW


# -- plan_bump ---------------------------------------------------------------------------------------

SPENDING = [RoundReason.WORKER_FAILED, RoundReason.MEMBER_LOST]
FREE = [RoundReason.START, RoundReason.SCALE_UP, RoundReason.MEMBER_LEFT]


@pytest.mark.parametrize("reason", SPENDING)
@pytest.mark.parametrize(("used", "budget"), [(0, 1), (0, 3), (1, 3), (2, 3), (9_999, 10_000)])
def test_plan_bump_failure_spends_while_budget_remains(reason: RoundReason, used: int, budget: int) -> None:
    assert plan_bump(reason, used, budget, "rank 0 died") == BumpPlan(False, True, "rank 0 died")


@pytest.mark.parametrize("reason", SPENDING)
@pytest.mark.parametrize(("used", "budget"), [(0, 0), (1, 1), (3, 3), (4, 3), (10_000, 10_000)])
def test_plan_bump_failure_fails_without_budget(reason: RoundReason, used: int, budget: int) -> None:
    plan = plan_bump(reason, used, budget, "rank 0 died")
    assert plan.fail is True and plan.spend is False
    assert plan.why == f"rank 0 died; no restarts left ({used} of {budget} used)"
    assert "no restarts left" in plan.why


@pytest.mark.parametrize("reason", FREE)
@pytest.mark.parametrize(("used", "budget"), [(0, 0), (0, 3), (3, 3), (7, 3)])
def test_plan_bump_membership_change_never_spends_nor_fails(
    reason: RoundReason, used: int, budget: int
) -> None:
    assert plan_bump(reason, used, budget, "n3 waiting") == BumpPlan(False, False, "n3 waiting")


@pytest.mark.parametrize("budget", [0, 1, 2, 5])
def test_plan_bump_budget_allows_exactly_max_restarts(budget: int) -> None:
    used = 0
    while not (plan := plan_bump(RoundReason.WORKER_FAILED, used, budget, "x")).fail:
        assert plan.spend
        used += 1
        assert used <= budget
    assert used == budget


# -- next_expect -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "members", "extra", "want"),
    [
        (None, True, (), ()),
        (None, True, ("n1", "n2", "n1"), ("n1", "n2")),
        (prev("c", "a", "b"), True, (), ("c", "a", "b")),  # member order
        (prev("a", "b"), True, ("n", "a"), ("a", "b", "n")),  # no duplicates
        (prev("a", "b"), False, ("n",), ("n",)),  # a round that names no members (the janitor's)
    ],
)
def test_expected(
    result: RoundResult | None, members: bool, extra: tuple[str, ...], want: tuple[str, ...]
) -> None:
    """Whom a round waits for: the previous round's members (its leader reads them whole; dead
    ones are left out by ``decide_close``), then the newcomers the round names."""
    info = RoundInfo(1, RoundReason.SCALE_UP, 0.0, next_expect(extra), expect_members=members)
    assert expected(info, result) == want


def test_next_expect_names_at_most_max_expect_newcomers() -> None:
    many = tuple(f"n{i}" for i in range(MAX_EXPECT + 50))
    assert next_expect(many) == many[:MAX_EXPECT]
    RoundInfo(1, RoundReason.SCALE_UP, 0.0, next_expect(many))  # within the record's bound


@pytest.mark.parametrize(
    ("n", "node", "expected"),
    [
        (1, "m0", []),
        (2, "m0", ["m1"]),
        (3, "m0", ["m2", "m1"]),
        (5, "m2", ["m1", "m3"]),
        (5, "m4", ["m3", "m0"]),
        (4, "zz", []),
    ],
)
def test_ring_neighbours_watch_at_most_two(n: int, node: str, expected: list[str]) -> None:
    members = tuple(Member(f"m{i}", "h", i, i, 1) for i in range(n))
    result = RoundResult(0, members, n, "h", 1)
    assert [m.node for m in ring_neighbours(result, node)] == expected

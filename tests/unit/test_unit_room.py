"""Making room (``jobs.room``): which nodes elastic jobs lend to a waiting job of a higher
priority, and when they get them back."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.jobs.room import (
    GiveBack,
    Lent,
    NodeRoom,
    Room,
    Running,
    Shrink,
    Waiting,
    decide,
    lent_for,
    room_by,
    worth_asking,
)

NOW = 10_000.0
INTERVAL = 300.0


def _nodes(*names: str, free: int = 0) -> list[NodeRoom]:
    return [NodeRoom(n, free) for n in names]


def _elastic(job: str = "a", members: tuple[str, ...] = ("n1", "n2", "n3"), **kw: object) -> Running:
    fields: dict[str, object] = {"priority": 0, "minimum": 2, "nproc": 1, "yields": True, "submitted_at": 1.0}
    fields.update(kw)
    return Running(job, size=len(members), members=members, **fields)  # type: ignore[arg-type]


def test_a_higher_priority_job_borrows_one_node_of_an_elastic_job_above_its_minimum() -> None:
    room = decide(
        [Waiting("b", 5, 1, 1)], [_elastic()], _nodes("n1", "n2", "n3"), [], {"a", "b"}, NOW, INTERVAL
    )
    assert room.shrinks == (Shrink("a", "n3", "b"),) or len(room.shrinks) == 1
    assert room.shrinks[0].job == "a" and room.shrinks[0].for_job == "b"
    assert "a shrunk by 1 node(s) for b" in room.reason and room.returns == ()


def test_nothing_is_lent_to_a_job_free_nodes_can_start_nor_to_one_of_no_higher_priority() -> None:
    free = [*_nodes("n1", "n2", "n3"), NodeRoom("n4", 1)]
    assert decide([Waiting("b", 5, 1, 1)], [_elastic()], free, [], {"a", "b"}, NOW, INTERVAL) == Room()
    same = decide([Waiting("b", 0, 1, 1)], [_elastic()], _nodes("n1", "n2", "n3"), [], {"a", "b"}, NOW, 0)
    assert same.shrinks == ()


def test_a_job_at_its_minimum_or_that_does_not_yield_or_shrunk_lately_lends_nothing() -> None:
    nodes = _nodes("n1", "n2", "n3")
    for running in (
        _elastic(minimum=3),
        _elastic(yields=False),
        _elastic(last_shrunk=NOW - INTERVAL / 2),
    ):
        room = decide([Waiting("b", 5, 1, 1)], [running], nodes, [], {"a", "b"}, NOW, INTERVAL)
        assert room.shrinks == () and "b waits" in room.reason
    lately = _elastic(last_shrunk=NOW - INTERVAL)
    assert len(decide([Waiting("b", 5, 1, 1)], [lately], nodes, [], {"a", "b"}, NOW, INTERVAL).shrinks) == 1


def test_all_or_nothing_no_job_shrinks_for_one_that_still_could_not_start() -> None:
    room = decide(
        [Waiting("b", 5, 2, 1)], [_elastic()], _nodes("n1", "n2", "n3"), [], {"a", "b"}, NOW, INTERVAL
    )
    assert room.shrinks == () and "1 of the 2 node(s)" in room.reason


def test_the_lowest_priority_lends_first_then_the_most_above_its_minimum_then_the_youngest() -> None:
    nodes = _nodes(*(f"n{i}" for i in range(1, 10)))
    low = _elastic("low", ("n1", "n2", "n3"), priority=1)
    lower = _elastic("lower", ("n4", "n5", "n6"), priority=0)
    assert {
        s.job for s in decide([Waiting("b", 5, 1, 1)], [low, lower], nodes, [], {"b"}, NOW, 0).shrinks
    } == {"lower"}
    wide = _elastic("wide", ("n1", "n2", "n3", "n7"))
    young = _elastic("young", ("n4", "n5", "n6"), submitted_at=9.0)
    assert decide([Waiting("b", 5, 1, 1)], [wide, young], nodes, [], {"b"}, NOW, 0).shrinks[0].job == "wide"
    old = _elastic("old", ("n1", "n2", "n3"), submitted_at=1.0)
    assert decide([Waiting("b", 5, 1, 1)], [old, young], nodes, [], {"b"}, NOW, 0).shrinks[0].job == "young"


def test_what_was_lent_counts_so_a_decision_made_again_lends_nothing_more() -> None:
    lent = [Lent("a", "n3", "b")]
    running = _elastic(lent_to=frozenset({"b"}), last_shrunk=NOW)
    room = decide(
        [Waiting("b", 5, 1, 1)], [running], _nodes("n1", "n2", "n3"), lent, {"a", "b"}, NOW, INTERVAL
    )
    assert room == Room()


def test_a_janitor_that_stopped_mid_way_is_finished_by_the_next_within_the_interval() -> None:
    lent = [Lent("a", "n4", "b")]
    running = _elastic(members=("n1", "n2", "n3", "n4"), lent_to=frozenset({"b"}), last_shrunk=NOW)
    nodes = _nodes("n1", "n2", "n3", "n4")
    room = decide([Waiting("b", 5, 2, 1)], [running], nodes, lent, {"a", "b"}, NOW, INTERVAL)
    assert len(room.shrinks) == 1 and room.shrinks[0].node != "n4"


def test_a_lent_node_that_died_mid_shrink_is_not_waited_for_nor_is_a_dead_member_lent() -> None:
    # n4 was lent to b, then died (with the janitor that lent it, say) before b started there; a's
    # round still counts it (size 4) until its next round. b takes another node of a's...
    lent = [Lent("a", "n4", "b")]
    running = replace(_elastic(lent_to=frozenset({"b"}), last_shrunk=NOW), size=4)
    nodes = _nodes("n1", "n2", "n3")
    room = decide([Waiting("b", 5, 1, 1)], [running], nodes, lent, {"a", "b"}, NOW, INTERVAL)
    assert len(room.shrinks) == 1 and room.shrinks[0].node in {"n1", "n2", "n3"}
    # ... but not one that would leave a below MIN among the nodes that live.
    at_min = replace(running, members=("n1", "n2"))
    room = decide([Waiting("b", 5, 1, 1)], [at_min], nodes[:2], lent, {"a", "b"}, NOW, INTERVAL)
    assert room.shrinks == () and "b waits" in room.reason
    # Back alive, n4 is b's again: nothing more is lent.
    back = decide(
        [Waiting("b", 5, 1, 1)], [at_min], [*nodes, NodeRoom("n4", 1)], lent, {"a", "b"}, NOW, INTERVAL
    )
    assert back == Room()


def test_nodes_are_given_back_once_the_borrower_ended_and_only_then() -> None:
    lent = [Lent("a", "n3", "b")]
    assert decide([], [_elastic()], [], lent, {"a"}, NOW, INTERVAL).returns == (GiveBack("a", "n3", "b"),)
    assert decide([], [_elastic()], [], lent, {"a", "b"}, NOW, INTERVAL).returns == ()


def test_the_record_says_whom_a_node_was_lent_to_and_nothing_else_reads_as_a_lend() -> None:
    assert lent_for(room_by("job-1")) == "job-1"
    for by in (
        "alice",
        "elasticd (stragglers)",
        "elasticd (room for )",
        "elasticd (room for a b)",
        room_by("x")[:-1],
    ):
        assert lent_for(by) is None


def test_worth_asking_only_when_a_waiting_job_outranks_a_running_one_that_may_lend() -> None:
    assert worth_asking([Waiting("b", 5, 1, 1)], [_elastic()])
    assert not worth_asking([Waiting("b", 0, 1, 1)], [_elastic()])
    assert not worth_asking([Waiting("b", 5, 1, 1)], [_elastic(yields=False)])
    assert not worth_asking([Waiting("b", 5, 1, 1)], [_elastic(minimum=3)])


NODE_NAMES = [f"n{i}" for i in range(8)]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Waiting], list[Running], list[NodeRoom]]:
    """Running jobs on disjoint nodes, waiting jobs, and the nodes' free slots."""
    names = draw(st.permutations(NODE_NAMES))
    running, start = [], 0
    for i in range(draw(st.integers(0, 3))):
        size = draw(st.integers(1, 3))
        members = tuple(names[start : start + size])
        start += size
        if not members:
            break
        running.append(
            Running(
                f"r{i}", draw(st.integers(0, 3)), draw(st.integers(1, len(members))), len(members),
                draw(st.integers(1, 2)), draw(st.booleans()), draw(st.floats(0, 100)), members,
                draw(st.none() | st.floats(NOW - 2 * INTERVAL, NOW)),
            )
        )  # fmt: skip
    busy = {n for r in running for n in r.members}
    nodes = [NodeRoom(n, 0 if n in busy else draw(st.integers(0, 2))) for n in NODE_NAMES]
    waiting = [
        Waiting(f"w{i}", draw(st.integers(0, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 2)))
        for i in range(draw(st.integers(0, 3)))
    ]
    waiting.sort(key=lambda w: -w.priority)  # the queue's order is by priority first
    return waiting, running, nodes


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_never_below_min_never_over_a_higher_priority_and_no_shrink_without_need(
    cluster: tuple[list[Waiting], list[Running], list[NodeRoom]],
) -> None:
    waiting, running, nodes = cluster
    alive = {w.id for w in waiting} | {r.id for r in running}
    room = decide(waiting, running, nodes, [], alive, NOW, INTERVAL)
    by_id = {r.id: r for r in running}
    priority = {w.id: w.priority for w in waiting}
    for r in running:
        taken = [s for s in room.shrinks if s.job == r.id]
        assert r.size - len(taken) >= r.minimum
        assert not taken or (r.yields and (r.last_shrunk is None or r.last_shrunk + INTERVAL <= NOW))
    for s in room.shrinks:
        assert by_id[s.job].priority < priority[s.for_job] and s.node in by_id[s.job].members
    assert len({s.node for s in room.shrinks}) == len(room.shrinks)
    assert len({s.for_job for s in room.shrinks}) <= 1 and room.returns == ()


def _applied(running: list[Running], lent: list[Lent], at: float) -> list[Running]:
    """The running jobs once ``lent`` is written (members leave at their next round: not yet); a
    job that lent last shrunk ``at``, as its lend records say (``manager.room.running_of``), even
    when it had shrunk before (keeping that older time let it lend again within the interval)."""
    return [
        Running(
            r.id, r.priority, r.minimum, r.size, r.nproc, r.yields, r.submitted_at, r.members,
            at if any(x.job == r.id for x in lent) else r.last_shrunk,
            frozenset(x.for_job for x in lent if x.job == r.id),
        )
        for r in running
    ]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_no_loop_decisions_made_again_settle_and_nothing_goes_back_while_its_borrower_lives(
    cluster: tuple[list[Waiting], list[Running], list[NodeRoom]],
) -> None:
    waiting, running, nodes = cluster
    alive = {w.id for w in waiting} | {r.id for r in running}
    lent: list[Lent] = []
    for step in range(len(waiting) + 1):  # each decision helps one more waiting job at most
        room = decide(waiting, _applied(running, lent, NOW), nodes, lent, alive, NOW + step, INTERVAL)
        assert room.returns == ()
        lent += [Lent(s.job, s.node, s.for_job) for s in room.shrinks]
    assert room.shrinks == ()  # settled: deciding again changes nothing
    for r in running:  # each job lent to one borrower at most within the interval, never below MIN
        mine = [x for x in lent if x.job == r.id]
        assert len({x.for_job for x in mine}) <= 1 and r.size - len(mine) >= r.minimum
    if lent:  # a borrower ended: exactly its nodes go back, and nothing is lent for it again
        gone = lent[0].for_job
        rest = [w for w in waiting if w.id != gone]
        back = decide(rest, _applied(running, lent, NOW), nodes, lent, alive - {gone}, NOW + 9, INTERVAL)
        assert {(b.job, b.node) for b in back.returns} == {(x.job, x.node) for x in lent if x.for_job == gone}
        assert all(s.for_job != gone for s in back.shrinks)


@settings(max_examples=300, deadline=None)
@given(clusters(), st.sets(st.sampled_from(NODE_NAMES)))
def test_never_below_min_among_the_live_members_when_nodes_died(
    cluster: tuple[list[Waiting], list[Running], list[NodeRoom]], dead: set[str]
) -> None:
    waiting, running, nodes = cluster
    # The dead nodes have no record: not among the live nodes, nor their jobs' members; each
    # round keeps its size until its next one.
    live = [replace(r, members=tuple(n for n in r.members if n not in dead)) for r in running]
    alive = {w.id for w in waiting} | {r.id for r in running}
    room = decide(waiting, live, [n for n in nodes if n.node not in dead], [], alive, NOW, INTERVAL)
    for r in live:
        assert (
            not any(s.job == r.id for s in room.shrinks)
            or len(r.members) - sum(s.job == r.id for s in room.shrinks) >= r.minimum
        )
    assert not {s.node for s in room.shrinks} & dead

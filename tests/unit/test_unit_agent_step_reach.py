"""elasticd.agent.step with reachability (``rendezvous.reach``): the leader probes the joiners
before it closes and leaves out whom it cannot reach; a leader that reaches too few hands the
round on; a node outside a running round asks back only once it reaches every member."""

from __future__ import annotations

from dataclasses import replace

from elasticd.agent.actions import (
    ClearWaiting,
    CloseRound,
    Join,
    MarkLeft,
    NotePending,
    Probe,
    Publish,
    SetWaiting,
    StartWorkers,
    Wait,
    Withdraw,
)
from elasticd.agent.record import AgentState
from elasticd.jobs.view import job_view
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.jobread import RostersRead
from elasticd.rendezvous.reach import PROBE_FRESH_S, REJOIN_BACKOFF_S, Reach
from tests.agent_steps import ME, NOW, acts, decide, job_read, join, joining, local

ALL3 = ("n1", "n2", "n3")


def ported(read: RostersRead) -> RostersRead:
    """Every join and member publishes a liveness port (as every daemon does)."""
    joins = {
        r: tuple(replace(j, liveness_port=4000 + j.create_revision) for j in js)
        for r, js in read.joins.items()
    }
    results = {}
    for r, res in read.results.items():
        ordered = [replace(join(n, 10 + i), liveness_port=4010 + i) for i, n in enumerate(res.nodes)]
        results[r] = rdzv.build_result(r, ordered, res.closed_at)
    return replace(read, joins=joins, results=results)


def filling() -> RostersRead:
    return ported(job_read(1, joins=ALL3, expect=ALL3))


def reach(reached: tuple[str, ...], unreached: tuple[str, ...], round_no: int = 1, at: float = NOW) -> Reach:
    return Reach(round_no, frozenset(reached), frozenset(unreached), at)


def test_the_leader_probes_the_other_joiners_before_it_closes() -> None:
    read = filling()
    _, actions = decide(joining(1, leading=True), read)
    targets = tuple((j.node, j.address, j.liveness_port) for j in read.current_joins if j.node != ME)
    assert acts(actions)[-1] == Probe(1, targets)


def test_the_leader_leaves_out_a_joiner_it_cannot_reach() -> None:
    read = filling()
    _, actions = decide(joining(1, leading=True), read, local(reach=reach(("n2",), ("n3",))))
    close = acts(actions)[-1]
    assert isinstance(close, CloseRound) and close.result.nodes == ("n1", "n2")
    assert "left out n3" in close.why


def test_a_leader_that_reaches_no_other_joiner_hands_the_round_on() -> None:
    rec, actions = decide(joining(1, leading=True), filling(), local(reach=reach((), ("n2", "n3"))))
    note, withdraw, left, wait = acts(actions)[-4:]
    assert isinstance(note, NotePending) and note.note and "another leads" in note.note
    # ``left``: its workers are stopped, so the round it hands on need not wait for it
    assert [withdraw, left, wait] == [Withdraw(1), MarkLeft(1), Wait(NOW + REJOIN_BACKOFF_S)]
    assert (rec.leading, rec.joined_round, rec.rejoin_at) == (False, -1, NOW + REJOIN_BACKOFF_S)
    gone = ported(job_read(1, joins=("n2", "n3"), expect=ALL3))
    _, early = decide(rec, gone)
    assert acts(early) == [Wait(NOW + REJOIN_BACKOFF_S)]
    _, later = decide(rec, gone, now=NOW + REJOIN_BACKOFF_S)
    assert acts(later)[:2] == [ClearWaiting(), Join(1)]


def test_too_few_reachable_joiners_make_the_round_wait_and_say_why() -> None:
    spec3 = replace(joining(1).spec, nnodes=replace(joining(1).spec.nnodes, min=3))
    rec = replace(joining(1, leading=True), spec=spec3)
    read = ported(job_read(1, job=spec3, joins=ALL3, expect=ALL3))  # filling(), of the spec that needs 3
    new, actions = decide(rec, read, local(reach=reach(("n2",), ("n3",))))
    note, wait = acts(actions)[-2:]
    assert isinstance(note, NotePending) and note.note and "waits" in note.note
    assert wait == Wait(NOW + PROBE_FRESH_S) and new.note == note.note


def test_a_node_outside_asks_back_only_once_it_reaches_every_member() -> None:
    read = ported(job_read(2, joins=("n2", "n3"), members=("n2", "n3")))
    rec = joining(1)
    new, actions = decide(rec, read)
    assert isinstance(acts(actions)[-1], Probe) and new.state is AgentState.WAITING
    cut = local(reach=reach(("n2",), ("n3",), round_no=2))
    new, actions = decide(new, read, cut)
    note, wait = acts(actions)[-2:]
    assert isinstance(note, NotePending) and note.note and "n3" in note.note
    assert wait == Wait(NOW + PROBE_FRESH_S) and SetWaiting() not in actions
    healed = local(reach=reach(("n2", "n3"), (), round_no=2))
    new, actions = decide(new, read, healed)
    assert acts(actions)[-4:] == [NotePending(None), SetWaiting(), Publish(), Wait()]
    assert new.note is None


def test_a_node_that_starts_workers_clears_its_note() -> None:
    read = ported(job_read(3, joins=ALL3, members=ALL3))
    rec = replace(joining(3), note="cannot reach n3")
    new, actions = decide(rec, read)
    assert any(isinstance(a, StartWorkers) for a in actions) and NotePending(None) in actions
    assert new.note is None


def test_status_shows_why_a_node_outside_a_running_round_waits() -> None:
    read = ported(job_read(2, joins=("n2", "n3"), members=("n2", "n3")))
    read = replace(read, pending={"n1": "cannot reach n3 of round 2", "n2": "stale"})
    view = job_view(read, "n2")
    assert view["state"] == "RUNNING" and view["reason"] == "round 2; cannot reach n3 of round 2"


def test_a_joined_leaders_note_is_no_shortage_of_capacity() -> None:
    read = ported(job_read(1, joins=ALL3, expect=ALL3))
    read = replace(read, pending={"n1": "round 1 waits: n3 unreachable from n1, 2 of the 3 nodes needed"})
    view = job_view(read, "n1")
    assert view["waits_for"] is None and view["short_of_capacity"] == []  # 3 joined: about to close
    assert "round 1 waits" in view["reason"]
    read = replace(read, pending={**read.pending, "n4": "no free CPU slots"})  # lacking slots, never joins
    assert job_view(read, "n1")["short_of_capacity"] == ["n4"]

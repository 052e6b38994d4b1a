"""A node cut from its peers but not from the store, in the agent simulation (``tests.agent_sim``,
its invariants from ``test_unit_agent_sim``): the round's leader probes the joiners and leaves the
cut node out (no restart spent for it), a cut leader hands the round on, a round short of MIN
waits, and the node is taken back at a later round once it reaches its peers again. A round that
ran with the node when the cut came stalls until the hang timeout: here, its workers fail."""

from __future__ import annotations

from elasticd.agent.record import AgentState
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import RoundReason
from tests import fakes
from tests.agent_sim import Sim
from tests.unit.test_unit_agent_sim import make_spec, new_sim, running, settle


def hang_timeout(sim: Sim, members: int = 3) -> None:
    """The stalled round's workers end by the hang timeout, on every member."""
    for i in range(members):
        sim.fail(i)


def run(sim: Sim, ticks: int, dt: float = 0.25) -> None:
    sim.run(ticks, dt)


def test_a_node_cut_from_its_peers_is_left_out_then_taken_back() -> None:
    sim, checks = running((2, 4))
    sim.cut_peers(2)
    hang_timeout(sim)
    run(sim, 40)  # 10 s cut: the job goes on without n2, and never takes it in nor restarts for it
    assert checks.results[1].nodes == ("n0", "n1") and max(checks.results) == 1
    assert checks.restarts == 1 and len(checks.rounds) == 2
    n2 = sim.node("n2")
    assert n2.agent is not None and n2.agent.rec.state is AgentState.WAITING
    assert "n2" not in sim.read_job().waiting
    note = sim.read_job().pending.get("n2") or n2.notes[-1]
    assert note is not None and "cannot reach" in note
    sim.heal_peers()
    settle(sim)
    last = max(checks.results)
    assert checks.rounds[last].reason is RoundReason.SCALE_UP
    assert checks.results[last].nodes == ("n0", "n1", "n2") and checks.restarts == 1
    assert n2.notes[-1] is None  # its note is cleared once it runs again


def test_a_cut_leader_hands_the_round_on() -> None:
    """n2 joins the next round first, so it leads it: it reaches neither other joiner, withdraws,
    and n0 (the next oldest) closes the round without it; n2 rejoins after its backoff, is left
    out by n0's probe, and waits."""
    sim, checks = running((2, 4))
    sim.cut_peers(2)
    hang_timeout(sim)
    for _ in range(30):
        sim.tick([2, 0, 1, 3, 4])
        sim.advance(0.25)
    assert checks.results[1].nodes == ("n0", "n1") and checks.restarts == 1
    notes = sim.node("n2").notes
    assert any(n and "another leads" in n for n in notes), notes
    sim.heal_peers()
    settle(sim)
    assert checks.results[max(checks.results)].nodes == ("n0", "n1", "n2")


def test_a_round_short_of_min_waits_for_the_cut_node_then_closes_when_healed() -> None:
    spec = fakes.make_spec(
        nnodes=NodeRange(3, 4), max_restarts=3, stop_grace_s=1.0, last_call_s=0.5, join_timeout_s=60.0
    )
    sim, checks = new_sim(spec, 3)
    settle(sim)
    sim.cut_peers(2)
    hang_timeout(sim)
    run(sim, 24)
    assert 1 not in checks.results  # it waits: only 2 of the 3 needed are reachable
    read = sim.read_job()
    assert any("waits" in (note or "") for n in sim.nodes for note in n.notes[-1:]), read.pending
    sim.heal_peers()
    settle(sim)
    assert checks.results[1].nodes == ("n0", "n1", "n2") and checks.restarts == 1


def test_a_cut_below_min_fails_the_round_at_the_join_timeout() -> None:
    spec = make_spec((3, 4))
    sim, checks = new_sim(spec, 3)
    settle(sim)
    sim.cut_peers(1)
    hang_timeout(sim)
    run(sim, 40)
    assert checks.final is not None and checks.final.code.value == "join_timeout", checks.final
    assert 1 not in checks.results


def test_unreached_nodes_never_run_together() -> None:
    """Two nodes cut from everyone (each from the other too) in a 2..4 job of 4: the round runs on
    the two that reach each other."""
    sim, checks = new_sim(make_spec((2, 4)), 4)
    settle(sim)
    sim.cut_peers(2)
    sim.cut_peers(3)
    hang_timeout(sim, 4)
    run(sim, 40)
    assert checks.results[max(checks.results)].nodes == ("n0", "n1")
    settle(sim)
    assert set(checks.results[max(checks.results)].nodes) == {"n0", "n1", "n2", "n3"}

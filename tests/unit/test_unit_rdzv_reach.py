"""``rendezvous.reach``: whom a round's leader may take in, and when a node outside may ask back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from elasticd.rendezvous.model import Join, Member
from elasticd.rendezvous.reach import PROBE_FRESH_S, Admit, Reach, admit, ready, targets

NOW = 1000.0


def joins(n: int, ports: bool = True) -> list[Join]:
    return [
        Join(
            f"n{i}",
            f"10.0.0.{i + 1}",
            29500,
            1,
            create_revision=10 + i,
            liveness_port=4000 + i if ports else 0,
        )
        for i in range(n)
    ]


def seen(round_no: int, reached: set[str], unreached: set[str], at: float = NOW) -> Reach:
    return Reach(round_no, frozenset(reached), frozenset(unreached), at)


def test_the_leader_probes_every_other_joiner_first() -> None:
    got = admit(1, joins(3), "n0", None, 2, now=NOW, deadline=NOW + 60)
    assert got.verdict is Admit.PROBE
    assert got.targets == (("n1", "10.0.0.2", 4001), ("n2", "10.0.0.3", 4002))


def test_a_stale_or_partial_probe_is_repeated() -> None:
    old = seen(1, {"n1", "n2"}, set(), at=NOW - PROBE_FRESH_S)
    assert admit(1, joins(3), "n0", old, 2, now=NOW, deadline=NOW + 60).verdict is Admit.PROBE
    partial = seen(1, {"n1"}, set())
    assert admit(1, joins(3), "n0", partial, 2, now=NOW, deadline=NOW + 60).verdict is Admit.PROBE
    other_round = seen(0, {"n1", "n2"}, set())
    assert admit(1, joins(3), "n0", other_round, 2, now=NOW, deadline=NOW + 60).verdict is Admit.PROBE


def test_nodes_without_a_liveness_port_are_not_probed() -> None:
    got = admit(1, joins(3, ports=False), "n0", None, 2, now=NOW, deadline=NOW + 60)
    assert got.verdict is Admit.GO and len(got.joins) == 3


def test_an_unreachable_joiner_is_left_out() -> None:
    got = admit(1, joins(3), "n0", seen(1, {"n1"}, {"n2"}), 2, now=NOW, deadline=NOW + 60)
    assert got.verdict is Admit.GO and [j.node for j in got.joins] == ["n0", "n1"]
    assert got.left_out == ("n2",) and "n2" in got.why


def test_a_leader_that_reaches_no_majority_withdraws() -> None:
    got = admit(1, joins(3), "n0", seen(1, set(), {"n1", "n2"}), 1, now=NOW, deadline=NOW + 60)
    assert got.verdict is Admit.WITHDRAW and "another leads" in got.why


def test_with_one_other_joiner_the_leader_keeps_the_round() -> None:
    got = admit(1, joins(2), "n0", seen(1, set(), {"n1"}), 1, now=NOW, deadline=NOW + 60)
    assert got.verdict is Admit.GO and [j.node for j in got.joins] == ["n0"]


def test_too_few_reachable_waits_then_fails_at_the_join_timeout() -> None:
    probe = seen(1, {"n1"}, {"n2"})
    wait = admit(1, joins(3), "n0", probe, 3, now=NOW, deadline=NOW + 60)
    assert wait.verdict is Admit.WAIT and wait.recheck_at == NOW + PROBE_FRESH_S and "waits" in wait.why
    late = admit(1, joins(3), "n0", probe, 3, now=NOW + 1, deadline=NOW + 1)
    assert late.verdict is Admit.FAIL


def members(n: int) -> list[Member]:
    return [Member(f"n{i}", f"10.0.0.{i + 1}", i, i, 1, 4000 + i) for i in range(n)]


def test_a_node_outside_asks_back_only_once_it_reaches_every_member() -> None:
    ms = members(2)
    assert ready(3, ms, "n5", None, NOW).verdict is Admit.PROBE
    cut = ready(3, ms, "n5", seen(3, {"n0"}, {"n1"}), NOW)
    assert cut.verdict is Admit.WAIT and "n1" in cut.why and cut.recheck_at == NOW + PROBE_FRESH_S
    assert ready(3, ms, "n5", seen(3, {"n0", "n1"}, set()), NOW).verdict is Admit.GO


@given(
    n=st.integers(1, 6),
    cut=st.sets(st.integers(0, 5)),
    leader=st.integers(0, 5),
    min_nodes=st.integers(1, 6),
)
def test_a_round_never_takes_a_node_its_leader_cannot_reach(
    n: int, cut: set[int], leader: int, min_nodes: int
) -> None:
    """With a fresh probe: GO takes no unreached node, the leader and at least MIN; a withdrawal
    only when a majority of two or more others is unreached; nothing else is a GO."""
    js = joins(n)
    me = f"n{leader % n}"
    others = {j.node for j in js} - {me}
    unreached = {f"n{i}" for i in cut if i < n} & others
    probe = seen(1, others - unreached, unreached)
    got = admit(1, js, me, probe, min_nodes, now=NOW, deadline=NOW + 60)
    if got.verdict is Admit.GO:
        taken = {j.node for j in got.joins}
        assert not taken & unreached and me in taken and len(taken) >= min(min_nodes, n)
        assert taken | unreached == {j.node for j in js}
    elif got.verdict is Admit.WITHDRAW:
        assert len(others) >= 2 and 2 * len(unreached) > len(others)
    else:
        assert got.verdict is Admit.WAIT and len(js) - len(unreached) < min_nodes
    assert (targets(js, me) and {t[0] for t in targets(js, me)} == others) or n == 1

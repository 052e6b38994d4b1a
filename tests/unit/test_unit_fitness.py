"""The pre-flight node check: who is far below its peers (pure), the check program's answers read
as untrusted input, and the program itself on loopback."""

from __future__ import annotations

import asyncio
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.jobs.nodecheck import CheckFailed, CheckServer, Runner, parse_probe, parse_served, probe
from elasticd.rendezvous import fitness
from elasticd.rendezvous.fitness import Checked, Link, admit, unfit
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.reach import Admit


def _join(node: str, compute: float | None = 100.0, port: int = 4000) -> Join:
    return Join(node, "127.0.0.1", 29500, 1, check_port=port, compute=compute)


def test_unfit_names_the_node_far_below_its_peers_and_why() -> None:
    assert unfit({"a": 100.0, "b": 95.0, "c": 30.0}, {}) == {
        "c": "compute 30 against its peers' 97.5 (0.31x)"
    }
    assert unfit({"a": 100.0, "b": 40.0}, {}) == {"b": "compute 40 against its peers' 100 (0.40x)"}
    assert unfit({"a": 100.0, "b": 60.0}, {}) == {}
    links = {"b": Link(0.0002, 1e9), "c": Link(0.0003, 2e8), "d": Link(0.0002, 1.1e9)}
    assert list(unfit({}, links)) == ["c"] and "bandwidth" in unfit({}, links)["c"]
    slow = {"b": Link(0.0002, 1e9), "c": Link(0.050, 1e9), "d": Link(0.0003, 1e9)}
    assert list(unfit({}, slow)) == ["c"] and "latency 50.00 ms" in unfit({}, slow)["c"]
    assert unfit({"a": None}, {"b": Link(error="refused")}) == {
        "a": "its check did not start",
        "b": "its network check failed: refused",
    }


def test_one_link_alone_judges_nothing() -> None:
    assert unfit({}, {"b": Link(0.5, 10.0)}) == {}


def test_admit_measures_first_then_leaves_out_the_slow_node() -> None:
    joins = [_join("a"), _join("b", 20.0), _join("c")]
    first = admit(0, joins, "a", None, 1, now=100.0, deadline=700.0)
    assert first.verdict is Admit.PROBE and {t[0] for t in first.targets} == {"b", "c"}
    checked = Checked(0, {"b": Link(0.001, 1e9), "c": Link(0.001, 1e9)}, 100.0)
    got = admit(0, joins, "a", checked, 1, now=101.0, deadline=700.0)
    assert got.verdict is Admit.GO and [j.node for j in got.joins] == ["a", "c"] and got.left_out == ("b",)
    assert "left out by the node check: b: compute 20" in got.why
    stale = admit(0, joins, "a", checked, 1, now=100.0 + fitness.CHECK_FRESH_S, deadline=700.0)
    assert stale.verdict is Admit.PROBE


def test_a_round_short_of_fit_nodes_waits_then_fails_and_a_slow_leader_withdraws() -> None:
    joins = [_join("a"), _join("b", 20.0)]
    checked = Checked(0, {"b": Link(0.001, 1e9)}, 100.0)
    wait = admit(0, joins, "a", checked, 2, now=101.0, deadline=700.0)
    assert wait.verdict is Admit.WAIT and wait.recheck_at == 101.0 + fitness.RECHECK_S
    late = Checked(0, checked.links, 700.5)
    assert admit(0, joins, "a", late, 2, now=701.0, deadline=700.0).verdict is Admit.FAIL
    slow_leader = [_join("a", 20.0), _join("b")]
    out = admit(0, slow_leader, "a", Checked(0, {"b": Link(0.001, 1e9)}, 100.0), 1, now=101.0, deadline=700.0)
    assert out.verdict is Admit.WITHDRAW and out.left_out == ("a",)


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.one_of(st.none(), st.floats(0, 1e6)), min_size=1),
    st.integers(1, 6),
)
def test_admit_never_keeps_an_unfit_node_nor_goes_below_min(
    compute: dict[str, float | None], least: int
) -> None:
    nodes = sorted(compute)
    joins = [_join(n, compute[n]) for n in nodes]
    checked = Checked(0, {n: Link(0.001, 1e9) for n in nodes}, 0.0)
    got = admit(0, joins, nodes[0], checked, least, now=1.0, deadline=10.0)
    bad = unfit(compute, {n: lk for n, lk in checked.links.items() if n != nodes[0]})
    if got.verdict is Admit.GO:
        kept = {j.node for j in got.joins}
        assert not kept & set(bad)
        assert len(kept) >= least or not bad  # (a round short of MIN with nobody left out: reach's business)
    else:
        assert bad


def test_answers_are_read_as_untrusted() -> None:
    assert parse_served(b'{"compute": 1.5e6, "port": 4242}\n') == (4242, 1.5e6)
    for bad in (b"x", b"[]", b'{"port": 0, "compute": 1}', b'{"port": 80, "compute": -1}',
                b'{"port": 80, "compute": NaN}', b'{"port": true, "compute": 1}'):  # fmt: skip
        with pytest.raises(CheckFailed):
            parse_served(bad)
    asked = {"10.0.0.2:4000": "b", "10.0.0.3:4000": "c"}
    line = b'{"peers": {"10.0.0.2:4000": {"rtt_s": 0.001, "bytes_per_s": 1e9},'
    line += b' "10.0.0.3:4000": {"error": "refused"}, "6.6.6.6:1": {"rtt_s": 0, "bytes_per_s": 0}}}'
    assert parse_probe(line, asked) == {"b": Link(0.001, 1e9), "c": Link(error="refused")}
    with pytest.raises(CheckFailed):
        parse_probe(b'{"peers": {"10.0.0.2:4000": {"rtt_s": "fast", "bytes_per_s": 1}}}', asked)


@pytest.mark.timeout(60)
def test_the_check_program_measures_a_real_server_on_loopback() -> None:
    runner = Runner("/usr/bin/python3", None, os.getcwd())

    async def run() -> tuple[CheckServer, dict[str, Link], dict[str, Link]]:
        server = await CheckServer.start(runner, "127.0.0.1", 30.0)
        try:
            links = await probe(runner, [("b", "127.0.0.1", server.port)])
            gone = await probe(runner, [("c", "127.0.0.1", 1)])  # nothing listens on port 1
        finally:
            await server.close()
        return server, links, gone

    server, links, gone = asyncio.run(run())
    assert server.compute > 1e5
    link = links["b"]
    assert not link.error and link.rtt_s is not None and link.bytes_per_s is not None
    assert link.rtt_s < 0.1 and link.bytes_per_s > 1e7
    assert gone["c"].error

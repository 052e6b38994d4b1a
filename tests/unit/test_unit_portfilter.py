"""The port filter's pure rules and its owner, against the in-memory nft."""

from __future__ import annotations

import asyncio
import ipaddress

from elasticd.portfilter.guard import PortFilter
from elasticd.portfilter.memory import MemoryNft
from elasticd.portfilter.rules import (
    MAX_MEMBERS,
    Guard,
    Mode,
    Ruleset,
    commands,
    desired,
    parse_members,
    rule_count,
)

A = ipaddress.ip_address


def test_members_from_etcd_are_addresses_only_and_bounded() -> None:
    kept, refused = parse_members(["10.0.0.1", "::1", "host.example", 7, "0.0.0.0", "x" * 500])
    assert kept == {A("10.0.0.1"), A("::1")}
    assert len(refused) == 4 and all(len(r) <= 80 for r in refused)
    many, cut = parse_members(str(ipaddress.IPv4Address(0x0A000000 + i)) for i in range(MAX_MEMBERS + 3))
    assert len(many) == MAX_MEMBERS and len(cut) == 3


def test_root_is_never_filtered_and_users_merge_their_jobs() -> None:
    guards = {
        "a": Guard("a", 1001, frozenset({A("10.0.0.1")}), frozenset({(A("127.0.0.1"), 29500)})),
        "b": Guard("b", 1001, frozenset({A("10.0.0.2")})),
        "r": Guard("r", 0, frozenset({A("10.0.0.3")})),
    }
    want = desired(guards)
    assert [u.uid for u in want.users] == [1001]
    assert want.users[0].members == {A("10.0.0.1"), A("10.0.0.2")}


def test_rules_per_user_are_fixed_whatever_the_members_and_listeners() -> None:
    one = commands(desired({"a": Guard("a", 1001)}))
    many_members = frozenset(A(f"10.0.{i // 250}.{i % 250 + 1}") for i in range(2000))
    big = commands(desired({"a": Guard("a", 1001, many_members, frozenset({(A("10.0.0.1"), 1)}))}))
    assert rule_count(one) == rule_count(big) == 16
    two = commands(desired({"a": Guard("a", 1001), "b": Guard("b", 1002)}))
    assert rule_count(two) == 32


def test_every_command_names_elasticds_table_and_nothing_else() -> None:
    batch = commands(desired({"a": Guard("a", 1001, frozenset({A("10.0.0.1")}))}))
    for cmd in batch:
        ((_, body),) = cmd.items()
        ((_, obj),) = body.items()
        assert obj["family"] == "inet" and obj.get("table", obj.get("name")) == "elasticd"
    assert commands(Ruleset(())) == batch[:2]  # nothing to filter: the table is deleted


def test_the_filter_rebuilds_on_each_change_and_leaves_no_table() -> None:
    async def run() -> None:
        nft = MemoryNft()
        pf = PortFilter(nft, Mode.ON)
        await pf.start()
        assert nft.table() is None and pf.status == "on (uid)"
        await pf.admit(Guard("a", 1001, frozenset({A("10.0.0.1")})))
        await pf.admit(Guard("a", 1001, frozenset({A("10.0.0.1")})))  # unchanged: no batch
        assert nft.batches == 2 and pf.rules == 16
        await pf.listen(Guard("a", 1001, frozenset(), frozenset({(A("127.0.0.1"), 29500)})))
        sets = [o["set"] for o in nft.table() or [] if "set" in o]
        assert next(s for s in sets if s["name"] == "m4_1001")["elem"] == ["10.0.0.1"]  # kept
        assert next(s for s in sets if s["name"] == "l4_1001")["elem"] == [{"concat": ["127.0.0.1", 29500]}]
        await pf.release("a")
        assert nft.table() is None
        await pf.admit(Guard("b", 1002))
        await pf.close()
        assert nft.table() is None

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_refused_batch_is_logged_and_the_filter_says_off_when_it_cannot_start() -> None:
    async def run() -> None:
        nft = MemoryNft()
        nft.fail_next = "Operation not permitted"
        pf = PortFilter(nft, Mode.ON)
        await pf.start()
        assert pf.mode is Mode.OFF and pf.status == "off: nft refused: Operation not permitted"
        await pf.admit(Guard("a", 1001))
        assert nft.table() is None
        assert PortFilter.disabled("port_filter is off").status == "off: port_filter is off"

    asyncio.run(asyncio.wait_for(run(), 10))

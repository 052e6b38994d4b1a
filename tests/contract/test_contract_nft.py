"""One contract for the nft seam: ``NftCli`` (the real ``nft -j``, as root), ``NftLib`` (the real
libnftables in-process, as root) and ``MemoryNft``."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator

import pytest

from elasticd.portfilter.libnft import NftLib
from elasticd.portfilter.memory import MemoryNft
from elasticd.portfilter.nft import Nft, NftCli, NftError
from elasticd.portfilter.rules import Guard, Ruleset, commands, desired

A = ipaddress.ip_address
# One table per host: the real implementations' tests and the filter's other tests must not
# replace it under each other (packaging/test.sh runs --dist loadgroup).
pytestmark = pytest.mark.xdist_group("nft")


def _real(kind: str) -> Nft:
    nft: Nft | None = NftCli.find() if kind == "nft" else NftLib.find()
    if nft is None:
        pytest.skip(f"no {kind}: apt-get install nftables (packaging/test.sh does where apt works)")
    if os.geteuid() != 0:
        pytest.skip("nft needs root (CAP_NET_ADMIN)")
    return nft


@pytest.fixture(params=["memory", "nft", "libnftables"])
def nft(request: pytest.FixtureRequest) -> Iterator[Nft]:
    impl = MemoryNft() if request.param == "memory" else _real(request.param)
    impl.apply(commands(Ruleset(())))
    yield impl
    impl.apply(commands(Ruleset(())))


def _names(listed: list[dict]) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {(k, o["name"]) for item in listed for k, o in item.items() if k in ("set", "chain")}


def test_a_batch_makes_the_table_and_an_empty_one_removes_it(nft: Nft) -> None:
    assert nft.table() is None
    guard = Guard("a", 4242, frozenset({A("10.0.0.1"), A("fd00::1")}), frozenset({(A("127.0.0.1"), 29500)}))
    nft.apply(commands(desired({"a": guard})))
    listed = nft.table()
    assert listed is not None
    assert {("chain", "input"), ("chain", "output"), ("chain", "out_4242"), ("set", "m4_4242")} <= _names(
        listed
    )
    nft.apply(commands(Ruleset(())))
    assert nft.table() is None


def test_a_second_batch_replaces_the_first_whole(nft: Nft) -> None:
    nft.apply(commands(desired({"a": Guard("a", 4242)})))
    nft.apply(commands(desired({"b": Guard("b", 4343)})))
    names = _names(nft.table() or [])
    assert ("chain", "out_4343") in names and ("chain", "out_4242") not in names


def test_a_refused_batch_changes_nothing(nft: Nft) -> None:
    nft.apply(commands(desired({"a": Guard("a", 4242)})))
    before = _names(nft.table() or [])
    stray = {"family": "inet", "table": "elasticd", "chain": "nowhere", "expr": [{"accept": None}]}
    bad = [*commands(desired({"b": Guard("b", 4343)})), {"add": {"rule": stray}}]
    with pytest.raises(NftError):
        nft.apply(bad)
    assert _names(nft.table() or []) == before

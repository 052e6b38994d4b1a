"""The suite's policy for which etcd client each test daemon talks through (tests/etcd_clients.py)."""

from __future__ import annotations

import pytest

from tests.etcd_clients import ENV, NO_GRPC, policy


def test_mixed_is_the_default_and_alternates_gateway_first() -> None:
    p = policy({}, has_grpc=True)
    assert (p.asked, p.mode, p.reason) == ("mixed", "mixed", "")
    assert [p.client(i) for i in range(4)] == ["gateway", "grpc", "gateway", "grpc"]
    assert "mixed" in p.header() and "instead" not in p.header()


@pytest.mark.parametrize("mode", ["gateway", "grpc"])
def test_one_client_for_every_daemon(mode: str) -> None:
    p = policy({ENV: mode}, has_grpc=True)
    assert {p.client(i) for i in range(3)} == {mode}
    assert f"{mode} for every daemon" in p.header()


def test_without_the_grpc_extra_mixed_falls_back_to_the_gateway_and_says_why() -> None:
    p = policy({ENV: "mixed"}, has_grpc=False)
    assert (p.mode, p.reason) == ("gateway", NO_GRPC)
    assert {p.client(i) for i in range(3)} == {"gateway"}
    assert "instead of mixed" in p.header() and NO_GRPC in p.header()
    assert policy({ENV: "gateway"}, has_grpc=False).reason == ""


def test_asking_for_grpc_without_the_extra_or_for_no_such_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="grpc extra is not installed"):
        policy({ENV: "grpc"}, has_grpc=False)
    with pytest.raises(ValueError, match="must be one of mixed, gateway, grpc"):
        policy({ENV: "both"}, has_grpc=True)

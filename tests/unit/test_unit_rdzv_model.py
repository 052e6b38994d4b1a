"""elasticd.rendezvous.model: which round reasons spend the budget, and the JSON forms of the records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from elasticd.rendezvous.model import Join, Member, RoundInfo, RoundReason, RoundResult


def _via_json(data: dict[str, Any]) -> dict[str, Any]:
    """What a reader gets back from etcd: the value is stored as JSON text."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    return out


@pytest.mark.parametrize(
    ("reason", "spends"),
    [
        (RoundReason.START, False),
        (RoundReason.WORKER_FAILED, True),
        (RoundReason.MEMBER_LOST, True),
        (RoundReason.SCALE_UP, False),
        (RoundReason.MEMBER_LEFT, False),
    ],
)
def test_spends_budget(reason: RoundReason, spends: bool) -> None:
    assert reason.spends_budget is spends


def test_every_reason_is_classified() -> None:
    assert {r for r in RoundReason if r.spends_budget} == {RoundReason.WORKER_FAILED, RoundReason.MEMBER_LOST}
    assert [r.value for r in RoundReason] == [
        "start",
        "worker_failed",
        "member_lost",
        "scale_up",
        "member_left",
    ]


_FAILURE = {
    "node": "n2",
    "attempt": 1,
    "rank": 5,
    "local_rank": 1,
    "exit_code": 1,
    "signal": None,
    "message": "boom",
    "output_tail": "Traceback ...\n",
}


@pytest.mark.parametrize(
    "info",
    [
        RoundInfo(0, RoundReason.START, 1700000000.25),
        RoundInfo(1, RoundReason.WORKER_FAILED, 1.5, ("n1", "n2"), "rank 5 failed", _FAILURE),
        RoundInfo(2, RoundReason.MEMBER_LOST, 2.0, ("n1",), "n2 lost"),
        RoundInfo(3, RoundReason.SCALE_UP, 3.0, ("n1", "n2", "n3")),
        RoundInfo(4, RoundReason.MEMBER_LEFT, 4.0, ("n1",), "n2 drained", None, 30.0),
        RoundInfo(5, RoundReason.MEMBER_LEFT, 5.0, grace_s=0.0),
    ],
    ids=lambda i: f"round{i.round}-{i.reason}",
)
def test_round_info_round_trip(info: RoundInfo) -> None:
    data = _via_json(info.to_json())
    assert RoundInfo.from_json(data) == info


def test_round_info_to_json_is_plain_json() -> None:
    info = RoundInfo(2, RoundReason.WORKER_FAILED, 10.0, ("a", "b"), "why", {"x": 1}, 7.5)
    assert info.to_json() == {
        "round": 2,
        "reason": "worker_failed",
        "opened_at": 10.0,
        "expect": ["a", "b"],
        "detail": "why",
        "failure": {"x": 1},
        "grace_s": 7.5,
    }
    assert type(info.to_json()["reason"]) is str


def test_round_info_from_json_defaults() -> None:
    info = RoundInfo.from_json({"round": 0, "reason": "start", "opened_at": 5})
    assert info == RoundInfo(0, RoundReason.START, 5.0)
    assert info.expect == () and info.detail == "" and info.failure is None and info.grace_s is None
    assert isinstance(info.opened_at, float)


def test_round_info_from_json_coerces_types() -> None:
    info = RoundInfo.from_json({"round": "7", "reason": "scale_up", "opened_at": "1.5", "expect": ["n1"]})
    assert info.round == 7 and info.opened_at == 1.5
    assert info.expect == ("n1",)


def test_round_info_from_json_rejects_unknown_reason() -> None:
    with pytest.raises(ValueError):
        RoundInfo.from_json({"round": 1, "reason": "because", "opened_at": 0})


@pytest.mark.parametrize("revision", [0, 1, 99_999])
def test_join_round_trip(revision: int) -> None:
    join = Join("node-1", "10.0.0.1", 29500, 8, revision)
    data = _via_json(join.to_json())
    assert "create_revision" not in data  # it comes from etcd, it is not stored
    assert Join.from_json(data, revision) == join


def test_join_to_json() -> None:
    assert Join("a", "h", 1234, 2, 77, lease=5, liveness_port=4321).to_json() == {
        "node": "a",
        "address": "h",
        "port": 1234,
        "local_world_size": 2,
        "liveness_port": 4321,
    }


def test_join_from_json_coerces_numbers_and_takes_revision_from_caller() -> None:
    join = Join.from_json({"node": "a", "address": "h", "port": "1234", "local_world_size": "2"}, 42)
    assert join == Join("a", "h", 1234, 2, 42)


def _result(closed_at: float = 12.5) -> RoundResult:
    members = (
        Member("n1", "10.0.0.1", 0, 0, 4),
        Member("n2", "10.0.0.2", 1, 4, 2),
        Member("n3", "10.0.0.3", 2, 6, 1),
    )
    return RoundResult(3, members, 7, "10.0.0.1", 29500, closed_at)


def test_round_result_nodes_follow_members() -> None:
    result = _result()
    assert result.nodes == ("n1", "n2", "n3")
    assert RoundResult(0, (), 0, "", 0).nodes == ()


@pytest.mark.parametrize(("node", "rank"), [("n1", 0), ("n2", 1), ("n3", 2)])
def test_round_result_member_lookup(node: str, rank: int) -> None:
    member = _result().member(node)
    assert member is not None
    assert (member.node, member.group_rank) == (node, rank)


@pytest.mark.parametrize("node", ["n4", "", "N1", "n"])
def test_round_result_member_missing(node: str) -> None:
    assert _result().member(node) is None


@pytest.mark.parametrize("closed_at", [0.0, 12.5, 1700000000.125])
def test_round_result_round_trip(closed_at: float) -> None:
    result = _result(closed_at)
    back = RoundResult.from_json(_via_json(result.to_json()))
    assert back == result
    assert back.nodes == result.nodes
    assert back.member("n2") == Member("n2", "10.0.0.2", 1, 4, 2)


def test_round_result_to_json() -> None:
    data = _result().to_json()
    assert "nodes" not in data  # derived, not stored
    assert data["members"][1] == {
        "node": "n2",
        "address": "10.0.0.2",
        "group_rank": 1,
        "rank_offset": 4,
        "local_world_size": 2,
        "liveness_port": 0,
    }
    assert {k: v for k, v in data.items() if k != "members"} == {
        "round": 3,
        "world_size": 7,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "closed_at": 12.5,
    }


def test_round_result_from_json_without_closed_at() -> None:
    data = _result().to_json()
    del data["closed_at"]
    back = RoundResult.from_json(data)
    assert back.closed_at == 0.0
    assert back == _result(0.0)

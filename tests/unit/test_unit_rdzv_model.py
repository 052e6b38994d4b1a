"""elasticd.rendezvous.model: which round reasons spend the budget, and the JSON forms of the records."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from elasticd.decode import DecodeError
from elasticd.rendezvous import roster
from elasticd.rendezvous.decider import build_result
from elasticd.rendezvous.model import (
    Assignment,
    DrainRecord,
    FinalRecord,
    Join,
    Member,
    NodeStatus,
    RoundHead,
    RoundInfo,
    RoundResult,
)
from elasticd.terms.state import EndReason, JobState, RoundReason


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
        "gpu_failed",
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
    info = RoundInfo(2, RoundReason.WORKER_FAILED, 10.0, ("a", "b"), "why", _FAILURE, 7.5)
    assert info.to_json() == {
        "round": 2,
        "reason": "worker_failed",
        "opened_at": 10.0,
        "expect": ["a", "b"],
        "detail": "why",
        "failure": _FAILURE,
        "grace_s": 7.5,
        "repeats": 0,
        "expect_members": False,
    }
    assert type(info.to_json()["reason"]) is str


def test_round_info_from_json_defaults() -> None:
    info = RoundInfo.from_json({"round": 0, "reason": "start", "opened_at": 5})
    assert info == RoundInfo(0, RoundReason.START, 5.0)
    assert info.expect == () and info.detail == "" and info.failure is None and info.grace_s is None
    assert isinstance(info.opened_at, float)


def test_round_info_from_json_ignores_unknown_fields() -> None:
    """A newer daemon may store more; an older one reads what it knows."""
    info = RoundInfo.from_json(
        {"round": 7, "reason": "scale_up", "opened_at": 1.5, "expect": ["n1"], "new": 1}
    )
    assert info == RoundInfo(7, RoundReason.SCALE_UP, 1.5, ("n1",))


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"round": "7", "reason": "scale_up", "opened_at": 1.5}, "round"),  # no coercion from text
        ({"round": 1, "reason": "because", "opened_at": 0}, "reason"),
        ({"round": -1, "reason": "start", "opened_at": 0}, "round"),
        ({"round": True, "reason": "start", "opened_at": 0}, "round"),
        ({"reason": "start", "opened_at": 0}, "round"),
        ({"round": 1, "reason": "start", "opened_at": "1.5"}, "opened_at"),
        ({"round": 1, "reason": "start", "opened_at": 0, "expect": ["a b"]}, "expect"),
        ({"round": 1, "reason": "start", "opened_at": 0, "expect": "n1"}, "expect"),
        ({"round": 1, "reason": "start", "opened_at": 0, "grace_s": 3601}, "grace_s"),
        ({"round": 1, "reason": "start", "opened_at": 0, "failure": {"x": 1}}, "failure"),
        ({"round": 1, "reason": "start", "opened_at": 0, "failure": []}, "failure"),
    ],
)
def test_round_info_from_json_rejects(data: Any, where: str) -> None:
    with pytest.raises(DecodeError, match=where):
        RoundInfo.from_json(data)


@pytest.mark.parametrize("data", [None, [], "round", 5])
def test_round_info_from_json_non_object(data: Any) -> None:
    with pytest.raises(DecodeError):
        RoundInfo.from_json(data)


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
        "store": False,
    }


def test_join_from_json_takes_revision_and_lease_from_caller() -> None:
    data = {"node": "a", "address": "h", "port": 1234, "local_world_size": 2, "create_revision": 9}
    assert Join.from_json(data, 42, 7) == Join("a", "h", 1234, 2, 42, 7)


@pytest.mark.parametrize(
    "change",
    [
        {"port": "1234"},
        {"port": 0},
        {"port": 70000},
        {"local_world_size": "2"},
        {"local_world_size": 0},
        {"local_world_size": 100_000},
        {"node": "bad node"},
        {"node": None},
        {"address": ""},
        {"address": "h\x00"},
        {"liveness_port": -1},
        {"store": "yes"},
    ],
    ids=repr,
)
def test_join_from_json_rejects(change: dict[str, Any]) -> None:
    data = {"node": "a", "address": "h", "port": 1234, "local_world_size": 2} | change
    with pytest.raises(DecodeError, match=next(iter(change))):
        Join.from_json(data)


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


@pytest.mark.parametrize(("node", "rank"), [("n1", 0), ("n2", 1), ("n3", 2)])
def test_round_result_member_lookup(node: str, rank: int) -> None:
    member = _result().member(node)
    assert member is not None
    assert (member.node, member.group_rank) == (node, rank)


@pytest.mark.parametrize("node", ["n4", "", "N1", "n"])
def test_round_result_member_missing(node: str) -> None:
    assert _result().member(node) is None


def _stored(result: RoundResult) -> RoundResult:
    """``result`` through etcd: its head and its assignments as JSON, assembled again."""
    head = RoundHead.from_json(_via_json(result.head().to_json()))
    found = [Assignment.from_json(_via_json(a.to_json())) for a in roster.assignments(result)]
    return roster.assemble(head, found)


@pytest.mark.parametrize("closed_at", [0.0, 12.5, 1700000000.125])
def test_round_result_round_trip(closed_at: float) -> None:
    result = _result(closed_at)
    back = _stored(result)
    assert back == result
    assert back.nodes == result.nodes
    assert back.member("n2") == Member("n2", "10.0.0.2", 1, 4, 2)


def test_round_head_to_json() -> None:
    assert _result().head().to_json() == {
        "round": 3,
        "epoch": 0,
        "size": 3,
        "world_size": 7,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "closed_at": 12.5,
        "agent_store": False,
    }


def test_the_leaders_store_host_is_the_rounds_and_etcd_keeps_it() -> None:
    """Group rank 0's join decides for every member (``jobs.agentstore``), through etcd too."""
    joins = [Join("n1", "10.0.0.1", 29500, 4, 1, store=True), Join("n2", "10.0.0.2", 29600, 2, 2)]
    result = build_result(3, joins, 12.5)
    assert result.agent_store and result.head().agent_store and result.master_port == 29500
    assert _stored(result).agent_store
    assert not build_result(3, joins[::-1], 12.5).agent_store
    assert Join.from_json(_via_json(joins[0].to_json())).store


def test_records_without_a_store_say_rank_0_hosts_it() -> None:
    data = _result().head().to_json()
    del data["agent_store"]
    assert RoundHead.from_json(data).agent_store is False
    assert Join.from_json({"node": "a", "address": "h", "port": 1234, "local_world_size": 2}).store is False


def test_round_head_from_json_without_closed_at() -> None:
    data = _result().head().to_json()
    del data["closed_at"]
    assert RoundHead.from_json(data).closed_at == 0.0


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(size=0),
        lambda d: d.update(world_size=2),
        lambda d: d.update(world_size=7 * 2000),
        lambda d: d.update(master_addr="bad addr"),
        lambda d: d.update(master_port=0),
        lambda d: d.update(round=-1),
        lambda d: d.update(epoch=-1),
        lambda d: d.pop("size"),
    ],
)
def test_round_head_from_json_rejects_nonsense(mutate: Any) -> None:
    data = _via_json(_result().head().to_json())
    mutate(data)
    with pytest.raises(DecodeError):
        RoundHead.from_json(data)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda h, a: a.pop(),  # a member's assignment is missing
        lambda h, a: a.append(a[0]),  # a rank twice
        lambda h, a: a.__setitem__(1, replace(a[1], member=replace(a[1].member, rank_offset=3))),
        lambda h, a: a.__setitem__(0, replace(a[0], member=replace(a[0].member, address="elsewhere"))),
        lambda h, a: a.__setitem__(2, replace(a[2], epoch=9)),  # another leader's: left out, so one short
    ],
)
def test_assemble_rejects_assignments_that_do_not_make_the_head(mutate: Any) -> None:
    result = _result()
    found = roster.assignments(result)
    mutate(result.head(), found)
    with pytest.raises(DecodeError):
        roster.assemble(result.head(), found)


def test_final_record_round_trip_and_a_record_without_its_code_is_refused() -> None:
    """Every daemon of this key layout writes the end code: a final record without one was not
    written by one, and is invalid like any other malformed record."""
    final = FinalRecord(JobState.FAILED, "no restarts left", EndReason.WORKER_FAILED, _FAILURE, 9.0)
    assert FinalRecord.from_json(_via_json(final.to_json())) == final
    assert final.to_json()["code"] == "worker_failed"
    codeless = {"state": "KILLED", "reason": "killed by u", "failure": None, "ended_at": 3.0}
    with pytest.raises(DecodeError):
        FinalRecord.from_json(codeless)


@pytest.mark.parametrize(
    "change",
    [
        {"state": "RUNNING"},
        {"state": "DONE"},
        {"code": "because"},
        {"failure": {"rank": 1}},
        {"ended_at": "x"},
    ],
    ids=repr,
)
def test_final_record_rejects(change: dict[str, Any]) -> None:
    data = {"state": "FAILED", "reason": "r", "code": "nodes_lost", "failure": None, "ended_at": 1.0} | change
    with pytest.raises(DecodeError):
        FinalRecord.from_json(data)


def test_drain_record() -> None:
    assert DrainRecord.from_json({"grace_s": 30, "at": 1.0, "by": "root"}) == DrainRecord(30.0, 1.0, "root")
    assert DrainRecord.from_json({}) == DrainRecord()
    bad: object
    for bad in ({"grace_s": -1}, {"grace_s": 3601}, {"grace_s": "5"}, {"at": None}, [], "drain"):
        with pytest.raises(DecodeError):
            DrainRecord.from_json(bad)


def test_node_status() -> None:
    data = {
        "state": "RUNNING",
        "round": 2,
        "devices": "0,1",
        "pids": [11, 12],
        "failure": None,
        "updated_at": 5.0,
    }
    assert NodeStatus.from_json(data) == NodeStatus("RUNNING", 2, "0,1", (11, 12), 5.0)
    for change in ({"pids": [0]}, {"pids": ["1"]}, {"state": "running"}, {"round": -2}, {"devices": "a b"}):
        with pytest.raises(DecodeError):
            NodeStatus.from_json(data | change)

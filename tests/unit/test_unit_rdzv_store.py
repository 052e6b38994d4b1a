"""elasticd.rendezvous.jobparse: one read of ``jobs/<job>/``, the job's parts (``parts/<job>/``:
joins, done markers, lead keys) and its rounds' assignments, parsed into a ``RostersRead``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from elasticd.etcd.keys import Keys
from elasticd.etcd.types import KeyValue
from elasticd.rendezvous import roster
from elasticd.rendezvous.jobparse import parse_rosters
from elasticd.rendezvous.jobread import InvalidKey, RostersRead
from elasticd.rendezvous.model import (
    DrainRecord,
    FinalRecord,
    Join,
    Member,
    NodeStatus,
    RoundInfo,
    RoundResult,
    WaitingRecord,
)
from elasticd.terms.spec import JobSpec, NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason
from tests import fakes

JOB = "train-0a1b2c3d"
KEYS = Keys()


def make_spec(**overrides: Any) -> JobSpec:
    return fakes.make_spec(
        **({"env": {"PATH": "/usr/bin"}, "nnodes": NodeRange(1, 3), "nodes": ("n1", "n2", "n3")} | overrides)
    )


class _Revs:
    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


def kv(rest: str, value: Any, create: int = 1, mod: int | None = None, keys: Keys = KEYS) -> KeyValue:
    return KeyValue(keys.job(JOB) + rest, json.dumps(value).encode(), create, mod or create, 0)


def join_kv(round_no: int, node: str, value: Any, create: int = 1, mod: int | None = None) -> KeyValue:
    """A join: among the job's parts (``parts/<job>/``), not its records."""
    return KeyValue(KEYS.join(JOB, round_no, node), json.dumps(value).encode(), create, mod or create, 0)


def part_kv(key: str, value: Any, create: int = 1) -> KeyValue:
    """A key outside ``jobs/<job>/`` (a status, a pending note, a done marker) of the job."""
    return KeyValue(key, json.dumps(value).encode(), create, create, 0)


def result_of(round_no: int, *nodes: str) -> RoundResult:
    members = tuple(Member(n, f"h-{n}", i, 2 * i, 2) for i, n in enumerate(nodes))
    return RoundResult(round_no, members, 2 * len(nodes), f"h-{nodes[0]}", 29500 + round_no, 5.0)


def result_kvs(round_no: int, *nodes: str, create: int = 1) -> list[KeyValue]:
    """A closed round as the leader writes it: its head and each member's assignment."""
    result = result_of(round_no, *nodes)
    out = [kv(f"rdzv/{round_no}/result", result.head().to_json(), create)]
    for a in roster.assignments(result):
        key = KEYS.assignment(JOB, round_no, a.member.node)
        out.append(KeyValue(key, json.dumps(a.to_json()).encode(), create, create, 0))
    return out


def join_json(node: str) -> dict[str, Any]:
    return Join(node, f"h-{node}", 29400, 2).to_json()


def parse(kvs: list[KeyValue], keys: Keys = KEYS) -> RostersRead:
    return parse_rosters(keys, JOB, kvs)


def test_parse_nothing() -> None:
    read = parse([])
    assert read.job_id == JOB
    assert read.head is None and read.round is None and read.final is None
    assert (read.round_mod, read.restarts, read.restarts_mod) == (0, 0, 0)
    assert read.results == {} and read.joins == {} and read.done == {} and read.left == {}
    assert read.waiting == {} and read.node_status == {} and read.pending == {} and read.drains == {}
    assert read.current == 0
    assert read.result is None
    assert read.current_joins == ()
    assert read.previous_result is None
    assert read.last_join_revision == 0


FAILURE = {
    "node": "n2",
    "attempt": 1,
    "rank": 1,
    "local_rank": 1,
    "exit_code": 1,
    "signal": None,
    "message": "boom",
    "output_tail": "",
}


def required() -> list[KeyValue]:
    """What every job has from its submission on."""
    info = RoundInfo(0, RoundReason.START, 1.0)
    return [kv("spec", fakes.head_of(make_spec()).to_json()), kv("round", info.to_json()), kv("restarts", 0)]


def test_parse_spec_round_and_restarts() -> None:
    spec = make_spec()
    info = RoundInfo(2, RoundReason.WORKER_FAILED, 50.0, ("n1", "n2"), "rank 1 failed", FAILURE, 3.0)
    read = parse(
        [
            kv("spec", fakes.head_of(spec).to_json(), create=3),
            kv("round", info.to_json(), create=3, mod=17),
            kv("restarts", 1, create=3, mod=15),
        ]
    )
    assert read.head == fakes.head_of(spec)
    assert read.round == info
    assert read.round_mod == 17  # the round's mod revision is the fencing token for bumps
    assert (read.restarts, read.restarts_mod) == (1, 15)
    assert read.current == 2
    assert read.invalid == () and not read.ended and read.found == 3


def test_parse_final() -> None:
    final = FinalRecord(JobState.FAILED, "no restarts left", EndReason.NODES_LOST, None, 9.0)
    read = parse([*required(), kv("final", final.to_json())])
    assert read.final == final and read.ended and read.invalid == ()


def test_parse_a_full_read() -> None:
    info = RoundInfo(2, RoundReason.SCALE_UP, 50.0, ("n1",))
    kvs = [
        kv("spec", fakes.head_of(make_spec()).to_json()),
        kv("restarts", 0),
        kv("round", info.to_json(), create=2, mod=30),
        *result_kvs(1, "n1", "n2"),
        join_kv(1, "n2", join_json("n2"), create=11),
        join_kv(1, "n1", join_json("n1"), create=10),
        part_kv(KEYS.done(JOB, 1, "n1"), {"at": 1.0}),
        kv("rdzv/2/left/n2", {"at": 2.0}),
        kv("rdzv/2/left/n4", {"at": 2.5}),
        # joins arrive in key order (by node name), not by create revision
        join_kv(2, "n1", join_json("n1"), create=41),
        join_kv(2, "n3", join_json("n3"), create=33),
        join_kv(2, "n9", join_json("n9"), create=37),
        kv("waiting/n3", {"at": 3.0}),
        part_kv(
            KEYS.node_status(JOB, "n1"),
            {"state": "RUNNING", "round": 1, "devices": "0,1", "pids": [11, 12], "updated_at": 4.0},
        ),
        part_kv(KEYS.pending_note(JOB, "n5"), "n5 is waiting for 2 free GPUs (0 of 8 free now)"),
        kv("drain/n2", {"grace_s": 30, "at": 5.0, "by": "root"}),
    ]
    read = parse(kvs)
    assert read.current == 2
    assert read.results == {1: result_of(1, "n1", "n2")}
    assert [x.node for x in read.joins[1]] == ["n1", "n2"]
    assert [(x.node, x.create_revision) for x in read.joins[2]] == [("n3", 33), ("n9", 37), ("n1", 41)]
    assert read.joins[2][0] == Join("n3", "h-n3", 29400, 2, 33)
    assert read.done == {1: {"n1"}}
    assert read.left == {2: {"n2", "n4"}}
    assert read.waiting == {"n3": WaitingRecord(3.0)}
    assert read.node_status == {"n1": NodeStatus("RUNNING", 1, "0,1", (11, 12), 4.0)}
    assert read.pending == {"n5": "n5 is waiting for 2 free GPUs (0 of 8 free now)"}
    assert read.drains == {"n2": DrainRecord(30.0, 5.0, "root")}
    assert read.invalid == ()
    # derived
    assert read.result is None  # round 2 is open
    assert read.current_joins == read.joins[2]
    assert read.previous_result == read.results[1]
    assert read.last_join_revision == 41


def test_parse_running_round() -> None:
    kvs = [
        kv("round", RoundInfo(1, RoundReason.MEMBER_LOST, 0.0).to_json()),
        *result_kvs(0, "a", "b"),
        join_kv(1, "b", join_json("b"), create=20),
        *result_kvs(1, "b"),
    ]
    read = parse(kvs)
    assert read.result is not None and read.result.nodes == ("b",)
    assert read.previous_result is not None and read.previous_result.nodes == ("a", "b")
    assert read.last_join_revision == 20


@pytest.mark.parametrize(
    ("current", "rounds_with_results", "want_result", "want_previous"),
    [
        (0, [], None, None),
        (0, [0], 0, None),
        (1, [0], None, 0),
        (3, [0, 1], None, 1),
        (3, [1, 3], 3, 1),
        (3, [0, 2, 3], 3, 2),
        (2, [0, 1, 3], None, 1),  # a result for a later round is never "previous"
        (5, [3], None, 3),  # history may have gaps (forgotten rounds)
        (12, [2, 10, 11], None, 11),  # numeric, not string, order
    ],
)
def test_result_and_previous_result(
    current: int, rounds_with_results: list[int], want_result: int | None, want_previous: int | None
) -> None:
    kvs = [kv("round", RoundInfo(current, RoundReason.MEMBER_LOST, 0.0).to_json())]
    kvs += [x for r in rounds_with_results for x in result_kvs(r, "a")]
    read = parse(kvs)
    assert (read.result.round if read.result else None) == want_result
    assert (read.previous_result.round if read.previous_result else None) == want_previous


def test_may_still_run_is_the_previous_members_with_a_live_join_and_not_done() -> None:
    """Of round 0's members a, b, c, d: b is done, and c's join went with its lease (it was fenced
    or died); a and d may still run their workers, whatever round 1's joins say."""
    kvs = [
        kv("round", RoundInfo(1, RoundReason.WORKER_FAILED, 0.0).to_json()),
        *result_kvs(0, "a", "b", "c", "d"),
        *(join_kv(0, n, join_json(n), create=10 + i) for i, n in enumerate("abd")),
        part_kv(KEYS.done(JOB, 0, "b"), {"at": 1.0}),
        join_kv(1, "a", join_json("a"), create=20),
    ]
    assert parse(kvs).may_still_run == {"a", "d"}
    assert parse(kvs[:1]).may_still_run == set()  # no previous round


def test_last_join_revision_counts_only_the_current_round() -> None:
    kvs = [
        kv("round", RoundInfo(1, RoundReason.SCALE_UP, 0.0).to_json()),
        join_kv(0, "a", join_json("a"), create=90),
        join_kv(2, "b", join_json("b"), create=95),  # a round that is not open (yet)
        join_kv(1, "c", join_json("c"), create=50),
        join_kv(1, "d", join_json("d"), create=60),
    ]
    read = parse(kvs)
    assert read.last_join_revision == 60
    assert [x.node for x in read.current_joins] == ["c", "d"]


def test_last_join_revision_without_current_joins() -> None:
    kvs = [
        kv("round", RoundInfo(3, RoundReason.SCALE_UP, 0.0).to_json()),
        join_kv(2, "a", join_json("a"), create=90),
    ]
    read = parse(kvs)
    assert read.current_joins == ()
    assert read.last_join_revision == 0


def test_current_joins_without_round_is_round_zero() -> None:
    read = parse([join_kv(0, "a", join_json("a"), create=4)])
    assert read.current == 0
    assert [x.node for x in read.current_joins] == ["a"]
    assert read.last_join_revision == 4


def test_join_under_another_nodes_name_is_invalid() -> None:
    read = parse([*required(), join_kv(0, "key-name", join_json("value-name"), create=4, mod=6)])
    assert read.current_joins == ()
    assert [(k.key, k.revision) for k in read.invalid] == [(f"parts/{JOB}/0/join/key-name", 6)]
    assert "value-name" in read.invalid[0].why and read.ended


@pytest.mark.parametrize(
    "rest",
    [
        "unknown",
        "spec/extra",
        "rdzv/1/other/n1",
        "rdzv/1/join",
        "rdzv/1/join/n1/extra",
        "rdzv/1/join/n1",  # where v1 kept joins
        "nodes/n1",  # ... statuses
        "pending/n1",  # ... and pending notes
        "waiting",
        "waiting/n1/extra",
        "nodes/n1/extra",
        "drain",
    ],
)
def test_unknown_keys_are_invalid(rest: str) -> None:
    read = parse([*required(), kv(rest, {"node": "n1"}, mod=9)])
    assert read.invalid == (InvalidKey(f"jobs/{JOB}/{rest}", read.invalid[0].why, 9),)
    assert read.head == fakes.head_of(make_spec()) and read.round is not None  # the rest is read as usual


def test_parse_with_another_prefix() -> None:
    keys = Keys("/custom/p")
    info = RoundInfo(0, RoundReason.START, 0.0)
    read = parse(
        [kv("round", info.to_json(), mod=3, keys=keys), kv("waiting/n2", {"at": 1}, keys=keys)], keys=keys
    )
    assert read.round == info and read.round_mod == 3
    assert read.waiting == {"n2": WaitingRecord(1.0)}
    assert [k.key for k in read.invalid] == [f"jobs/{JOB}/restarts", f"jobs/{JOB}/spec"]  # missing


def test_parse_is_order_independent() -> None:
    revs = _Revs()
    kvs = [
        kv("spec", fakes.head_of(make_spec()).to_json(), create=revs.next()),
        kv("round", RoundInfo(1, RoundReason.MEMBER_LOST, 0.0).to_json(), create=revs.next()),
        *result_kvs(0, "n1", "n2", create=revs.next()),
        *(join_kv(1, n, join_json(n), create=revs.next()) for n in ("n2", "n3", "n1")),
        part_kv(KEYS.done(JOB, 0, "n1"), {"at": 1}, create=revs.next()),
    ]
    assert parse(kvs) == parse(list(reversed(kvs)))
    assert [x.node for x in parse(list(reversed(kvs))).current_joins] == ["n2", "n3", "n1"]

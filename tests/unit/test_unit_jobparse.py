"""``jobparse`` on untrusted etcd contents: it never raises, and it names every bad key."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.etcd.keys import Keys
from elasticd.etcd.types import KeyValue
from elasticd.jobs.admission import Admission, admit, refuse
from elasticd.jobs.view import job_view
from elasticd.rendezvous import roster
from elasticd.rendezvous.decider import build_result
from elasticd.rendezvous.jobparse import parse_job, parse_member, parse_rosters
from elasticd.rendezvous.jobread import JobRead, RostersRead
from elasticd.rendezvous.model import Join, NodeStatus, RoundInfo
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import EndReason, RoundReason
from tests import fakes
from tests.strategies import stored_values

JOB = fakes.JOB
KEYS = Keys("/t/p")
NODE = "n1"
ORPHAN_REASON = "every node of round 0 was lost"


PARTS = "parts:"  # a key ``parts:<rest>`` is ``parts/<job>/<rest>``, among the job's parts
ROUNDS = "rounds:"  # a key ``rounds:<rest>`` is ``rounds/<job>/<rest>``, a round's assignment
REPORTS = "reports:"  # a key ``reports:<rest>`` is ``reports/<job>/<rest>``, a node's status
NOTES = "notes:"  # a key ``notes:<rest>`` is ``notes/<job>/<rest>``, a node's pending note


def key_of(rest: str, job: str = JOB) -> str:
    """``rest`` under the job's records (``jobs/<job>/``), its parts (``parts:...``), its rounds'
    assignments (``rounds:...``), its nodes' reports (``reports:...``) or notes (``notes:...``)."""
    if rest.startswith(REPORTS):
        return KEYS.job_reports(job) + rest.removeprefix(REPORTS)
    if rest.startswith(NOTES):
        return KEYS.job_notes(job) + rest.removeprefix(NOTES)
    if rest.startswith(PARTS):
        return KEYS.job_parts(job) + rest.removeprefix(PARTS)
    if rest.startswith(ROUNDS):
        return KEYS.job_rounds(job) + rest.removeprefix(ROUNDS)
    return KEYS.job(job) + rest


def shown(rest: str) -> str:
    """The key as a message names it."""
    return KEYS.relative(key_of(rest))


def raw(rest: str, value: bytes, create: int = 10, mod: int | None = None) -> KeyValue:
    return KeyValue(key_of(rest), value, create, mod or create, 0)


def kv(rest: str, value: Any, create: int = 10, mod: int | None = None) -> KeyValue:
    return raw(rest, json.dumps(value).encode(), create, mod)


def running() -> dict[str, Any]:
    """A valid running single-node job, one value per key kind."""
    spec = fakes.make_spec(nnodes=NodeRange(1, 1), nodes=(NODE,))
    join = Join(NODE, "127.0.0.1", 29500, 2, liveness_port=4000)
    result = build_result(0, [join], 5.0, 10)
    status = NodeStatus("RUNNING", 0, "", (100, 101), 6.0)
    return {
        "spec": fakes.head_of(spec).to_json(),
        "round": RoundInfo(0, RoundReason.START, 1.0).to_json(),
        "restarts": 0,
        "parts:0/join/n1": join.to_json(),
        "rdzv/0/result": result.head().to_json(),
        "rounds:0/n1": roster.assignments(result)[0].to_json(),
        "reports:n1": {
            "state": status.state,
            "round": 0,
            "devices": "",
            "pids": [100, 101],
            "updated_at": 6.0,
        },
        "notes:n2": "n2 is waiting for 2 free CPU slots (0 of 2 free now)",
    }


EXTRA: dict[str, Any] = {  # key kinds a running job does not have, each with a valid value
    "final": {"state": "SUCCEEDED", "reason": "", "code": "succeeded", "failure": None, "ended_at": 9.0},
    "parts:0/done/n1": {"at": 7.0},
    "rdzv/1/left/n1": {"at": 7.0},
    "waiting/n2": {"at": 7.0},
    "drain/n1": {"grace_s": 5, "at": 7.0, "by": "root"},
}
KINDS = [*running(), *EXTRA]


def kvs_of(values: dict[str, Any]) -> list[KeyValue]:
    return [kv(rest, value, create=10 + i) for i, (rest, value) in enumerate(values.items())]


def parse(kvs: list[KeyValue]) -> RostersRead:
    return parse_rosters(KEYS, JOB, kvs)


def test_the_base_read_and_every_extra_kind_are_valid() -> None:
    read = parse(kvs_of(running() | EXTRA))
    assert read.invalid == ()
    assert read.head is not None and read.result is not None and read.final is not None


def test_a_read_is_frozen_once_parsed() -> None:
    """Every reader of a read shares it (the scan's read of every job, ``status``), so nothing
    changes it once the parser built it: neither its fields nor what they hold."""
    read = parse(kvs_of(running() | EXTRA))
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.round = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        read.heads[1] = read.heads[0]  # type: ignore[index]
    assert isinstance(read.current_joins, tuple) and read.done_in(0) == frozenset({NODE})
    assert copy.deepcopy(read) == read and read.results[0] == read.result


def test_each_shape_holds_only_what_its_read_covered() -> None:
    """The read of every job holds no join; a member's read its own assignment alone."""
    kvs = kvs_of(running())
    every = parse_job(KEYS, JOB, kvs)
    assert type(every) is JobRead and every.heads.keys() == {0}
    member = parse_member(KEYS, JOB, kvs, NODE)
    assert member.me(NODE) is not None and member.me("n2") is None and member.current_joins
    assert parse_member(KEYS, JOB, kvs, "").me(NODE) is None  # its assignment was not asked for


# -- property: never raises, reports the key ---------------------------------------------------------
VALUES = stored_values()


def _valid_alone(rest: str, value: bytes) -> bool:
    """Whether ``value`` parses as key ``rest`` of the otherwise valid job (by the parser itself)."""
    read = parse([*kvs_of({k: v for k, v in running().items() if k != rest}), raw(rest, value, 99)])
    return not read.invalid


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(KINDS), VALUES)
def test_garbage_under_any_key_never_raises_and_is_named(rest: str, value: bytes) -> None:
    values = running()
    values.pop(rest, None)
    read = parse([*kvs_of(values), raw(rest, value, 99, 123)])
    bad = [k for k in read.invalid if k.key == shown(rest)]
    assert [k.key for k in read.invalid] == [k.key for k in bad]  # nothing else is blamed
    if bad:
        assert bad[0].revision == 123 and read.ended
        view = job_view(read, NODE)
        assert view["state"] == "FAILED" and shown(rest) in view["reason"]
    else:
        assert _valid_alone(rest, value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=30), VALUES), max_size=6))
def test_random_keys_and_values_never_raise(items: list[tuple[str, bytes]]) -> None:
    read = parse([raw(rest, value, i + 1) for i, (rest, value) in enumerate(items)])
    job_view(read, NODE)
    assert read.found == len(items)
    assert bool(items) == bool(read.invalid) or all(rest in KINDS for rest, _ in items)


# -- regressions: each bad record fails the job, naming the key, never as an orphan ---------------------
def _with(rest: str, value: Any) -> RostersRead:
    values = running() | {rest: value}
    return parse(kvs_of(values))


def _spec(**change: Any) -> dict[str, Any]:
    out: dict[str, Any] = running()["spec"] | change
    return out


CASES = [
    ("spec", b"{not json"),
    ("spec", b"\xff\xfe"),
    ("spec", ["a", "list"]),
    ("spec", {k: v for k, v in _spec().items() if k != "nnodes"}),
    ("spec", _spec(nproc_per_node=100000)),
    ("spec", _spec(nproc_per_node="4")),
    ("spec", _spec(uid=-1)),
    ("spec", _spec(uid=2**32 - 1)),
    ("spec", _spec(uid="0")),
    ("spec", _spec(gid=2**40)),
    ("spec", _spec(user="../root")),
    ("spec", _spec(user="a b")),
    ("spec", _spec(id="another-job")),
    ("spec", _spec(cwd="/tmp\x00x")),
    ("spec", _spec(future_field=1)),
    ("round", {"round": 0}),
    ("round", {"round": 0, "reason": "start", "opened_at": float("nan")}),
    ("restarts", -1),
    ("restarts", "1"),
    ("final", {"state": "RUNNING", "reason": "", "code": "succeeded", "ended_at": 1.0}),
    ("rdzv/0/result", {"round": 0}),
    ("parts:0/join/n1", {"node": "n1", "address": "h", "port": "x", "local_world_size": 2}),
    ("parts:0/join/n1", running()["parts:0/join/n1"] | {"node": "n2"}),
    ("rdzv/0/join/n1", running()["parts:0/join/n1"]),  # where v1 kept joins: no record of a job now
    ("parts:0/result", running()["rdzv/0/result"]),  # no round's record among the parts
    ("parts:x/join/n1", running()["parts:0/join/n1"]),
    ("parts:0/done/n1", {"at": "now"}),
    ("rdzv/0/done/n1", {"at": 7.0}),  # where v4 kept done markers: no record of a job now
    ("rdzv/0/left/n1", []),
    ("waiting/n2", None),
    ("reports:n1", {"state": "RUNNING"}),
    ("parts:status/n1", running()["reports:n1"]),  # where v4 kept statuses: no part of a job now
    ("notes:n2", 42),
    ("parts:pending/n2", running()["notes:n2"]),  # where v4 kept pending notes: no part now
    ("nodes/n1", running()["reports:n1"]),  # where v1 kept statuses: no record of a job now
    ("pending/n2", running()["notes:n2"]),  # ... and pending notes
    ("parts:nodes/n1", running()["reports:n1"]),
    ("parts:0/status/n1", running()["reports:n1"]),  # a status is no round's
    ("parts:status/join/n1", running()["parts:0/join/n1"]),  # a round is a decimal, not a kind
    ("drain/n1", {"grace_s": -5}),
    ("rdzv/x/result", running()["rdzv/0/result"]),
    ("parts:01/done/n1", {"at": 1.0}),
    ("parts:0/join/bad node", running()["parts:0/join/n1"]),
    ("reports:../etc", running()["reports:n1"]),
    ("surprise", {}),
]


@pytest.mark.parametrize(("rest", "value"), CASES, ids=[f"{r}={str(v)[:30]}" for r, v in CASES])
def test_bad_record_fails_the_job_naming_the_key(rest: str, value: Any) -> None:
    others = kvs_of({k: v for k, v in running().items() if k != rest})
    read = parse([*others, raw(rest, value if isinstance(value, bytes) else json.dumps(value).encode())])
    assert [k.key for k in read.invalid] == [shown(rest)]
    view = job_view(read, NODE)
    assert view["state"] == "FAILED" and view["code"] == EndReason.INVALID_RECORD.value
    assert view["reason"].startswith(f"invalid record at {shown(rest)}: ")
    assert ORPHAN_REASON not in view["reason"]
    assert admit(read, "n9", 8, 8, "slots") == Admission(False)  # nobody joins it


def test_missing_round_or_restarts_is_invalid() -> None:
    values = running()
    del values["round"], values["restarts"]
    read = parse(kvs_of(values))
    assert [k.key for k in read.invalid] == [f"jobs/{JOB}/restarts", f"jobs/{JOB}/round"]
    assert all(k.why == "missing" and k.revision == 0 for k in read.invalid)


def test_a_bad_job_id_makes_every_key_invalid() -> None:
    kvs = [KeyValue(key_of(rest, "bad id"), json.dumps(v).encode(), 1, 1, 0) for rest, v in running().items()]
    read = parse_job(KEYS, "bad id", kvs)
    assert len(read.invalid) == len(kvs) and read.head is None


def test_one_bad_key_in_a_valid_read_is_named_and_the_rest_is_read() -> None:
    read = _with(
        "reports:n1", {"state": "RUNNING", "round": 0, "devices": "", "pids": [-1], "updated_at": 1.0}
    )
    assert [k.key for k in read.invalid] == [f"reports/{JOB}/n1"]
    assert "pids" in read.invalid[0].why
    assert read.head is not None and read.result is not None and read.node_status == {}


# -- who a job may run as --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec_uid", "daemon_uid", "allow_root", "code"),
    [
        (0, 0, False, EndReason.ROOT_NOT_ALLOWED),
        (0, 0, True, None),
        (1000, 0, False, None),
        (0, 1000, True, EndReason.ROOT_NOT_ALLOWED),
        (1000, 1000, False, None),
        (1001, 1000, False, EndReason.SPAWN_FAILED),
    ],
)
def test_refuse(spec_uid: int, daemon_uid: int, allow_root: bool, code: EndReason | None) -> None:
    spec = fakes.make_head(uid=spec_uid, nodes=(NODE,))
    refusal = refuse(spec, NODE, daemon_uid, allow_root)
    assert (refusal.code if refusal else None) is code
    if refusal is not None:
        assert f"node {NODE}" in refusal.reason
    assert refuse(spec, "elsewhere", daemon_uid, allow_root) is None  # not this node's job

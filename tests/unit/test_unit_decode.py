"""elasticd.decode: JSON values into typed dataclasses, one error type naming the field."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.decode import DecodeError, Unknown, decode, decode_as, parse_json, report_invalid
from elasticd.node.registry import NodeRecord
from elasticd.rendezvous.model import (
    DrainRecord,
    FinalRecord,
    Join,
    NodeStatus,
    RoundInfo,
    RoundResult,
    WaitingRecord,
)
from elasticd.terms.spec import JobSpec, NodeRange
from elasticd.terms.state import WorkerFailure
from tests.strategies import json_values

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Point:
    x: int
    y: int = 0

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("x must be >= 0")


ONE = NodeRange(1, 1)


@dataclass(frozen=True)
class Record:
    name: str
    color: Color
    ratio: float = 1.0
    on: bool = False
    tags: tuple[str, ...] = ()
    items: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    at: Point | None = None
    points: tuple[Point, ...] = ()
    extra: Any = None
    nnodes: NodeRange = ONE


GOOD: dict[str, Any] = {"name": "n", "color": "red"}


def test_defaults() -> None:
    assert decode(Record, GOOD) == Record("n", Color.RED)


def test_every_kind_of_field() -> None:
    raw = GOOD | {
        "ratio": 2,
        "on": True,
        "tags": ["a", "b"],
        "items": ["c"],
        "env": {"K": "v"},
        "at": {"x": 1, "y": 2},
        "points": [{"x": 3}],
        "extra": {"anything": [1, None]},
        "nnodes": "1:4",
    }
    rec = decode(Record, raw)
    assert rec == Record(
        "n",
        Color.RED,
        2.0,
        True,
        ("a", "b"),
        ["c"],
        {"K": "v"},
        Point(1, 2),
        (Point(3),),
        {"anything": [1, None]},
        NodeRange(1, 4),
    )
    assert isinstance(rec.ratio, float) and rec.color is Color.RED


@pytest.mark.parametrize(
    ("change", "path", "kind"),
    [
        ({"name": 1}, "name", "type"),
        ({"name": None}, "name", "type"),
        ({"color": "green"}, "color", "type"),
        ({"color": 1}, "color", "type"),
        ({"ratio": "1"}, "ratio", "type"),
        ({"ratio": True}, "ratio", "type"),
        ({"ratio": float("nan")}, "ratio", "invalid"),
        ({"ratio": float("inf")}, "ratio", "invalid"),
        ({"ratio": 10**400}, "ratio", "invalid"),
        ({"on": 1}, "on", "type"),
        ({"tags": "ab"}, "tags", "type"),
        ({"tags": ["a", 1]}, "tags[1]", "type"),
        ({"items": [None]}, "items[0]", "type"),
        ({"env": {"K": 1}}, "env.K", "type"),
        ({"env": ["K"]}, "env", "type"),
        ({"at": {"y": 1}}, "at.x", "missing"),
        ({"at": {"x": -1}}, "at", "invalid"),  # the class's own hook
        ({"at": {"x": True}}, "at.x", "type"),
        ({"at": 5}, "at", "type"),
        ({"points": [{"x": 1}, {"x": "2"}]}, "points[1].x", "type"),
        ({"nnodes": 2}, "nnodes", "invalid"),
        ({"nnodes": "0"}, "nnodes", "invalid"),
    ],
    ids=repr,
)
def test_errors_name_the_field(change: dict[str, Any], path: str, kind: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(Record, GOOD | change)
    assert (info.value.path, info.value.kind) == (path, kind)
    assert str(info.value).startswith(f"{path}: ")


def test_missing_field() -> None:
    with pytest.raises(DecodeError) as info:
        decode(Record, {"color": "red"})
    assert (info.value.path, info.value.kind) == ("name", "missing")


@pytest.mark.parametrize("value", [None, [], "x", 1, 1.5, True])
def test_a_dataclass_needs_an_object(value: Any) -> None:
    with pytest.raises(DecodeError, match="must be an object"):
        decode(Record, value)


def test_unknown_fields_ignored_or_rejected() -> None:
    raw = GOOD | {"from_a_newer_daemon": 1}
    assert decode(Record, raw) == Record("n", Color.RED)
    with pytest.raises(DecodeError) as info:
        decode(Record, raw, unknown=Unknown.REJECT)
    assert info.value.kind == "unknown" and "from_a_newer_daemon" in info.value.why
    with pytest.raises(DecodeError, match="at: unknown"):  # nested records follow the same rule
        decode(Record, GOOD | {"at": {"x": 1, "z": 2}}, unknown=Unknown.REJECT)


def test_plain_hints() -> None:
    assert decode(int, 3) == 3
    assert decode_as(tuple[str, ...], ["a"]) == ("a",)
    assert decode_as(int | None, None) is None
    assert decode_as(str | int, 4) == 4
    with pytest.raises(DecodeError, match="must be str or int"):
        decode_as(str | int, 1.5)
    with pytest.raises(DecodeError):
        decode(int, True)


@pytest.mark.parametrize("hint", [set[int], dict[int, str], tuple[int, str], bytes])
def test_unsupported_hints_are_programming_errors(hint: Any) -> None:
    with pytest.raises(TypeError, match="unsupported"):
        decode_as(hint, [1])


@pytest.mark.parametrize(
    ("raw", "ok"),
    [(b'{"a": 1}', True), (b"[1]", True), (b"\xff\xfe", False), (b"{", False), (b"[" * 100_000, False)],
)
def test_parse_json(raw: bytes, ok: bool) -> None:
    if ok:
        assert parse_json(raw) == json.loads(raw)
    else:
        with pytest.raises(DecodeError):
            parse_json(raw)


def test_report_invalid_logs_once_per_revision() -> None:
    assert report_invalid("jobs/x/spec", 7, "bad")
    assert not report_invalid("jobs/x/spec", 7, "bad")
    assert report_invalid("jobs/x/spec", 8, "bad")


# -- arbitrary JSON never raises anything but DecodeError ---------------------------------------------
JSON = json_values(max_leaves=30, max_items=5)
RECORDS: list[type[DataclassInstance]] = [
    Record,
    JobSpec,
    RoundInfo,
    Join,
    RoundResult,
    FinalRecord,
    DrainRecord,
    WaitingRecord,
    NodeStatus,
    NodeRecord,
    WorkerFailure,
]
FIELDS = {cls: list(cls.__dataclass_fields__) for cls in RECORDS}


def _object_like(cls: type) -> st.SearchStrategy[Any]:
    """Objects with the record's own field names, so decoding gets past the first check."""
    names = st.sampled_from(FIELDS[cls])
    return st.dictionaries(names | st.text(max_size=5), JSON, max_size=len(FIELDS[cls]) + 2)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(RECORDS).flatmap(lambda c: st.tuples(st.just(c), JSON | _object_like(c))))
def test_arbitrary_json_only_ever_raises_decode_error(case: tuple[type, Any]) -> None:
    cls, value = case
    for unknown in Unknown:
        try:
            decode(cls, value, unknown=unknown)
        except DecodeError as exc:
            assert str(exc)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()))
def test_parse_json_only_ever_raises_decode_error(raw: bytes) -> None:
    with contextlib.suppress(DecodeError):
        parse_json(raw)

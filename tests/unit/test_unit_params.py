"""elasticd.control.params.parse_args: JSON arguments checked against a dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from elasticd.control.params import parse_args
from elasticd.errors import ErrorCode, InvalidArgs


@dataclass(frozen=True)
class Args:
    name: str
    count: int
    ratio: float
    flag: bool
    tags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cursor: dict[str, int] = field(default_factory=dict)
    rank: int | None = None
    label: str | None = "default"


REQUIRED: dict[str, Any] = {"name": "n", "count": 2, "ratio": 0.5, "flag": True}


def test_required_only_gets_defaults() -> None:
    assert parse_args(Args, REQUIRED) == Args("n", 2, 0.5, True, [], {}, {}, None, "default")


def test_all_fields() -> None:
    raw = REQUIRED | {
        "tags": ["a", "b"],
        "env": {"K": "v"},
        "cursor": {"attempt_0/rank_0.log": 10},
        "rank": 3,
        "label": None,
    }
    args = parse_args(Args, raw)
    assert args.tags == ["a", "b"]
    assert args.env == {"K": "v"}
    assert args.cursor == {"attempt_0/rank_0.log": 10}
    assert args.rank == 3
    assert args.label is None


def test_int_is_accepted_as_float() -> None:
    args = parse_args(Args, REQUIRED | {"ratio": 2})
    assert args.ratio == 2.0
    assert isinstance(args.ratio, float)


@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_an_int(value: bool) -> None:
    with pytest.raises(InvalidArgs, match="'count'"):
        parse_args(Args, REQUIRED | {"count": value})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("name", 1),
        ("name", None),
        ("name", ["n"]),
        ("count", 1.5),
        ("count", "2"),
        ("count", None),
        ("ratio", "0.5"),
        ("ratio", True),
        ("ratio", None),
        ("flag", 1),
        ("flag", "true"),
        ("flag", None),
        ("tags", "a,b"),
        ("tags", [1]),
        ("tags", ["a", None]),
        ("tags", {"a": "b"}),
        ("env", ["K=v"]),
        ("env", "K=v"),
        ("rank", "0"),
        ("rank", 0.0),
        ("rank", False),
        ("label", 5),
    ],
)
def test_wrong_types_name_the_field(key: str, value: Any) -> None:
    with pytest.raises(InvalidArgs, match=f"'{key}(\\[\\d+\\])?'") as info:
        parse_args(Args, REQUIRED | {key: value})
    assert info.value.code is ErrorCode.INVALID_ARGS


@pytest.mark.parametrize(
    ("key", "value", "where"),
    [
        ("env", {"K": 1}, "'env.K'"),
        ("env", {"A": "x", "B": None}, "'env.B'"),
        ("cursor", {"f": "10"}, "'cursor.f'"),
        ("cursor", {"f": True}, "'cursor.f'"),
        ("cursor", {"f": 1.5}, "'cursor.f'"),
    ],
)
def test_dict_values_are_checked(key: str, value: Any, where: str) -> None:
    with pytest.raises(InvalidArgs, match=where):
        parse_args(Args, REQUIRED | {key: value})


@pytest.mark.parametrize("missing", ["name", "count", "ratio", "flag"])
def test_missing_required(missing: str) -> None:
    raw = {k: v for k, v in REQUIRED.items() if k != missing}
    with pytest.raises(InvalidArgs, match=f"missing argument '{missing}'"):
        parse_args(Args, raw)


def test_unknown_keys_are_listed() -> None:
    with pytest.raises(InvalidArgs, match="bogus") as info:
        parse_args(Args, REQUIRED | {"bogus": 1, "alsobogus": 2})
    assert "alsobogus" in info.value.message


def test_returns_copies_of_containers() -> None:
    tags = ["a"]
    args = parse_args(Args, REQUIRED | {"tags": tags})
    tags.append("b")
    assert args.tags == ["a"]


@dataclass(frozen=True)
class Empty:
    pass


def test_no_args() -> None:
    assert parse_args(Empty, {}) == Empty()
    with pytest.raises(InvalidArgs):
        parse_args(Empty, {"x": 1})


def test_not_a_dataclass_is_a_programming_error() -> None:
    with pytest.raises(TypeError):
        parse_args(dict, {})


@dataclass(frozen=True)
class Unsupported:
    items: set[int]


def test_unsupported_field_type_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="unsupported"):
        parse_args(Unsupported, {"items": [1]})


@dataclass(frozen=True)
class Nested:
    ids: tuple[int, ...] = ()
    inner: Args | None = None


def test_tuples_and_nested_dataclasses() -> None:
    args = parse_args(Nested, {"ids": [1, 2], "inner": REQUIRED})
    assert args == Nested((1, 2), Args("n", 2, 0.5, True))
    with pytest.raises(InvalidArgs, match=r"'inner\.count'"):
        parse_args(Nested, {"inner": REQUIRED | {"count": "2"}})
    with pytest.raises(InvalidArgs, match=r"'ids\[1\]'"):
        parse_args(Nested, {"ids": [1, True]})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 10**400])
def test_numbers_must_be_finite(value: Any) -> None:
    with pytest.raises(InvalidArgs, match="'ratio'"):
        parse_args(Args, REQUIRED | {"ratio": value})

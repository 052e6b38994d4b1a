"""elasticd.errors: stable codes, one per exception type, and the wire form."""

from __future__ import annotations

import re

import pytest

from elasticd import errors
from elasticd.errors import ConfigError, ElasticdError, ErrorCode, InvalidArgs, to_wire


def _subclasses(cls: type[ElasticdError]) -> list[type[ElasticdError]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


# only the classes defined in elasticd.errors (tests elsewhere may subclass)
SUBCLASSES = [c for c in _subclasses(ElasticdError) if c.__module__ == errors.__name__]


def test_codes_are_unique() -> None:
    values = [c.value for c in ErrorCode]
    assert len(values) == len(set(values))


@pytest.mark.parametrize("code", list(ErrorCode))
def test_codes_are_lowercase_snake_case(code: ErrorCode) -> None:
    assert re.fullmatch(r"[a-z]+(_[a-z]+)*", code.value)
    assert code.value == code.name.lower()


def test_each_subclass_has_its_own_code() -> None:
    codes = [c.code for c in SUBCLASSES if "code" in vars(c)]  # a refinement inherits its parent's
    assert len(codes) == len(set(codes))
    assert ErrorCode.INTERNAL not in codes  # internal is for the unexpected only


def test_every_code_but_internal_has_an_exception() -> None:
    assert {c.code for c in SUBCLASSES} | {ErrorCode.INTERNAL} == set(ErrorCode)


def test_config_error_never_goes_on_the_wire() -> None:
    assert not issubclass(ConfigError, ElasticdError)
    assert to_wire(ConfigError("bad /etc path")) == {
        "code": "internal",
        "message": "internal error; see the daemon log",
    }


@pytest.mark.parametrize("cls", SUBCLASSES, ids=lambda c: c.__name__)
def test_to_wire(cls: type[ElasticdError]) -> None:
    exc = cls("what happened")
    assert str(exc) == "what happened"
    assert exc.to_wire() == {"code": cls.code.value, "message": "what happened"}
    assert to_wire(exc) == exc.to_wire()


def test_to_wire_with_details() -> None:
    exc = InvalidArgs("bad", field="count", got="str")
    assert to_wire(exc) == {
        "code": "invalid_args",
        "message": "bad",
        "details": {"field": "count", "got": "str"},
    }


@pytest.mark.parametrize(
    "exc", [RuntimeError("leaky detail"), KeyError("k"), Exception(), KeyboardInterrupt()]
)
def test_unexpected_exceptions_are_internal(exc: BaseException) -> None:
    assert to_wire(exc) == {"code": "internal", "message": "internal error; see the daemon log"}

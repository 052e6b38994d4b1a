"""Typed command arguments: each command declares a frozen dataclass; this checks JSON against it.

Supported field types: str, int, float, bool, list[str], dict[str, str | int | ...], and ``X | None``.
Unknown, missing and ill-typed arguments raise ``InvalidArgs`` naming the field.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from elasticd.errors import InvalidArgs

T = TypeVar("T")


def _check(name: str, value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return _check(name, value, inner[0])
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
    elif origin is dict:
        _, value_hint = typing.get_args(hint)
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {k: _check(f"{name}.{k}", v, value_hint) for k, v in value.items()}
    else:  # a programming error in a command's Args, not the client's
        raise TypeError(f"unsupported argument type {hint!r} for {name}")
    raise InvalidArgs(
        f"argument {name!r} must be {getattr(hint, '__name__', hint)}, got {type(value).__name__}"
    )


def parse_args(cls: type[T], raw: dict[str, Any]) -> T:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(raw) - set(fields)
    if unknown:
        raise InvalidArgs(f"unknown arguments: {sorted(unknown)}")
    values = {}
    for name, f in fields.items():
        if name in raw:
            values[name] = _check(name, raw[name], hints[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise InvalidArgs(f"missing argument {name!r}")
    return cls(**values)

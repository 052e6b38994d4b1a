"""Typed command arguments: each command declares a frozen dataclass; ``elasticd.decode`` checks
the request's JSON against it, with the same rules as every record read from etcd.

Arguments are stricter than stored records in one way: unknown ones are refused (a misspelt
option must not be silently ignored). Every problem raises ``InvalidArgs`` naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from elasticd.decode import DecodeError, Unknown, decode
from elasticd.errors import InvalidArgs

T = TypeVar("T")


def parse_args(cls: type[T], raw: dict[str, Any]) -> T:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    try:
        return decode(cls, raw, unknown=Unknown.REJECT)
    except DecodeError as exc:
        if exc.kind == "missing":
            raise InvalidArgs(f"missing argument {exc.path!r}") from None
        if exc.kind == "unknown" and not exc.path:
            raise InvalidArgs(exc.why.replace("unknown fields", "unknown arguments")) from None
        if exc.path:
            raise InvalidArgs(f"argument {exc.path!r} {exc.why}") from None
        raise InvalidArgs(f"invalid arguments: {exc.why}") from None

"""Typed decoding of untrusted JSON into frozen dataclasses, driven by their type hints.

Everything the daemon reads from outside its own memory goes through here: control arguments
from the socket, and every record it reads from etcd (anyone with write access to the prefix can
put anything there). One decoder for both means one set of rules, and a record that would make
the daemon misbehave is rejected where it is read, as one ``DecodeError`` naming the field,
instead of surfacing later as a KeyError, a TypeError or a crash loop.

Supported type hints: ``str``, ``int`` (not bool), ``float`` (int accepted; NaN and infinities
are not JSON numbers and are refused), ``bool``, ``None``, unions (``X | None``), ``list[X]``,
``tuple[X, ...]``, ``dict[str, X]``, ``Any`` (any JSON value), enum types (by value), nested
dataclasses, ``TypedDict`` types (the control replies, see ``elasticd.wire``; ``NotRequired``
keys may be absent), and classes with a ``__decode__(value)`` classmethod (their own wire form,
e.g. ``NodeRange`` as ``"1:4"``). A dataclass's ``__post_init__`` is its hook for further
validation: whatever it raises (ValueError, TypeError, an ``ElasticdError``) becomes a
``DecodeError``.

Unknown fields: control arguments reject them (a typo must not be silently ignored), stored
records ignore them (``Unknown.IGNORE``): daemons of different versions share one etcd, and a
newer daemon may add a field an older one does not know. A record type whose unknown fields
must not be ignored (the job spec: a constraint we do not understand must not be dropped) asks
for ``Unknown.REJECT`` itself.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import types
import typing
from collections import OrderedDict
from enum import StrEnum
from typing import Any, TypeVar

from elasticd import log
from elasticd.errors import ElasticdError

T = TypeVar("T")

_log = log.get("elasticd.decode")
MAX_WHY = 300  # an error names the field and the problem, not a copy of the bad value


class Unknown(StrEnum):
    IGNORE = "ignore"
    REJECT = "reject"


class DecodeError(ValueError):
    """A JSON value that does not fit the type it was decoded as.

    ``path`` names the field (``members[1].port``, ``env.HOME``; empty for the value itself),
    ``why`` says what is wrong, ``kind`` is ``type``, ``missing``, ``unknown`` or ``invalid``.
    """

    def __init__(self, path: str, why: str, kind: str = "invalid") -> None:
        why = why if len(why) <= MAX_WHY else why[: MAX_WHY - 3] + "..."
        super().__init__(f"{path}: {why}" if path else why)
        self.path = path
        self.why = why
        self.kind = kind


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _union(path: str, value: Any, hint: Any, unknown: Unknown) -> Any:
    options = typing.get_args(hint)
    if value is None and type(None) in options:
        return None
    inner = [o for o in options if o is not type(None)]
    errors = []
    for option in inner:
        try:
            return _check(path, value, option, unknown)
        except DecodeError as exc:
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    names = " or ".join(_name(o) for o in options)
    raise DecodeError(path, f"must be {names}, got {type(value).__name__}", "type")


_MISMATCH: Any = object()  # what a checker returns for a value of another JSON type


def _float(path: str, value: Any) -> Any:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return _MISMATCH
    try:
        number = float(value)
    except OverflowError as exc:
        raise DecodeError(path, "is out of range for a number") from exc
    if not math.isfinite(number):
        raise DecodeError(path, "must be a finite number")
    return number


# The JSON scalars, by hint: each returns the value (as the hint's type) or ``_MISMATCH``.
_SCALARS: dict[Any, typing.Callable[[str, Any], Any]] = {
    None: lambda _path, value: None if value is None else _MISMATCH,
    type(None): lambda _path, value: None if value is None else _MISMATCH,
    bool: lambda _path, value: value if isinstance(value, bool) else _MISMATCH,
    int: lambda _path, value: value if isinstance(value, int) and not isinstance(value, bool) else _MISMATCH,
    float: _float,
    str: lambda _path, value: value if isinstance(value, str) else _MISMATCH,
}


def _check(path: str, value: Any, hint: Any, unknown: Unknown) -> Any:
    if hint is Any:
        return value
    scalar = _SCALARS.get(hint)
    out = scalar(path, value) if scalar is not None else _compound(path, value, hint, unknown)
    if out is _MISMATCH:
        raise DecodeError(path, f"must be {_name(hint)}, got {type(value).__name__}", "type")
    return out


def _compound(path: str, value: Any, hint: Any, unknown: Unknown) -> Any:
    """``value`` as a union, container, enum, dataclass or hooked class (or ``_MISMATCH``)."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return _union(path, value, hint, unknown)
    if origin is list or origin is tuple:
        return _sequence(path, value, hint, unknown)
    if origin is dict:
        return _mapping(path, value, hint, unknown)
    if typing.is_typeddict(hint):
        return _typeddict(path, value, hint, unknown)
    if isinstance(hint, type) and callable(hook := getattr(hint, "__decode__", None)):
        return _construct(path, lambda: hook(value))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(path, value, hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass(path, value, hint, unknown)
    # a programming error in a declared type, not the input's
    raise TypeError(f"unsupported type {hint!r} for {path or 'the value'}")


def _mapping(path: str, value: Any, hint: Any, unknown: Unknown) -> Any:
    key_hint, value_hint = typing.get_args(hint)
    if key_hint is not str:
        raise TypeError(f"unsupported type {hint!r} for {path or 'the value'}: keys must be str")
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return _MISMATCH
    return {k: _check(_join(path, k), v, value_hint, unknown) for k, v in value.items()}


def _sequence(path: str, value: Any, hint: Any, unknown: Unknown) -> Any:
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
        raise TypeError(f"unsupported type {hint!r} for {path or 'the value'}: use tuple[X, ...]")
    if not isinstance(value, list):
        raise DecodeError(path, f"must be a list, got {type(value).__name__}", "type")
    items = [_check(f"{path}[{i}]", v, args[0], unknown) for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _enum(path: str, value: Any, hint: type[enum.Enum]) -> Any:
    try:
        if issubclass(hint, str) and not isinstance(value, str):
            raise TypeError(type(value).__name__)
        return hint(value)
    except (ValueError, TypeError):
        allowed = [m.value for m in hint]
        shown = repr(value) if isinstance(value, str) and len(value) <= 40 else type(value).__name__
        raise DecodeError(path, f"must be one of {allowed}, got {shown}", "type") from None


def _construct(path: str, make: typing.Callable[[], T]) -> T:
    """Run a constructor or hook; its complaints about the value become a DecodeError."""
    try:
        return make()
    except DecodeError as exc:
        raise DecodeError(_join(path, exc.path), exc.why, exc.kind) from None
    except ElasticdError as exc:
        raise DecodeError(path, exc.message) from None
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise DecodeError(path, str(exc) or type(exc).__name__) from None


def _dataclass(path: str, value: Any, cls: type[T], unknown: Unknown) -> T:
    if not isinstance(value, dict):
        raise DecodeError(path, f"must be an object, got {type(value).__name__}", "type")
    hints = _hints(typing.cast(type, cls))
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    extra = [k for k in value if k not in fields]
    if extra and unknown is Unknown.REJECT:
        shown = sorted(str(k)[:40] for k in extra)[:10]
        raise DecodeError(path, f"unknown fields: {shown}", "unknown")
    values = {}
    for name, f in fields.items():
        if name in value:
            values[name] = _check(_join(path, name), value[name], hints[name], unknown)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise DecodeError(_join(path, name), "is missing", "missing")
    return _construct(path, lambda: cls(**values))


@functools.cache
def _keys(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """A TypedDict's value hints and required keys, read from its annotations: Python 3.11 gets
    ``__required_keys__`` wrong when they are strings (``from __future__ import annotations``)."""
    hints = {}
    required = set()
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        origin = typing.get_origin(hint)
        if origin is typing.NotRequired or origin is typing.Required:
            hints[name] = typing.get_args(hint)[0]
            if origin is typing.Required:
                required.add(name)
        else:
            hints[name] = hint
            if getattr(cls, "__total__", True):
                required.add(name)
    return hints, frozenset(required)


def _typeddict(path: str, value: Any, cls: type, unknown: Unknown) -> dict[str, Any]:
    """A JSON object as a TypedDict: a plain dict holding only the declared keys."""
    if not isinstance(value, dict):
        raise DecodeError(path, f"must be an object, got {type(value).__name__}", "type")
    hints, required = _keys(cls)
    extra = [k for k in value if k not in hints]
    if extra and unknown is Unknown.REJECT:
        shown = sorted(str(k)[:40] for k in extra)[:10]
        raise DecodeError(path, f"unknown fields: {shown}", "unknown")
    missing = sorted(required - value.keys())
    if missing:
        raise DecodeError(_join(path, missing[0]), "is missing", "missing")
    return {k: _check(_join(path, k), v, hints[k], unknown) for k, v in value.items() if k in hints}


def decode(cls: type[T], value: Any, *, unknown: Unknown = Unknown.IGNORE, path: str = "") -> T:
    """``value`` (plain JSON) as ``cls``; raises ``DecodeError`` for any value that does not fit.

    A ``TypeError`` means an unsupported hint: a bug in the declared type, never the input's.
    """
    out: T = _check(path, value, cls, unknown)
    return out


def decode_as(hint: Any, value: Any, *, unknown: Unknown = Unknown.IGNORE, path: str = "") -> Any:
    """``decode`` for hints that are not classes (``tuple[str, ...]``, ``int | None``)."""
    return _check(path, value, hint, unknown)


def parse_json(raw: bytes) -> Any:
    """Bytes from etcd as JSON; anything that is not (bad UTF-8, too deep) is a DecodeError."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise DecodeError("", "is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError("", f"is not JSON ({type(exc).__name__})") from None


# -- reporting bad records once -----------------------------------------------------------------
_REPORTED: OrderedDict[tuple[str, int], None] = OrderedDict()
_REPORTED_MAX = 10_000


def report_invalid(key: str, revision: int, why: str, **fields: Any) -> bool:
    """Log ``record.invalid`` once per (key, mod revision): a bad key is read on every scan,
    and a log line per scan would bury everything else. True if this call logged it."""
    mark = (key, revision)
    if mark in _REPORTED:
        return False
    _REPORTED[mark] = None
    while len(_REPORTED) > _REPORTED_MAX:
        _REPORTED.popitem(last=False)
    _log.warning("record.invalid", key=key, revision=revision, why=why, **fields)
    return True

"""What a job's zygote (``zygote_program.boot``) says to the daemon, typed and checked: one JSON object per
``SOCK_SEQPACKET`` message. Pure: everything the zygote says is untrusted, so every field is
checked here and anything else is a ``ValueError``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 4096  # from the zygote


@dataclass(frozen=True)
class Ready:
    pid: int
    import_s: float
    torch: bool
    files: int = 0  # files behind its modules whose stamps it recorded (for ``check``)


@dataclass(frozen=True)
class Unavailable:
    reason: str


@dataclass(frozen=True)
class Forked:
    id: int
    pid: int


@dataclass(frozen=True)
class ForkFailed:
    id: int
    error: str


@dataclass(frozen=True)
class Exited:
    pid: int
    status: int


@dataclass(frozen=True)
class Checked:
    """The answer to a ``check``: whether every recorded file is as it was when the zygote was
    ready (``changed``: the first that is not). A zygote could lie here, but only to its own user:
    it is adopted only by a job of the same identity, whose workers it would run anyway."""

    id: int
    fresh: bool
    files: int
    changed: str


Message = Ready | Unavailable | Forked | ForkFailed | Exited | Checked


def _int(value: Any, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"not an integer in {low}..{high}: {str(value)[:40]!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("not a string")
    return value[:500]


def parse_message(data: bytes) -> Message:
    """One message of the zygote; raises ``ValueError`` for anything else."""
    if len(data) > MAX_MESSAGE:
        raise ValueError("message too long")
    msg = json.loads(data)
    if not isinstance(msg, dict):
        raise ValueError("not an object")
    pid_max = 1 << 22
    match msg.get("ev"):
        case "ready":
            import_s = msg.get("import_s")
            if not isinstance(import_s, int | float) or not 0 <= import_s < 1e6:
                raise ValueError("bad import_s")
            files = _int(msg.get("files", 0), 0, 1 << 24)
            return Ready(_int(msg.get("pid"), 2, pid_max), float(import_s), msg.get("torch") is True, files)
        case "unavailable":
            return Unavailable(_text(msg.get("reason")))
        case "forked":
            return Forked(_int(msg.get("id"), 0, 1 << 31), _int(msg.get("pid"), 2, pid_max))
        case "fork_failed":
            return ForkFailed(_int(msg.get("id"), -1, 1 << 31), _text(msg.get("error")))
        case "exit":
            return Exited(_int(msg.get("pid"), 2, pid_max), _int(msg.get("status"), 0, 0xFFFF))
        case "checked":
            fresh = msg.get("fresh")
            if not isinstance(fresh, bool):
                raise ValueError("fresh must be true or false")
            changed = _text(msg.get("changed"))
            if fresh == bool(changed):
                raise ValueError("a fresh zygote names no changed file, a stale one names one")
            files = _int(msg.get("files"), 0, 1 << 24)
            return Checked(_int(msg.get("id"), 0, 1 << 31), fresh, files, changed)
    raise ValueError("unknown message")


# -- what a store host (``zygote_program.storehost``) says, on its own socket -----------------------


@dataclass(frozen=True)
class Listening:
    pid: int
    port: int


@dataclass(frozen=True)
class StoreFailed:
    error: str


@dataclass(frozen=True)
class Cleared:
    attempt: int
    keys: int


StoreMessage = Listening | StoreFailed | Cleared


def parse_store_message(data: bytes) -> StoreMessage:
    """One message of a store host; raises ``ValueError`` for anything else."""
    if len(data) > MAX_MESSAGE:
        raise ValueError("message too long")
    msg = json.loads(data)
    if not isinstance(msg, dict):
        raise ValueError("not an object")
    match msg.get("ev"):
        case "listening":
            return Listening(_int(msg.get("pid"), 2, 1 << 22), _int(msg.get("port"), 1, 65535))
        case "store_failed":
            return StoreFailed(_text(msg.get("error")))
        case "cleared":
            return Cleared(_int(msg.get("attempt"), 0, 1 << 31), _int(msg.get("keys"), 0, 1 << 31))
    raise ValueError("unknown message")

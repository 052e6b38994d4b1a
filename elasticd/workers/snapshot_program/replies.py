"""The keeper's replies, to a worker on its socket and to another node's worker on the replication
link: one frozen type per answer, and their parser (standard library only; part of the keeper's
program, after ``protocol``; ``requests`` encodes them).

A reply is one JSON object that says ``ok``; when not, why (``Refused``). A worker knows what it
asked, so it reads the reply as the answer it expects (``parse_reply``): every field type-checked
and bounded, or a ``BadMessage``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

if __name__ != "__elasticd_keeper__":  # the daemon's tests and mypy; in the keeper, globals already
    from elasticd.workers.snapshot_program.protocol import (
        MAX_GEN,
        MAX_HELD,
        MAX_LENGTH,
        MAX_MESSAGE,
        MAX_RANK,
        MAX_SIZE,
        MAX_SLOT,
        MAX_STEP,
        BadMessage,
        field_int,
        json_object,
    )

WRITE, SKIP, WAIT = "write", "skip", "wait"  # a claim's answers (``filing.claim`` decides)


@dataclass(frozen=True)
class Refused:
    error: str

    @staticmethod
    def parse(msg: dict[str, Any]) -> Refused:
        if not isinstance(msg.get("error"), str):
            raise BadMessage("refusal without a reason")
        return Refused(msg["error"])


@dataclass(frozen=True)
class Done:
    """The answer to ``peer`` and ``written``."""

    @staticmethod
    def parse(msg: dict[str, Any]) -> Done:
        return Done()


@dataclass(frozen=True)
class Begun:
    """The segment to write into (its fd comes along): ``slot`` and ``gen`` name it to ``commit``."""

    slot: int
    gen: int
    capacity: int

    @staticmethod
    def parse(msg: dict[str, Any]) -> Begun:
        return Begun(
            field_int(msg, "slot", MAX_SLOT),
            field_int(msg, "gen", MAX_GEN),
            field_int(msg, "capacity", MAX_SIZE),
        )


@dataclass(frozen=True)
class Committed:
    step: int
    held: int  # the bytes the keeper holds now

    @staticmethod
    def parse(msg: dict[str, Any]) -> Committed:
        return Committed(field_int(msg, "step", MAX_STEP), field_int(msg, "held", MAX_HELD))


@dataclass(frozen=True)
class Held:
    """A complete snapshot the keeper holds."""

    rank: int
    slot: int
    gen: int
    step: int
    length: int
    replica: bool = False  # sent by another node's keeper

    @staticmethod
    def parse(item: Any) -> Held:
        if not isinstance(item, dict):
            raise BadMessage("a held snapshot must be an object")
        rank, slot = field_int(item, "rank", MAX_RANK), field_int(item, "slot", MAX_SLOT)
        gen, step = field_int(item, "gen", MAX_GEN), field_int(item, "step", MAX_STEP)
        length = field_int(item, "length", MAX_SIZE)
        return Held(rank, slot, gen, step, length, item.get("replica") is True)


@dataclass(frozen=True)
class Listed:
    held: tuple[Held, ...]

    @staticmethod
    def parse(msg: dict[str, Any]) -> Listed:
        held = msg.get("held")
        if not isinstance(held, list):
            raise BadMessage("held must be a list")
        return Listed(tuple(Held.parse(item) for item in held))


@dataclass(frozen=True)
class Opened:
    """A complete snapshot's frame (its read-only fd comes along)."""

    length: int
    step: int

    @staticmethod
    def parse(msg: dict[str, Any]) -> Opened:
        return Opened(field_int(msg, "length", MAX_SIZE), field_int(msg, "step", MAX_STEP))


@dataclass(frozen=True)
class KeyKnown:
    """The job's key as the keeper knows it (None: not yet), and where its replication link
    listens (port 0: it has none)."""

    key: str | None
    address: str
    port: int

    @staticmethod
    def parse(msg: dict[str, Any]) -> KeyKnown:
        key, address = msg.get("key"), msg.get("address")
        if not (key is None or isinstance(key, str)) or not isinstance(address, str):
            raise BadMessage("a bad key reply")
        return KeyKnown(key, address, field_int(msg, "port", 65535))


@dataclass(frozen=True)
class Claimed:
    """``write``, ``skip``, or ``wait`` with an fd that reaches EOF when the keeper's write ends."""

    do: str

    @staticmethod
    def parse(msg: dict[str, Any]) -> Claimed:
        do = msg.get("do")
        if do not in (WRITE, SKIP, WAIT):
            raise BadMessage(f"do must be one of {(WRITE, SKIP, WAIT)}")
        return Claimed(do)


@dataclass(frozen=True)
class Sending:
    """The answer to a ``get``: ``length`` bytes of the frame follow, then a tag."""

    length: int

    @staticmethod
    def parse(msg: dict[str, Any]) -> Sending:
        return Sending(field_int(msg, "length", MAX_LENGTH))


Reply = Refused | Done | Begun | Committed | Listed | Opened | KeyKnown | Claimed | Sending
Answer = TypeVar("Answer", Done, Begun, Committed, Listed, Opened, KeyKnown, Claimed, Sending)


def parse_reply(data: bytes, expect: type[Answer]) -> Answer | Refused:
    """A keeper's reply to a request whose answer is an ``expect``; raises ``BadMessage``."""
    msg = json_object(data, MAX_MESSAGE)
    ok = msg.get("ok")
    if not isinstance(ok, bool):
        raise BadMessage("reply has no ok")
    return expect.parse(msg) if ok else Refused.parse(msg)

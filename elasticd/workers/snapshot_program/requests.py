"""What a worker asks its keeper, and what a keeper or a worker asks another node's keeper: one
frozen type per request, one parser per socket, and the one encoder of every message, requests and
replies (``replies``) alike (standard library only; part of the keeper's program, after
``protocol`` and ``replies``).

Each message is one JSON object; a request names its kind in ``op`` (``Op``). The keeper's UNIX
socket takes the ``LOCAL`` kinds (``parse_request``), its replication link the ``LINK`` kinds, in
a signed head (``parse_transfer``; ``replica``). Everything parsed here is untrusted: it becomes
exactly one of these types, every field type-checked and bounded, or a ``BadMessage``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, ClassVar, TypeVar

if __name__ != "__elasticd_keeper__":  # the daemon's tests and mypy; in the keeper, globals already
    from elasticd.workers.snapshot_program.protocol import (
        MAX_GEN,
        MAX_LENGTH,
        MAX_MESSAGE,
        MAX_RANK,
        MAX_SIZE,
        MAX_SLOT,
        MAX_STEP,
        BadMessage,
        encode,
        field_int,
        field_text,
        json_object,
    )
    from elasticd.workers.snapshot_program.replies import (
        Begun,
        Claimed,
        Committed,
        Done,
        KeyKnown,
        Listed,
        Opened,
        Refused,
        Reply,
        Sending,
    )

MAX_HEAD = 4096  # a replication link's head
KEY_BYTES = 32  # the job's key, sent as 64 hex digits
NONCE_CHARS = 32


class Op(Enum):
    """A request's kind, its ``op`` on the wire."""

    BEGIN = "begin"
    COMMIT = "commit"
    LIST = "list"
    OPEN = "open"
    KEY = "key"
    PEER = "peer"
    CLAIM = "claim"
    WRITTEN = "written"
    PUT = "put"
    GET = "get"


def _name(msg: dict[str, Any]) -> str:
    return field_text(msg, "name", 1)


def _rank(msg: dict[str, Any]) -> int:
    return field_int(msg, "rank", MAX_RANK)


def _step(msg: dict[str, Any]) -> int:
    return field_int(msg, "step", MAX_STEP)


def _segment(msg: dict[str, Any]) -> tuple[str, int, int, int]:
    """Name, rank, slot and generation: a segment ``begin`` gave."""
    return _name(msg), _rank(msg), field_int(msg, "slot", MAX_SLOT), field_int(msg, "gen", MAX_GEN)


def _nonce(msg: dict[str, Any]) -> str:
    value = msg.get("nonce")
    if not isinstance(value, str) or len(value) != NONCE_CHARS:
        raise BadMessage(f"nonce must be {NONCE_CHARS} characters")
    return value


# --- requests --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Begin:
    """A segment to write a snapshot of ``step`` into (``size`` bytes). ``file``: this rank writes
    the file ``name``; ``lib``: where its ``elasticd`` was imported from (the keeper's write of it
    takes the same)."""

    OP: ClassVar[Op] = Op.BEGIN
    name: str
    rank: int
    step: int
    size: int
    file: bool = False
    lib: str = ""

    @staticmethod
    def parse(msg: dict[str, Any]) -> Begin:
        size, lib = field_int(msg, "size", MAX_SIZE), field_text(msg, "lib") if "lib" in msg else ""
        return Begin(_name(msg), _rank(msg), _step(msg), size, msg.get("file") is True, lib)


@dataclass(frozen=True)
class Commit:
    """The frame written into a segment ``begin`` gave is whole."""

    OP: ClassVar[Op] = Op.COMMIT
    name: str
    rank: int
    slot: int
    gen: int

    @staticmethod
    def parse(msg: dict[str, Any]) -> Commit:
        return Commit(*_segment(msg))


@dataclass(frozen=True)
class ListHeld:
    """The complete snapshots and replicas of ``name``."""

    OP: ClassVar[Op] = Op.LIST
    name: str

    @staticmethod
    def parse(msg: dict[str, Any]) -> ListHeld:
        return ListHeld(_name(msg))


@dataclass(frozen=True)
class Open:
    """A read-only fd of a complete snapshot (``replica``: one another keeper sent); ``pin``:
    never write that segment again (a restored worker maps it copy-on-write)."""

    OP: ClassVar[Op] = Op.OPEN
    name: str
    rank: int
    slot: int
    gen: int
    replica: bool = False
    pin: bool = False

    @staticmethod
    def parse(msg: dict[str, Any]) -> Open:
        return Open(*_segment(msg), msg.get("replica") is True, msg.get("pin") is True)


@dataclass(frozen=True)
class Key:
    """Set the job's key (64 hex digits), or read it (None)."""

    OP: ClassVar[Op] = Op.KEY
    key: str | None

    @staticmethod
    def parse(msg: dict[str, Any]) -> Key:
        key = msg.get("key")
        if key is None:
            return Key(None)
        try:  # 64 characters that are not all hex digits (spaces) would be a shorter key
            whole = (
                isinstance(key, str) and len(key) == 2 * KEY_BYTES and len(bytes.fromhex(key)) == KEY_BYTES
            )
        except ValueError:
            whole = False
        if not whole:
            raise BadMessage(f"key must be {2 * KEY_BYTES} hex digits")
        return Key(key)


@dataclass(frozen=True)
class Peer:
    """Replicate to the keeper at ``address:port`` (an IP address, as ``ipaddress`` writes it), or
    to none (``address`` None, ``port`` 0)."""

    OP: ClassVar[Op] = Op.PEER
    address: str | None
    port: int

    @staticmethod
    def parse(msg: dict[str, Any]) -> Peer:
        address, port = msg.get("address"), msg.get("port")
        if address is None:
            return Peer(None, 0)
        try:
            ip = str(ipaddress.ip_address(address)) if isinstance(address, str) else None
        except ValueError:
            ip = None
        if ip is None:
            raise BadMessage("peer address must be an IP address")
        if type(port) is not int or not 0 < port < 65536:
            raise BadMessage("peer port must be 1..65535")
        return Peer(ip, port)


@dataclass(frozen=True)
class Claim:
    """Whether a worker writes ``step`` to the file ``name`` now (``filing.claim``)."""

    OP: ClassVar[Op] = Op.CLAIM
    name: str
    step: int

    @staticmethod
    def parse(msg: dict[str, Any]) -> Claim:
        return Claim(_name(msg), _step(msg))


@dataclass(frozen=True)
class Written:
    """A worker wrote ``step`` to the file ``name``."""

    OP: ClassVar[Op] = Op.WRITTEN
    name: str
    step: int

    @staticmethod
    def parse(msg: dict[str, Any]) -> Written:
        return Written(_name(msg), _step(msg))


@dataclass(frozen=True)
class Put:
    """A replica, keeper to keeper: ``length`` bytes of a frame follow the head."""

    OP: ClassVar[Op] = Op.PUT
    name: str
    rank: int
    step: int
    length: int
    nonce: str

    @staticmethod
    def parse(msg: dict[str, Any]) -> Put:
        return Put(_name(msg), _rank(msg), _step(msg), field_int(msg, "length", MAX_LENGTH), _nonce(msg))


@dataclass(frozen=True)
class Get:
    """A worker of another node asks for a snapshot or replica this keeper holds."""

    OP: ClassVar[Op] = Op.GET
    name: str
    rank: int
    step: int
    nonce: str

    @staticmethod
    def parse(msg: dict[str, Any]) -> Get:
        return Get(_name(msg), _rank(msg), _step(msg), _nonce(msg))


Local = Begin | Commit | ListHeld | Open | Key | Peer | Claim | Written
Link = Put | Get
LOCAL: dict[Op, type[Local]] = {
    kind.OP: kind for kind in (Begin, Commit, ListHeld, Open, Key, Peer, Claim, Written)
}
LINK: dict[Op, type[Link]] = {kind.OP: kind for kind in (Put, Get)}
Message = Local | Link | Reply
Kind = TypeVar("Kind")


# --- the parsers and the encoder -------------------------------------------------------------------


def _kind(msg: dict[str, Any], kinds: dict[Op, Kind]) -> Kind:
    op = msg.get("op")
    kind = next((k for o, k in kinds.items() if o.value == op), None)
    if kind is None:
        raise BadMessage(f"op must be one of {tuple(o.value for o in kinds)}")
    return kind


def parse_request(data: bytes) -> Local:
    """A worker's request on the keeper's socket; raises ``BadMessage``."""
    msg = json_object(data, MAX_MESSAGE)
    return _kind(msg, LOCAL).parse(msg)


def parse_transfer(data: bytes) -> Link:
    """A signed head on the replication link (its tag checked already, ``replica.recv_head``);
    raises ``BadMessage``."""
    msg = json_object(data, MAX_HEAD)
    return _kind(msg, LINK).parse(msg)


def encode_message(msg: Message) -> bytes:
    match msg:
        case Refused(error=error):
            return encode(ok=False, error=error)
        case Done() | Begun() | Committed() | Listed() | Opened() | KeyKnown() | Claimed() | Sending():
            return encode(ok=True, **asdict(msg))
        case _:
            return encode(op=msg.OP.value, **asdict(msg))

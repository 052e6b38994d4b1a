"""The keeper's protocol and a snapshot's frame, written once (standard library only).

The keeper runs this file first, in the namespace of its program (``workers.warm.snapshotkeeper.PARTS``),
as the zygote runs ``zygote_program.shared``; the workers import it.

A worker's requests and the keeper's replies are single JSON objects on a ``SOCK_SEQPACKET`` UNIX
socket; a segment's fd rides along with ``SCM_RIGHTS``. Their types and parsers are the next
parts, ``replies`` and ``requests``, on the checks below (``json_object``, ``field_int``,
``field_text``).

The keeper's control socket (a ``SOCK_SEQPACKET`` pair with the daemon) carries the typed messages
below, one JSON object each: the daemon's ``KeeperConfig`` first, then its ``Order``s (its end
shut: the job ended here); the keeper's ``KeeperReady`` (or ``KeeperUnavailable``), then a
``WriteReport`` per write behind. ``decode_control`` parses what the keeper says, untrusted.

A snapshot's frame, in one segment: ``HEADER`` (magic, step, meta length, total length, CRC-32 of
the meta), padded to ``ALIGN``; the meta (the state's structure with its tensors replaced by
references, and the tensors' table); then each tensor's bytes, each at an ``ALIGN``-ed offset.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from enum import Enum
from typing import Any

SOCKET_ENV = "ELASTICD_SNAPSHOT_SOCKET"  # the keeper's socket, in a 0700 directory of the job's user
MAX_MESSAGE = 64 * 1024
MAX_NAME = 1024  # a snapshot's name: the checkpoint path the script gives
MAX_RANK = 1 << 20
MAX_STEP = (1 << 63) - 1
MAX_SIZE = 1 << 48  # a snapshot's bytes, and so a segment's
MAX_SLOT = 2  # a pair's two segments, and a third while one is pinned
MAX_GEN = 1 << 62
MAX_HELD = 1 << 62  # bytes a keeper holds, over every segment
MAX_LENGTH = 1 << 44  # a replica's bytes on the replication link
MAGIC = b"ELSNAP01"
HEADER = struct.Struct("<8sQQQI")  # magic, step, meta_len, total, meta_crc
ALIGN = 64
KEEPER_NAME = "__elasticd_keeper__"  # the program's __name__: its parts' guards compare with it
MAX_CONTROL = 4096  # a message on the control socket, either way
MAX_SOCKET_PATH = 107  # sun_path, less its NUL
MAX_REASON = 300


class BadMessage(ValueError):
    pass


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def data_offset(meta_len: int) -> int:
    """Where the tensors' bytes start in a frame whose meta is ``meta_len`` bytes."""
    return align(align(HEADER.size) + meta_len)


def header(step: int, meta: bytes, total: int) -> bytes:
    return HEADER.pack(MAGIC, step, len(meta), total, zlib.crc32(meta))


def parse_header(data: bytes) -> tuple[int, int, int, int]:
    """``(step, meta_len, total, meta_crc)`` of a frame's first ``HEADER.size`` bytes."""
    if len(data) < HEADER.size:
        raise BadMessage("short header")
    magic, step, meta_len, total, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BadMessage("not a snapshot frame")
    if step > MAX_STEP or data_offset(meta_len) > total:
        raise BadMessage("inconsistent header")
    return step, meta_len, total, crc


def encode(**msg: Any) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


def json_object(data: bytes, limit: int) -> dict[str, Any]:
    """A message: one JSON object of at most ``limit`` bytes; raises ``BadMessage``."""
    if len(data) > limit:
        raise BadMessage(f"message over {limit} bytes")
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):
        raise BadMessage("not JSON") from None
    if not isinstance(msg, dict):
        raise BadMessage("not an object")
    return msg


def field_int(msg: dict[str, Any], key: str, top: int) -> int:
    value = msg.get(key)
    if type(value) is not int or not 0 <= value <= top:
        raise BadMessage(f"{key} must be an integer in 0..{top}")
    return value


def field_text(msg: dict[str, Any], key: str, low: int = 0) -> str:
    value = msg.get(key)
    if not isinstance(value, str) or not low <= len(value) <= MAX_NAME or "\0" in value:
        raise BadMessage(f"{key} must be a string of {low}..{MAX_NAME} characters")
    return value


# --- the control socket, between the daemon and the job's keeper ----------------------------------


@dataclass(frozen=True)
class KeeperConfig:
    """The daemon's first message: the job's bound on this node, and the address other nodes'
    keepers reach this one at ("": no replication)."""

    bound: int
    address: str


class Order(Enum):
    """The daemon's word after the configuration. PERSIST: the job's workers here stopped (a
    failure): write behind what no worker wrote. Its end shut instead: the job ended here."""

    PERSIST = "persist"


@dataclass(frozen=True)
class KeeperReady:
    pid: int
    socket: str  # where the workers reach it (an absolute path)
    port: int  # where other keepers reach it (0: no replication)


@dataclass(frozen=True)
class KeeperUnavailable:
    reason: str


class Report(Enum):
    """A write behind (``filing``): PERSISTING when it starts, then PERSISTED or PERSIST_FAILED;
    PERSIST_FAILED alone when it could not start."""

    PERSISTING = "persisting"
    PERSISTED = "persisted"
    PERSIST_FAILED = "persist_failed"


@dataclass(frozen=True)
class WriteReport:
    report: Report
    step: int
    took_s: float | None = None  # once it ended
    reason: str = ""  # why it failed
    pid: int | None = None  # the writer, when it starts

    def fields(self) -> dict[str, object]:
        """What a log line says of it."""
        out: dict[str, object] = {"step": self.step}
        if self.took_s is not None:
            out["took_s"] = self.took_s
        if self.report is Report.PERSIST_FAILED:
            out["reason"] = self.reason
        return out


Control = KeeperConfig | Order | KeeperReady | KeeperUnavailable | WriteReport


def encode_control(msg: Control) -> bytes:
    if isinstance(msg, Order):
        return encode(op=msg.value)
    if isinstance(msg, KeeperConfig):
        return encode(bound=msg.bound, address=msg.address)
    if isinstance(msg, KeeperReady):
        return encode(ev="ready", pid=msg.pid, socket=msg.socket, port=msg.port)
    if isinstance(msg, KeeperUnavailable):
        return encode(ev="unavailable", reason=msg.reason)
    fields: dict[str, Any] = {"ev": msg.report.value, "step": msg.step}
    if msg.took_s is not None:
        fields["took_s"] = msg.took_s
    if msg.reason:
        fields["reason"] = msg.reason
    if msg.pid is not None:
        fields["pid"] = msg.pid
    return encode(**fields)


def decode_config(data: bytes) -> KeeperConfig:
    """The daemon's configuration (in the keeper); raises ``BadMessage``."""
    msg = json_object(data, MAX_CONTROL)
    bound, address = msg.get("bound"), msg.get("address")
    if type(bound) is not int or bound < 0 or not isinstance(address, str):
        raise BadMessage("bad configuration")
    return KeeperConfig(bound, address)


def decode_order(data: bytes) -> Order | None:
    """The daemon's word (in the keeper); None for one it does not know."""
    try:
        return Order(json_object(data, MAX_CONTROL).get("op"))
    except (BadMessage, ValueError):
        return None


def decode_control(data: bytes) -> KeeperReady | KeeperUnavailable | WriteReport:
    """What the keeper says (in the daemon: untrusted, every field bounded); raises ``BadMessage``."""
    msg = json_object(data, MAX_CONTROL)
    event = msg.get("ev")
    if event == "unavailable":
        return KeeperUnavailable(str(msg.get("reason"))[:200])
    if event == "ready":
        path, port = msg.get("socket"), msg.get("port")
        if type(msg.get("pid")) is not int or not isinstance(path, str):
            raise BadMessage("not a ready message")
        if not path.startswith("/") or len(path.encode()) > MAX_SOCKET_PATH or "\0" in path or "\n" in path:
            raise BadMessage("not a usable socket path")
        return KeeperReady(msg["pid"], path, port if type(port) is int else 0)
    try:
        report = Report(event)
    except ValueError:
        raise BadMessage("not a report") from None
    step = msg.get("step")
    if type(step) is not int or not 0 <= step < 1 << 63:
        raise BadMessage("no step")
    took = msg.get("took_s")
    took_s = float(took) if isinstance(took, (int, float)) and not isinstance(took, bool) else None
    if took_s is not None and not 0 <= took_s < 1e6:
        took_s = None
    reason = str(msg.get("reason"))[:MAX_REASON] if report is Report.PERSIST_FAILED else ""
    return WriteReport(report, step, took_s, reason)

"""The keeper's protocol and a snapshot's frame, written once (standard library only).

The keeper runs this file first, in the namespace of its program (``workers.warm.snapshotkeeper.PARTS``),
as the zygote runs ``zygote_program.shared``; the workers import it.

Requests and replies are single JSON objects on a ``SOCK_SEQPACKET`` UNIX socket; a segment's fd
rides along with ``SCM_RIGHTS``. Every request is parsed here, bounded, and refused with a reason.

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
MAGIC = b"ELSNAP01"
HEADER = struct.Struct("<8sQQQI")  # magic, step, meta_len, total, meta_crc
ALIGN = 64
OPS = ("begin", "commit", "list", "open", "key", "peer", "claim", "written")
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


def _int(req: dict[str, Any], key: str, top: int) -> int:
    value = req.get(key)
    if type(value) is not int or not 0 <= value <= top:
        raise BadMessage(f"{key} must be an integer in 0..{top}")
    return value


def parse_request(data: bytes) -> dict[str, Any]:
    """One request: ``begin`` (name, rank, step, size, file: this rank writes the file ``name``,
    lib: where its ``elasticd`` was imported from),
    ``commit`` (name, rank, slot, gen), ``list`` (name), ``open`` (name, rank, slot, gen, replica,
    pin: never write it again), ``key`` (the job's key to set, or null: read it), ``peer`` (address
    and port of the keeper to replicate to, or null), ``claim`` (name, step: a worker is about to
    write the file) or ``written`` (name, step: it did). ``key``'s and ``peer``'s values are checked
    by ``replica``. Raises ``BadMessage``."""
    if len(data) > MAX_MESSAGE:
        raise BadMessage("message too long")
    try:
        req = json.loads(data)
    except (ValueError, RecursionError):
        raise BadMessage("not JSON") from None
    if not isinstance(req, dict) or req.get("op") not in OPS:
        raise BadMessage(f"op must be one of {OPS}")
    if req["op"] == "key":
        return {"op": "key", "key": req.get("key")}
    if req["op"] == "peer":
        return {"op": "peer", "address": req.get("address"), "port": req.get("port")}
    name = req.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or "\0" in name:
        raise BadMessage(f"name must be a string of 1..{MAX_NAME} characters")
    out: dict[str, Any] = {"op": req["op"], "name": name}
    if req["op"] == "list":
        return out
    if req["op"] in ("claim", "written"):
        out["step"] = _int(req, "step", MAX_STEP)
        return out
    out["rank"] = _int(req, "rank", MAX_RANK)
    if req["op"] == "begin":
        out["step"] = _int(req, "step", MAX_STEP)
        out["size"] = _int(req, "size", 1 << 48)
        out["file"] = req.get("file") is True
        lib = req.get("lib", "")
        if not isinstance(lib, str) or len(lib) > MAX_NAME or "\0" in lib:
            raise BadMessage(f"lib must be a string of at most {MAX_NAME} characters")
        out["lib"] = lib
    else:
        out["slot"] = _int(req, "slot", 2)
        out["gen"] = _int(req, "gen", 1 << 62)
        out["replica"] = req.get("replica") is True
        out["pin"] = req.get("pin") is True
    return out


def parse_reply(data: bytes) -> dict[str, Any]:
    """A keeper's reply: an object with ``ok``; an ``error`` text when not ok."""
    try:
        reply = json.loads(data)
    except (ValueError, RecursionError):
        raise BadMessage("reply is not JSON") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise BadMessage("reply has no ok")
    if not reply["ok"] and not isinstance(reply.get("error"), str):
        raise BadMessage("refusal without a reason")
    return reply


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


def _control_object(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_CONTROL:
        raise BadMessage(f"message over {MAX_CONTROL} bytes")
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):
        raise BadMessage("not JSON") from None
    if not isinstance(msg, dict):
        raise BadMessage("not an object")
    return msg


def decode_config(data: bytes) -> KeeperConfig:
    """The daemon's configuration (in the keeper); raises ``BadMessage``."""
    msg = _control_object(data)
    bound, address = msg.get("bound"), msg.get("address")
    if type(bound) is not int or bound < 0 or not isinstance(address, str):
        raise BadMessage("bad configuration")
    return KeeperConfig(bound, address)


def decode_order(data: bytes) -> Order | None:
    """The daemon's word (in the keeper); None for one it does not know."""
    try:
        return Order(_control_object(data).get("op"))
    except (BadMessage, ValueError):
        return None


def decode_control(data: bytes) -> KeeperReady | KeeperUnavailable | WriteReport:
    """What the keeper says (in the daemon: untrusted, every field bounded); raises ``BadMessage``."""
    msg = _control_object(data)
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

"""The keeper's protocol and a snapshot's frame, written once (standard library only).

The keeper runs this file first, in the namespace of its program (``workers.warm.keeper.PARTS``),
as the zygote runs ``zygote_program.shared``; the workers import it.

Requests and replies are single JSON objects on a ``SOCK_SEQPACKET`` UNIX socket; a segment's fd
rides along with ``SCM_RIGHTS``. Every request is parsed here, bounded, and refused with a reason.

A snapshot's frame, in one segment: ``HEADER`` (magic, step, meta length, total length, CRC-32 of
the meta), padded to ``ALIGN``; the meta (the state's structure with its tensors replaced by
references, and the tensors' table); then each tensor's bytes, each at an ``ALIGN``-ed offset.
"""

from __future__ import annotations

import json
import struct
import zlib
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
# What the keeper tells the daemon on its control socket about a write behind (filing).
PERSISTING, PERSISTED, PERSIST_FAILED = "persisting", "persisted", "persist_failed"
REPORTS = (PERSISTING, PERSISTED, PERSIST_FAILED)


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

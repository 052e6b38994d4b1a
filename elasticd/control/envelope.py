"""The control protocol's envelope: versioned JSON with request ids, capped in size.

Request: ``{"v": 1, "id": "<str>", "cmd": "<name>", "args": {...}}``
Reply:   ``{"v": 1, "id": "<same>", "ok": true, "result": {...}}``
     or  ``{"v": 1, "id": "<same>", "ok": false, "error": {"code": "<ErrorCode>", "message": "..."}}``

A reply echoes the request id; clients drop replies whose id does not match their request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from elasticd.errors import BadRequest, TooLarge, UnsupportedVersion, to_wire
from elasticd.wire.replies import Encoded

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1024 * 1024  # larger requests get a too_large error reply
TRANSPORT_LIMIT_BYTES = 16 * 1024 * 1024  # larger frames are dropped by ZeroMQ without a reply
MAX_ID_LENGTH = 128


@dataclass(frozen=True)
class Request:
    id: str
    cmd: str
    args: dict[str, Any]


def best_effort_id(raw: bytes) -> str:
    """The id of a request we reject, if one can be read at all (so the client can match it)."""
    try:
        data = json.loads(raw)
        rid = data.get("id") if isinstance(data, dict) else None
        return rid if isinstance(rid, str) and len(rid) <= MAX_ID_LENGTH else ""
    except (ValueError, UnicodeDecodeError, RecursionError):
        return ""


def parse_request(raw: bytes) -> Request:
    if len(raw) > MAX_MESSAGE_BYTES:
        raise TooLarge(f"request is {len(raw)} bytes; the limit is {MAX_MESSAGE_BYTES}")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise BadRequest("request is nested too deeply") from exc
    if not isinstance(data, dict):
        raise BadRequest("request must be a JSON object")
    version = data.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise UnsupportedVersion(f"protocol version {version!r} is not supported; use {PROTOCOL_VERSION}")
    rid, cmd, args = data.get("id"), data.get("cmd"), data.get("args", {})
    if not isinstance(rid, str) or not rid or len(rid) > MAX_ID_LENGTH:
        raise BadRequest(f"'id' must be a non-empty string of at most {MAX_ID_LENGTH} characters")
    if not isinstance(cmd, str) or not cmd:
        raise BadRequest("'cmd' must be a non-empty string")
    if not isinstance(args, dict):
        raise BadRequest("'args' must be a JSON object")
    unknown = set(data) - {"v", "id", "cmd", "args"}
    if unknown:
        raise BadRequest(f"unknown envelope fields: {sorted(unknown)}")
    return Request(rid, cmd, args)


def encode_request(rid: str, cmd: str, args: dict[str, Any]) -> bytes:
    return json.dumps({"v": PROTOCOL_VERSION, "id": rid, "cmd": cmd, "args": args}).encode()


def encode_ok(rid: str, result: Any) -> bytes:
    if isinstance(result, Encoded):
        head = json.dumps({"v": PROTOCOL_VERSION, "id": rid, "ok": True}).encode()
        return b"".join((head[:-1], b', "result": ', *result.parts, b"}"))
    return json.dumps({"v": PROTOCOL_VERSION, "id": rid, "ok": True, "result": result}).encode()


def encode_error(rid: str, exc: BaseException) -> bytes:
    return json.dumps({"v": PROTOCOL_VERSION, "id": rid, "ok": False, "error": to_wire(exc)}).encode()

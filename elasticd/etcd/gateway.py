"""etcd's v3 API as its JSON gateway speaks it: request bodies, response parsing, error mapping.

Pure (no I/O): ``elasticd.etcd.client`` sends what these functions build and hands back what
it receives. The gateway is grpc-gateway over the same v3 API as grpc: keys and values are
base64, 64-bit integers are JSON strings, and fields at their zero value are left out (no
``kvs`` for an empty range, no ``count`` when it is 0, no ``succeeded`` for a failed txn, no
``TTL`` for an expired lease). Streaming calls (``/v3/watch``, ``/v3/lease/keepalive``) answer
one JSON object per line, each ``{"result": ...}`` or ``{"error": {...}}``.

Every response is untrusted input: a shape we do not expect is a ``GatewayError`` with
``Failure.UNREACHABLE`` (a proxy or an old server answered, not etcd's gateway), never a crash.

Errors are mapped here, once: ``error_of`` turns an HTTP status and body into a ``GatewayError``
whose ``failure`` tells the client what to do (fail over, log in again, or give up).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from elasticd import decode
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.types import Compare, EtcdStatus, Found, KeyValue, Put, Query, WatchEvent

# grpc status codes, as the gateway reports them in "code" / "grpc_code"
PERMISSION_DENIED = 7
UNAUTHENTICATED = 16
NOT_FOUND = 5
FAILED_PRECONDITION = 9
RESOURCE_EXHAUSTED = 8
OUT_OF_RANGE = 11
# cancelled, deadline exceeded, resource exhausted, aborted, internal, unavailable: worth another member
_TRANSIENT = frozenset({1, 4, 8, 10, 13, 14})

CN_REJECTED_TEXT = "CommonName of client sending a request against gateway"
NO_SPACE_TEXT = "database space exceeded"  # etcdserver: mvcc: database space exceeded
COMPACTED_TEXT = "required revision has been compacted"


class Failure(Enum):
    """What a failed request means, and so what the client does about it."""

    UNREACHABLE = "unreachable"  # this endpoint cannot serve now: try the next one
    DENIED = "denied"  # RBAC said no: every member says the same, no failover
    UNAUTHENTICATED = "unauthenticated"  # the token was forgotten or expired: log in again, once
    CN_CERT = "cn_cert"  # auth is on and our client certificate has a CN: the gateway refuses it
    REFUSED = "refused"  # the request itself is wrong (unknown lease, duplicate key, bad login)
    NO_SPACE = "no_space"  # etcd is at its quota (NOSPACE): it refuses what would grow the database


class GatewayError(Exception):
    def __init__(self, failure: Failure, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.failure = failure
        self.message = message
        self.code = code


def failure_of(code: int) -> Failure:
    if code == PERMISSION_DENIED:
        return Failure.DENIED
    if code == UNAUTHENTICATED:
        return Failure.UNAUTHENTICATED
    return Failure.UNREACHABLE if code in _TRANSIENT else Failure.REFUSED


def error_of(status: int, body: bytes) -> GatewayError:
    """The error of a non-200 answer: unary calls say ``{"error", "code", "message"}``; anything
    that is not such JSON (a plain-text refusal, a proxy's page) is named by its first line."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and "code" in obj:
        return _error(obj.get("code"), obj.get("message") or obj.get("error"))
    first = text.splitlines()[0][:200] if text else "(empty body)"
    if status == 400 and first.startswith(CN_REJECTED_TEXT):
        return GatewayError(Failure.CN_CERT, first)
    return GatewayError(Failure.UNREACHABLE, f"HTTP {status}: {first}")


def status_error(code: int, message: str) -> GatewayError:
    """A grpc status (the grpc client's failed call) mapped as the gateway's same code is."""
    return _error(code, message)


def _error(code: Any, message: Any) -> GatewayError:
    number = code if isinstance(code, int) and not isinstance(code, bool) else -1
    text = str(message or f"grpc code {code}")[:500]
    if number == RESOURCE_EXHAUSTED and NO_SPACE_TEXT in text:
        # Every member refuses the same (the alarm is the cluster's): no failover, a reason of its own.
        return GatewayError(Failure.NO_SPACE, text, number)
    return GatewayError(failure_of(number), text, number)


# -- encoding ------------------------------------------------------------------------------------
def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


def key_range(key: str, *, prefix: bool = False, end: str | None = None) -> dict[str, str]:
    """``{"key", "range_end"}`` for one key, a prefix, or [key, end)."""
    body = {"key": b64(key)}
    if prefix:
        body["range_end"] = b64(prefix_end(key))
    elif end is not None:
        body["range_end"] = b64(end)
    return body


def range_request(q: Query, revision: int = 0) -> dict[str, Any]:
    """A RangeRequest; ``revision``: as of that store revision (0: the newest), which a member
    that has applied it serves without a consensus round. Without a sort etcd returns keys in key
    order."""
    body: dict[str, Any] = key_range(q.key, prefix=q.prefix, end=q.end)
    if q.oldest_only:
        body |= {"sort_order": "ASCEND", "sort_target": "CREATE", "limit": "1"}
    elif q.first_only:
        body["limit"] = "1"  # count is still the whole range's
    elif q.limit:
        body["limit"] = str(q.limit)
    if q.count_only:
        body["count_only"] = True
    if q.min_mod_revision:
        body["min_mod_revision"] = str(q.min_mod_revision)
    if q.serializable or revision:
        body["serializable"] = True
    if revision:
        body["revision"] = str(revision)
    return body


def put_request(key: str, value: bytes, lease: int | None) -> dict[str, Any]:
    body = {"key": b64(key), "value": b64(value)}
    if lease:
        body["lease"] = str(lease)
    return body


def txn_request(
    compare: Sequence[Compare], puts: Sequence[tuple[Put, bytes]], deletes: Sequence[str | Query]
) -> dict[str, Any]:
    """If every compare holds (create or mod revision, or lease, EQUAL), the puts (with their
    encoded values) and the deletes; nothing otherwise."""
    checks = []
    for c in compare:
        field = "lease" if c.target == "lease" else f"{c.target}_revision"
        checks.append(
            {"key": b64(c.key), "target": c.target.upper(), "result": "EQUAL", field: str(c.revision)}
        )
    success: list[dict[str, Any]] = [{"request_put": put_request(p.key, v, p.lease)} for p, v in puts]
    for d in deletes:
        q = d if isinstance(d, Query) else Query(d)
        success.append({"request_delete_range": key_range(q.key, prefix=q.prefix, end=q.end)})
    return {"compare": checks, "success": success}


def write_and_read_request(
    compare: Sequence[Compare],
    puts: Sequence[tuple[Put, bytes]],
    deletes: Sequence[str | Query],
    reads: Sequence[Query],
) -> dict[str, Any]:
    """``txn_request`` whose success ends with ``reads`` (which see its writes)."""
    body = txn_request(compare, puts, deletes)
    body["success"] += [{"request_range": range_request(q)} for q in reads]
    return body


def parse_write_and_read(obj: dict[str, Any], n: int) -> list[Found] | None:
    """The last ``n`` answers of a ``write_and_read_request`` (None: a comparison failed)."""
    if not parse_txn(obj):
        return None
    responses = _list(obj, "responses")
    if len(responses) < n:
        raise _malformed(f"{len(responses)} responses to a transaction that reads {n} ranges")
    return [parse_range(_object(r, "response_range")) for r in responses[len(responses) - n :]]


def read_many_request(queries: Sequence[Query]) -> dict[str, Any]:
    """A transaction of ranges only: several reads at one revision, in one round trip."""
    return {"success": [{"request_range": range_request(q)} for q in queries]}


def watch_request(start: str, end: str, deletes_only: bool = False, revision: int = 0) -> dict[str, Any]:
    create: dict[str, Any] = dict(key_range(start, end=end))
    if revision:
        create["start_revision"] = str(revision)
    if deletes_only:
        create["filters"] = ["NOPUT"]  # etcd drops the puts before they are sent
    return {"create_request": create}


def lease_request(lease_id: int) -> dict[str, str]:
    return {"ID": str(lease_id)}


ALARM_GET = {"action": "GET"}


def compact_request(revision: int) -> dict[str, Any]:
    """Compact the history up to ``revision``, not waiting for the space to be freed (etcd does
    that in the background, in batches)."""
    return {"revision": str(revision), "physical": False}


# -- decoding ------------------------------------------------------------------------------------
def _malformed(what: str) -> GatewayError:
    return GatewayError(Failure.UNREACHABLE, f"not an etcd gateway answer: {what}")


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        obj = decode.parse_json(body)  # the one JSON reader for untrusted bytes (depth, bad UTF-8)
    except decode.DecodeError as exc:
        raise _malformed(f"its body {exc.why}") from None
    if not isinstance(obj, dict):
        raise _malformed("not a JSON object")
    return obj


def _int(obj: dict[str, Any], name: str) -> int:
    value = obj.get(name, "0")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _malformed(f"{name} is not an integer")
    try:
        return int(value)
    except ValueError as exc:
        raise _malformed(f"{name} is not an integer") from exc


def _bytes(obj: dict[str, Any], name: str) -> bytes:
    value = obj.get(name, "")
    if not isinstance(value, str):
        raise _malformed(f"{name} is not base64")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _malformed(f"{name} is not base64") from exc


def _list(obj: dict[str, Any], name: str) -> list[dict[str, Any]]:
    value = obj.get(name, [])
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise _malformed(f"{name} is not a list of objects")
    return value


def _object(obj: dict[str, Any], name: str) -> dict[str, Any]:
    value = obj.get(name, {})
    if not isinstance(value, dict):
        raise _malformed(f"{name} is not an object")
    return value


def parse_kv(obj: dict[str, Any]) -> KeyValue:
    key = _bytes(obj, "key").decode("utf-8", "replace")
    return KeyValue(key, _bytes(obj, "value"), _int(obj, "create_revision"), _int(obj, "mod_revision"),
                    _int(obj, "lease"))  # fmt: skip


def parse_range(obj: dict[str, Any]) -> Found:
    return Found([parse_kv(kv) for kv in _list(obj, "kvs")], _int(obj, "count"))


def parse_range_answer(obj: dict[str, Any]) -> Found:
    """A RangeRequest's answer, with the store revision it was served at (0: not told)."""
    revision = _int(_object(obj, "header"), "revision") if "header" in obj else 0
    return replace(parse_range(obj), revision=revision)


def parse_txn(obj: dict[str, Any]) -> bool:
    return obj.get("succeeded") is True


def parse_read_many(obj: dict[str, Any], n: int) -> list[Found]:
    responses = _list(obj, "responses")
    if len(responses) != n:
        raise _malformed(f"{len(responses)} responses to {n} ranges")
    revision = _int(_object(obj, "header"), "revision") if "header" in obj else 0
    return [replace(parse_range(_object(r, "response_range")), revision=revision) for r in responses]


def parse_deleted(obj: dict[str, Any]) -> int:
    return _int(obj, "deleted")


def parse_lease_id(obj: dict[str, Any]) -> int:
    lease_id = _int(obj, "ID")
    if lease_id <= 0:
        raise _malformed("no lease ID")
    return lease_id


def stream_result(obj: dict[str, Any]) -> dict[str, Any]:
    """One line of a streaming answer: its ``result``, or its ``error`` raised."""
    if "error" in obj:
        error = obj["error"]
        if isinstance(error, dict):
            raise _error(error.get("grpc_code"), error.get("message"))
        raise _error(obj.get("code"), obj.get("message") or error)
    return _object(obj, "result")


def parse_keepalive(obj: dict[str, Any]) -> int:
    """The remaining TTL after a keep-alive; 0 (the field left out) when the lease is gone."""
    return _int(stream_result(obj), "TTL")


def auth_disabled(exc: GatewayError) -> bool:
    """The answer to a login while etcd's auth is off (then requests need no token)."""
    return exc.code == FAILED_PRECONDITION and "authentication is not enabled" in exc.message


def parse_token(obj: dict[str, Any]) -> str:
    token = obj.get("token")
    if not isinstance(token, str) or not token or not token.isprintable():
        raise _malformed("no auth token")
    return token


def parse_version(obj: dict[str, Any]) -> str:
    version = obj.get("version")
    if not isinstance(version, str):
        raise _malformed("no version")
    return version[:64]


def parse_status(status: dict[str, Any], alarms: dict[str, Any]) -> EtcdStatus:
    """``/v3/maintenance/status`` and ``/v3/maintenance/alarm`` (GET), as one record."""
    raised: set[str] = set()
    for member in _list(alarms, "alarms"):
        alarm = member.get("alarm", "NONE")  # the zero value, NONE, is left out
        if not isinstance(alarm, str) or not (alarm.isascii() and alarm.isupper() and len(alarm) <= 32):
            raise _malformed("an alarm is not an alarm name")
        if alarm != "NONE":
            raised.add(alarm)  # one unknown to this daemon is still shown, by its name
    revision = _int(_object(status, "header"), "revision")
    try:
        return EtcdStatus(
            _int(status, "dbSize"), _int(status, "dbSizeInUse"), revision, tuple(sorted(raised))
        )
    except ValueError as exc:
        raise _malformed(str(exc)) from None


def watch_canceled(reason: str) -> GatewayError:
    """A watch that etcd canceled as it was created (it says why only in words)."""
    failure = Failure.DENIED if "permission denied" in reason else Failure.REFUSED
    return GatewayError(failure, reason[:500])


@dataclass(frozen=True)
class WatchMessage:
    """One line of a watch stream. ``canceled`` (compaction, permission) ends the watch."""

    created: bool = False
    canceled: bool = False
    reason: str = ""
    events: list[tuple[str, bool]] = field(default_factory=list)  # (key, deleted), in order
    changes: list[WatchEvent] = field(default_factory=list)  # the same, with values and revisions


def parse_watch(line: bytes) -> WatchMessage:
    result = stream_result(parse_json(line))
    events, changes = [], []
    for event in _list(result, "events"):
        kv = parse_kv(_object(event, "kv"))
        deleted = event.get("type") == "DELETE"
        events.append((kv.key, deleted))
        changes.append(WatchEvent(kv, deleted))
    reason = result.get("cancel_reason", "")
    if result.get("canceled") is True and result.get("compact_revision"):
        reason = reason or f"compacted at revision {result['compact_revision']}"
    return WatchMessage(
        result.get("created") is True, result.get("canceled") is True, str(reason)[:500], events, changes
    )

"""elasticd.control.envelope: request parsing, reply encoding, error mapping."""

from __future__ import annotations

import json
from typing import Any

import pytest

from elasticd.control.envelope import (
    MAX_ID_LENGTH,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    Request,
    best_effort_id,
    encode_error,
    encode_ok,
    encode_request,
    parse_request,
)
from elasticd.errors import (
    BadRequest,
    ElasticdError,
    ErrorCode,
    InsufficientCapacity,
    JobNotFound,
    TooLarge,
    UnsupportedVersion,
)
from elasticd.wire.replies import Encoded


def raw(obj: Any) -> bytes:
    return json.dumps(obj).encode()


GOOD: dict[str, Any] = {"v": 1, "id": "req-1", "cmd": "status", "args": {"job": "j"}}


def test_parse_good_request() -> None:
    assert parse_request(raw(GOOD)) == Request("req-1", "status", {"job": "j"})


def test_args_default_to_empty() -> None:
    assert parse_request(raw({"v": 1, "id": "x", "cmd": "ping"})) == Request("x", "ping", {})


def test_encode_request_round_trip() -> None:
    data = encode_request("abc", "logs", {"job": "j", "cursor": {}})
    assert parse_request(data) == Request("abc", "logs", {"job": "j", "cursor": {}})
    assert json.loads(data)["v"] == PROTOCOL_VERSION


def test_id_at_max_length_is_accepted() -> None:
    rid = "x" * MAX_ID_LENGTH
    assert parse_request(raw(GOOD | {"id": rid})).id == rid


@pytest.mark.parametrize(
    "data",
    [b"", b"not json", b"{", b"\xff\xfe\x00garbage", b"{'v': 1}", b"\x80abc"],
)
def test_not_json_is_bad_request(data: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_request(data)


@pytest.mark.parametrize("obj", [[], [GOOD], "req", 1, None, True])
def test_not_an_object_is_bad_request(obj: Any) -> None:
    with pytest.raises(BadRequest):
        parse_request(raw(obj))


@pytest.mark.parametrize("version", [0, 2, "1", None, [1], {"v": 1}, -1])
def test_wrong_version(version: Any) -> None:
    with pytest.raises(UnsupportedVersion):
        parse_request(raw(GOOD | {"v": version}))


def test_missing_version() -> None:
    data = {k: v for k, v in GOOD.items() if k != "v"}
    with pytest.raises(UnsupportedVersion):
        parse_request(raw(data))


def test_version_is_checked_before_other_fields() -> None:
    # a client speaking another version gets the version error, not a complaint about its fields
    with pytest.raises(UnsupportedVersion):
        parse_request(raw({"v": 2, "request_id": 5, "extra": True}))


@pytest.mark.parametrize(
    "fields",
    [
        {"id": None},
        {"id": ""},
        {"id": 5},
        {"id": ["a"]},
        {"id": "x" * (MAX_ID_LENGTH + 1)},
        {"cmd": None},
        {"cmd": ""},
        {"cmd": 3},
        {"cmd": ["status"]},
        {"args": None},
        {"args": []},
        {"args": "job=j"},
        {"args": 1},
        {"extra": 1},
        {"ok": True},
        {"result": {}},
    ],
    ids=repr,
)
def test_bad_envelope_fields(fields: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request(raw(GOOD | fields))
    assert info.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.parametrize("missing", ["id", "cmd"])
def test_missing_envelope_fields(missing: str) -> None:
    with pytest.raises(BadRequest):
        parse_request(raw({k: v for k, v in GOOD.items() if k != missing}))


def test_unknown_fields_are_named() -> None:
    with pytest.raises(BadRequest, match="zzz"):
        parse_request(raw(GOOD | {"zzz": 1}))


def _padded(total: int) -> bytes:
    """A valid request of exactly ``total`` bytes."""
    base = raw(GOOD | {"args": {"pad": ""}})
    return raw(GOOD | {"args": {"pad": "p" * (total - len(base))}})


def test_request_at_the_size_limit_is_accepted() -> None:
    data = _padded(MAX_MESSAGE_BYTES)
    assert len(data) == MAX_MESSAGE_BYTES
    assert parse_request(data).cmd == "status"


def test_request_over_the_size_limit_is_too_large() -> None:
    data = _padded(MAX_MESSAGE_BYTES + 1)
    with pytest.raises(TooLarge) as info:
        parse_request(data)
    assert info.value.code is ErrorCode.TOO_LARGE


def test_too_large_is_checked_before_parsing() -> None:
    with pytest.raises(TooLarge):
        parse_request(b"x" * (MAX_MESSAGE_BYTES + 1))


@pytest.mark.parametrize(
    ("data", "rid"),
    [
        (raw(GOOD), "req-1"),
        (raw({"v": 99, "id": "old-client"}), "old-client"),  # readable even when the request is rejected
        (raw({"id": "x", "extra": 1}), "x"),
        (raw({"id": 5}), ""),
        (raw({"id": None}), ""),
        (raw({"id": "x" * (MAX_ID_LENGTH + 1)}), ""),
        (raw({"id": "x" * MAX_ID_LENGTH}), "x" * MAX_ID_LENGTH),
        (raw(["id"]), ""),
        (raw("id"), ""),
        (b"not json", ""),
        (b"\xff\xfe\xfd", ""),
        (b"", ""),
    ],
)
def test_best_effort_id(data: bytes, rid: str) -> None:
    assert best_effort_id(data) == rid


def test_encode_ok() -> None:
    assert json.loads(encode_ok("r1", {"pong": True})) == {
        "v": PROTOCOL_VERSION,
        "id": "r1",
        "ok": True,
        "result": {"pong": True},
    }


def test_encode_ok_with_non_object_result() -> None:
    assert json.loads(encode_ok("r1", [1, 2]))["result"] == [1, 2]
    assert json.loads(encode_ok("r1", None))["result"] is None


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (BadRequest("nope"), {"code": "bad_request", "message": "nope"}),
        (JobNotFound("no job 'j'"), {"code": "job_not_found", "message": "no job 'j'"}),
        (
            InsufficientCapacity("too many", requested=9, available=4),
            {
                "code": "insufficient_capacity",
                "message": "too many",
                "details": {"requested": 9, "available": 4},
            },
        ),
        (ElasticdError("base"), {"code": "internal", "message": "base"}),
    ],
)
def test_encode_error(exc: BaseException, error: dict[str, Any]) -> None:
    assert json.loads(encode_error("r2", exc)) == {
        "v": PROTOCOL_VERSION,
        "id": "r2",
        "ok": False,
        "error": error,
    }


@pytest.mark.parametrize(
    "exc", [RuntimeError("secret /etc/shadow path"), KeyError("password"), ValueError("token=abc")]
)
def test_unexpected_exception_is_internal_and_does_not_leak(exc: BaseException) -> None:
    reply = encode_error("r3", exc)
    body = json.loads(reply)
    assert body["ok"] is False
    assert body["error"]["code"] == "internal"
    assert "details" not in body["error"]
    for secret in ("shadow", "password", "token", type(exc).__name__):
        assert secret not in reply.decode()


DEEP = b"[" * 100_000 + b"]" * 100_000  # well under MAX_MESSAGE_BYTES


def test_best_effort_id_of_deeply_nested_json() -> None:
    assert best_effort_id(DEEP) == ""


def test_deeply_nested_json_is_bad_request() -> None:
    with pytest.raises(BadRequest):
        parse_request(DEEP)


def test_boolean_version_is_unsupported() -> None:
    with pytest.raises(UnsupportedVersion):
        parse_request(raw(GOOD | {"v": True}))


def test_a_result_encoded_already_is_sent_as_it_is() -> None:
    result = {"jobs": [{"id": "j1", "argv": ["a", "\u2603"]}, {"id": "j2"}]}
    encoded = encode_ok("r1", Encoded(json.dumps(result).encode()))
    assert json.loads(encoded) == json.loads(encode_ok("r1", result))

"""The JSON gateway codec (elasticd.etcd.gateway): request bodies, answers as etcd 3.5 writes them
(zero values left out, int64 as strings, base64), error mapping, and malformed answers."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.etcd import gateway as gw
from elasticd.etcd.gateway import Failure, GatewayError
from elasticd.etcd.kv import ALL_KEYS, prefix_end
from elasticd.etcd.types import Compare, Found, KeyValue, Put, Query


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- requests ------------------------------------------------------------------------------------
def test_range_requests() -> None:
    assert gw.range_request(Query("/k")) == {"key": b64("/k")}
    assert gw.range_request(Query("/p/", prefix=True)) == {"key": b64("/p/"), "range_end": b64("/p0")}
    assert gw.range_request(Query("/a", end="/b")) == {"key": b64("/a"), "range_end": b64("/b")}
    assert gw.range_request(Query("/p/", prefix=True, oldest_only=True, count_only=True)) == {
        "key": b64("/p/"),
        "range_end": b64("/p0"),
        "sort_order": "ASCEND",
        "sort_target": "CREATE",
        "limit": "1",
        "count_only": True,
    }
    assert gw.range_request(Query("", prefix=True))["range_end"] == b64("\0")  # every key


def test_txn_request() -> None:
    body = gw.txn_request(
        [Compare("/a", "create", 0), Compare("/b", "mod", 12345678901234)],
        [(Put("/a", None, 7), b"1"), (Put("/c", None), b'"x"')],
        ["/d"],
    )
    assert body == {
        "compare": [
            {"key": b64("/a"), "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
            {"key": b64("/b"), "target": "MOD", "result": "EQUAL", "mod_revision": "12345678901234"},
        ],
        "success": [
            {"request_put": {"key": b64("/a"), "value": b64("1"), "lease": "7"}},
            {"request_put": {"key": b64("/c"), "value": b64('"x"')}},
            {"request_delete_range": {"key": b64("/d")}},
        ],
    }


def test_read_many_watch_and_lease_requests() -> None:
    assert gw.read_many_request([Query("/a"), Query("/b", count_only=True)]) == {
        "success": [
            {"request_range": {"key": b64("/a")}},
            {"request_range": {"key": b64("/b"), "count_only": True}},
        ]
    }
    assert gw.watch_request("/a", "/b") == {"create_request": {"key": b64("/a"), "range_end": b64("/b")}}
    assert gw.lease_request(2**62) == {"ID": str(2**62)}


# -- answers -------------------------------------------------------------------------------------
def test_a_range_answer_with_zero_values_left_out() -> None:
    answer = {
        "header": {"revision": "9"},
        "kvs": [
            {
                "key": b64("/a"),
                "create_revision": "2",
                "mod_revision": "5",
                "version": "2",
                "value": b64("1"),
            },
            {"key": b64("/b"), "create_revision": "3", "mod_revision": "3", "lease": "99"},  # value ""
        ],
        "count": "2",
    }
    assert gw.parse_range(answer) == Found([KeyValue("/a", b"1", 2, 5, 0), KeyValue("/b", b"", 3, 3, 99)], 2)
    assert gw.parse_range({"header": {}}) == Found([], 0)


def test_txn_read_many_and_delete_answers() -> None:
    assert gw.parse_txn({"succeeded": True}) and not gw.parse_txn({"header": {}})
    answer = {"succeeded": True, "responses": [{"response_range": {"count": "3"}}, {"response_range": {}}]}
    assert gw.parse_read_many(answer, 2) == [Found([], 3), Found([], 0)]
    with pytest.raises(GatewayError):
        gw.parse_read_many(answer, 3)
    assert gw.parse_deleted({"deleted": "1"}) == 1 and gw.parse_deleted({}) == 0


def test_lease_answers() -> None:
    assert gw.parse_lease_id({"ID": "2324035608347851528", "TTL": "5"}) == 2324035608347851528
    assert gw.parse_keepalive({"result": {"ID": "7", "TTL": "5"}}) == 5
    assert gw.parse_keepalive({"result": {"ID": "7"}}) == 0  # the lease is gone
    with pytest.raises(GatewayError) as err:
        gw.parse_keepalive({"error": {"grpc_code": 14, "http_code": 503, "message": "EOF"}})
    assert err.value.failure is Failure.UNREACHABLE


def test_watch_lines() -> None:
    created = gw.parse_watch(b'{"result":{"header":{"revision":"6"},"created":true}}\n')
    assert created.created and not created.canceled and created.events == []
    line = json.dumps(
        {
            "result": {
                "events": [
                    {"kv": {"key": b64("/a"), "create_revision": "3", "mod_revision": "3", "value": "MQ=="}},
                    {"type": "DELETE", "kv": {"key": b64("/b"), "mod_revision": "5"}},
                ]
            }
        }
    ).encode()
    assert gw.parse_watch(line).events == [("/a", False), ("/b", True)]
    compacted = gw.parse_watch(b'{"result":{"canceled":true,"compact_revision":"5"}}')
    assert compacted.canceled and "compacted at revision 5" in compacted.reason
    with pytest.raises(GatewayError) as err:
        gw.parse_watch(b'{"error":{"grpc_code":14,"message":"error reading from server: EOF"}}')
    assert err.value.failure is Failure.UNREACHABLE and "EOF" in err.value.message


def test_a_watch_canceled_at_creation() -> None:
    assert gw.watch_canceled("etcdserver: permission denied").failure is Failure.DENIED
    assert gw.watch_canceled("mvcc: required revision has been compacted").failure is Failure.REFUSED


# -- errors --------------------------------------------------------------------------------------
def unary(code: int, message: str) -> bytes:
    return json.dumps({"error": message, "code": code, "message": message}).encode()


@pytest.mark.parametrize(
    ("status", "body", "failure"),
    [
        (403, unary(7, "etcdserver: permission denied"), Failure.DENIED),
        (401, unary(16, "etcdserver: invalid auth token"), Failure.UNAUTHENTICATED),
        (404, unary(5, "etcdserver: requested lease not found"), Failure.REFUSED),
        (400, unary(3, "etcdserver: duplicate key given in txn request"), Failure.REFUSED),
        (400, unary(3, "etcdserver: authentication failed, invalid user ID or password"), Failure.REFUSED),
        (503, unary(14, "etcdserver: no leader"), Failure.UNREACHABLE),
        (504, unary(4, "context deadline exceeded"), Failure.UNREACHABLE),
        (400, b"CommonName of client sending a request against gateway will be ignored\n", Failure.CN_CERT),
        (400, b"Client sent an HTTP request to an HTTPS server.\n", Failure.UNREACHABLE),
        (404, b"404 page not found\n", Failure.UNREACHABLE),
        (502, b"<html>bad gateway</html>", Failure.UNREACHABLE),
        (500, b"", Failure.UNREACHABLE),
        (400, b'{"code": "seven"}', Failure.REFUSED),
    ],
)
def test_error_mapping(status: int, body: bytes, failure: Failure) -> None:
    error = gw.error_of(status, body)
    assert error.failure is failure
    assert error.message  # always something to show


@pytest.mark.parametrize(
    "answer",
    [
        {"kvs": "x"},
        {"kvs": [{"key": "not base64!"}]},
        {"kvs": [{"key": b64("/a"), "mod_revision": "x"}]},
        {"kvs": [{"key": b64("/a"), "mod_revision": True}]},
        {"kvs": [{"key": 5}]},
        {"count": [1]},
    ],
)
def test_malformed_answers_are_errors_not_crashes(answer: object) -> None:
    with pytest.raises(GatewayError) as err:
        gw.parse_range(answer)  # type: ignore[arg-type]
    assert err.value.failure is Failure.UNREACHABLE


@pytest.mark.parametrize("body", [b"", b"[]", b"not json", b'"s"'])
def test_parse_json_wants_an_object(body: bytes) -> None:
    with pytest.raises(GatewayError):
        gw.parse_json(body)


def test_tokens_and_versions_are_checked() -> None:
    assert gw.parse_token({"token": "abc.9"}) == "abc.9"
    for bad in ({}, {"token": ""}, {"token": "a\nb"}, {"token": 3}):
        with pytest.raises(GatewayError):
            gw.parse_token(bad)
    assert gw.parse_version({"version": "3.5.1"}) == "3.5.1"
    with pytest.raises(GatewayError):
        gw.parse_version({})


# -- properties ----------------------------------------------------------------------------------
keys = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)


@given(keys, keys)
def test_prefix_end_bounds_exactly_the_keys_under_the_prefix(prefix: str, key: str) -> None:
    end = prefix_end(prefix)
    inside = prefix <= key and (end == ALL_KEYS or key < end)
    assert inside == key.startswith(prefix)
    # and as etcd compares: UTF-8 bytes
    assert inside == (key.encode() >= prefix.encode() and (end == ALL_KEYS or key.encode() < end.encode()))


@given(keys, st.binary(max_size=40), st.integers(1, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_a_key_value_survives_the_wire(key: str, value: bytes, revision: int, lease: int) -> None:
    """Whatever etcd stores, as etcd writes it (zeros left out), decodes to what was stored."""
    wire: dict[str, str] = {
        "key": gw.b64(key),
        "create_revision": str(revision),
        "mod_revision": str(revision),
    }
    if value:
        wire["value"] = gw.b64(value)
    if lease:
        wire["lease"] = str(lease)
    assert gw.parse_kv(json.loads(json.dumps(wire))) == KeyValue(key, value, revision, revision, lease)


# -- the database's status and alarms -------------------------------------------------------------
def test_status_and_alarms_as_etcd_writes_them() -> None:
    status = {"header": {"revision": "42"}, "version": "3.5.1", "dbSize": "2048", "dbSizeInUse": "1024"}
    alarms = {"alarms": [{"memberID": "1", "alarm": "NOSPACE"}, {"memberID": "2", "alarm": "NOSPACE"},
                         {"memberID": "2", "alarm": "CORRUPT"}, {"memberID": "3"}]}  # fmt: skip
    got = gw.parse_status(status, alarms)
    assert (got.db_size, got.db_size_in_use, got.revision) == (2048, 1024, 42)
    assert got.alarms == ("CORRUPT", "NOSPACE")  # each once; NONE (left out) is no alarm
    assert gw.parse_status({"header": {}}, {}).alarms == ()  # every zero value left out


@pytest.mark.parametrize(
    ("status", "alarms"),
    [
        ({"dbSize": "lots"}, {}),
        ({"dbSize": "-1"}, {}),
        ({"header": []}, {}),
        ({}, {"alarms": [{"alarm": 3}]}),
        ({}, {"alarms": [{"alarm": "no\nspace"}]}),
        ({}, {"alarms": "NOSPACE"}),
    ],
)
def test_a_malformed_status_is_an_error(status: dict[str, object], alarms: dict[str, object]) -> None:
    with pytest.raises(GatewayError) as exc:
        gw.parse_status(status, alarms)
    assert exc.value.failure is Failure.UNREACHABLE


def test_nospace_is_a_failure_of_its_own_and_not_worth_another_member() -> None:
    body = json.dumps({"error": "etcdserver: mvcc: database space exceeded", "code": 8,
                       "message": "etcdserver: mvcc: database space exceeded"}).encode()  # fmt: skip
    assert gw.error_of(429, body).failure is Failure.NO_SPACE
    other = json.dumps({"code": 8, "message": "etcdserver: too many requests"}).encode()
    assert gw.error_of(429, other).failure is Failure.UNREACHABLE

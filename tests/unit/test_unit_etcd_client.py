"""EtcdClient's handling of answers against a scripted gateway: failover, RBAC denials, a CN
certificate refused, forgotten auth tokens, keep-alive connections the server closed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from elasticd.errors import EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.types import EtcdAuth
from elasticd.netaddr import free_port
from tests.fakes import ScriptedGateway

RANGE = "/v3/kv/range"
LOGIN = "/v3/auth/authenticate"
ONE_KEY = {
    "kvs": [{"key": "L2s=", "value": "MQ==", "create_revision": "2", "mod_revision": "3"}],
    "count": "1",
}
DENIED = {"error": "etcdserver: permission denied", "code": 7, "message": "etcdserver: permission denied"}
BAD_TOKEN = {
    "error": "etcdserver: invalid auth token",
    "code": 16,
    "message": "etcdserver: invalid auth token",
}
NO_LEADER = {"error": "etcdserver: no leader", "code": 14, "message": "etcdserver: no leader"}
CN_TEXT = "CommonName of client sending a request against gateway will be ignored and not used as expected\n"
USER = EtcdAuth(user="node", password="pw")


@pytest.fixture
def gateways() -> Iterator[tuple[ScriptedGateway, ScriptedGateway]]:
    a, b = ScriptedGateway(), ScriptedGateway()
    yield a, b
    a.close()
    b.close()


def test_a_key_is_read_and_decoded(gateways: tuple[ScriptedGateway, ScriptedGateway]) -> None:
    a, _ = gateways
    a.answer(RANGE, 200, ONE_KEY)
    client = EtcdClient([a.endpoint])
    kv = client.get("/k")
    assert kv is not None and (kv.key, kv.json(), kv.create_revision, kv.mod_revision, kv.lease) == (
        "/k", 1, 2, 3, 0,
    )  # fmt: skip
    assert a.requests == [(RANGE, None, {"key": "L2s="})]
    assert client.get("/k") is None  # {}: etcd leaves out an empty kvs
    assert a.connections == 1  # one keep-alive connection for both


def test_permission_denied_is_reported_as_such_without_failing_over(
    gateways: tuple[ScriptedGateway, ScriptedGateway],
) -> None:
    a, b = gateways
    a.answer(RANGE, 403, DENIED)
    client = EtcdClient([a.endpoint, b.endpoint])
    with pytest.raises(EtcdUnavailable, match=r"etcd denied the request \(permission denied\)"):
        client.get("/k")
    assert b.requests == []  # the second member enforces the same roles: not tried


def test_unavailable_fails_over_to_the_next_endpoint(
    gateways: tuple[ScriptedGateway, ScriptedGateway],
) -> None:
    a, b = gateways
    a.answer(RANGE, 503, NO_LEADER)
    b.answer(RANGE, 200, ONE_KEY)
    client = EtcdClient([a.endpoint, b.endpoint])
    assert client.get("/k") is not None
    assert client.get("/k") is None and b.paths() == [RANGE, RANGE]  # and stays there


def test_a_dead_endpoint_fails_over_and_all_dead_is_unavailable(
    gateways: tuple[ScriptedGateway, ScriptedGateway],
) -> None:
    a, _ = gateways
    dead = f"127.0.0.1:{free_port()}"
    client = EtcdClient([dead, a.endpoint], timeout_s=2)
    assert client.get("/k") is None and a.paths() == [RANGE]
    alone = EtcdClient([dead], timeout_s=2)
    with pytest.raises(EtcdUnavailable, match=f"etcd is unreachable at {dead}"):
        alone.get("/k")


def test_login_then_token_in_every_call(gateways: tuple[ScriptedGateway, ScriptedGateway]) -> None:
    a, _ = gateways
    client = EtcdClient([a.endpoint], USER)
    client.get("/k")
    client.put_json("/k", 1)
    assert a.requests[0] == (LOGIN, None, {"name": "node", "password": "pw"})
    assert [(p, token) for p, token, _ in a.requests[1:]] == [(RANGE, "token-1"), ("/v3/kv/put", "token-1")]


def test_forgotten_token_logs_in_again_once(gateways: tuple[ScriptedGateway, ScriptedGateway]) -> None:
    a, _ = gateways
    client = EtcdClient([a.endpoint], USER)
    client.get("/k")
    a.answer(RANGE, 401, BAD_TOKEN)  # etcd restarted: it forgot token-1
    a.answer(RANGE, 200, ONE_KEY)
    assert client.get("/k") is not None
    assert [(p, token) for p, token, _ in a.requests] == [
        (LOGIN, None), (RANGE, "token-1"), (RANGE, "token-1"), (LOGIN, None), (RANGE, "token-2"),
    ]  # fmt: skip


def test_a_token_refused_twice_is_not_retried_forever(
    gateways: tuple[ScriptedGateway, ScriptedGateway],
) -> None:
    a, _ = gateways
    for _ in range(3):
        a.answer(RANGE, 401, BAD_TOKEN)
    client = EtcdClient([a.endpoint], USER)
    with pytest.raises(EtcdUnavailable, match="auth token"):
        client.get("/k")
    assert a.paths() == [LOGIN, RANGE, LOGIN, RANGE]


def test_a_wrong_password_is_refused_not_unreachable(
    gateways: tuple[ScriptedGateway, ScriptedGateway],
) -> None:
    a, b = gateways
    msg = "etcdserver: authentication failed, invalid user ID or password"
    a.answer(LOGIN, 400, {"error": msg, "code": 3, "message": msg})
    client = EtcdClient([a.endpoint, b.endpoint], USER)
    with pytest.raises(EtcdUnavailable, match="refused the request: etcdserver: authentication failed"):
        client.get("/k")
    assert b.requests == []


def test_a_certificate_with_a_cn_gets_a_clear_error(
    gateways: tuple[ScriptedGateway, ScriptedGateway],
) -> None:
    a, b = gateways
    a.answer(LOGIN, 400, CN_TEXT)
    client = EtcdClient([a.endpoint, b.endpoint], USER)
    with pytest.raises(
        EtcdUnavailable, match="client certificates must have an empty subject CN; use etcd_user"
    ):
        client.get("/k")
    assert b.requests == []


def test_health_accepts_a_status_reserved_to_admins(
    gateways: tuple[ScriptedGateway, ScriptedGateway],
) -> None:
    a, _ = gateways
    a.answer("/v3/maintenance/status", 403, DENIED)
    a.answer("/v3/maintenance/status", 200, {"version": "3.5.1"})
    client = EtcdClient([a.endpoint])
    assert client.health().startswith("unknown")
    assert client.health() == "3.5.1"


def test_not_an_etcd_answer_fails_over(gateways: tuple[ScriptedGateway, ScriptedGateway]) -> None:
    a, b = gateways
    a.answer(RANGE, 200, "<html>a proxy</html>")
    client = EtcdClient([a.endpoint, b.endpoint])
    assert client.get("/k") is None and b.paths() == [RANGE]


def test_a_keepalive_connection_closed_by_the_server_is_not_reused(
    gateways: tuple[ScriptedGateway, ScriptedGateway],
) -> None:
    a, _ = gateways
    a.close_after_reply = True
    client = EtcdClient([a.endpoint])
    for _ in range(3):
        assert client.get("/k") is None  # no call fails on a stale connection
    assert a.connections == 3


def test_keepalive_and_revoke_answers(gateways: tuple[ScriptedGateway, ScriptedGateway]) -> None:
    a, _ = gateways
    a.answer("/v3/lease/keepalive", 200, {"result": {"ID": "7", "TTL": "9"}})
    a.answer("/v3/lease/keepalive", 200, {"result": {"ID": "7"}})  # gone: etcd leaves the TTL out
    gone = {"error": "etcdserver: requested lease not found", "code": 5, "message": "lease not found"}
    a.answer("/v3/lease/revoke", 404, gone)
    client = EtcdClient([a.endpoint])
    assert client.refresh_lease(7) == 9 and client.refresh_lease(7) == 0
    client.revoke_lease(7)  # already gone: no error
    assert a.requests[-1] == ("/v3/lease/revoke", None, {"ID": "7"})


def test_a_user_configured_before_auth_is_enabled(gateways: tuple[ScriptedGateway, ScriptedGateway]) -> None:
    a, _ = gateways
    off = "etcdserver: authentication is not enabled"
    a.answer(LOGIN, 400, {"error": off, "code": 9, "message": off})
    client = EtcdClient([a.endpoint], USER)
    client.get("/k")  # auth is off: no token
    a.answer(RANGE, 403, DENIED)  # `etcdctl auth enable` meanwhile: a request without a user is denied
    client.get("/k")
    assert [(p, token) for p, token, _ in a.requests] == [
        (LOGIN, None), (RANGE, None), (RANGE, None), (LOGIN, None), (RANGE, "token-1"),
    ]  # fmt: skip

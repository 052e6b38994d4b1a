"""Who can write job specs: the embedded etcd is closed to other local users, and an external
etcd with mutual TLS, a password user and RBAC admits the daemon to its prefix and nobody else.

Whoever writes a job spec chooses the uid the root daemon runs it as, so these are the tests
of "no local privilege escalation through etcd" and of the multi-host deployment in SECURITY.md.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from elasticd.errors import EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.embedded import CLIENT_SOCKET, PEER_SOCKET, EmbeddedEtcd, find_etcd_binary
from elasticd.etcd.types import EtcdAuth, Query
from tests.conftest import DaemonFactory
from tests.support import REPO, DaemonProc, EtcdServer, etcd_available, submit_job, unique, wait_for
from tests.tls import CertFiles, TestCA
from tests.users import NOBODY, SYSTEM_PYTHON, other_users

ENVDUMP = REPO / "tests" / "scripts" / "envdump.py"

pytestmark = [pytest.mark.skipif(not etcd_available(), reason="needs an etcd binary"), pytest.mark.slow]


# Runs as uid nobody with the system python, stdlib only: try to PUT a key over each transport.
_INTRUDER = r"""
import errno, json, socket, sys
targets = json.loads(sys.argv[1])
body = json.dumps({"key": "L2VsYXN0aWNkL3YxL2pvYnMveC9zcGVj", "value": "eyJ1aWQiOjB9"}).encode()
request = (b"POST /v3/kv/put HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body
out = []
for kind, where in targets:
    s = socket.socket(socket.AF_UNIX if kind == "unix" else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(where if kind == "unix" else ("127.0.0.1", where))
        s.sendall(request)
        out.append({"target": where, "errno": 0, "reply": s.recv(200).decode(errors="replace")})
    except OSError as exc:
        out.append({"target": where, "errno": exc.errno, "error": errno.errorcode.get(exc.errno, "?")})
    finally:
        s.close()
print(json.dumps(out))
"""


def as_nobody_put(targets: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Run ``_INTRUDER`` as uid/gid nobody, no supplementary groups; its results, one per target."""
    res = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", _INTRUDER, json.dumps(targets)],
        user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
        capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout))


def etcd_child(d: DaemonProc) -> psutil.Process:
    assert d.proc is not None
    binary = str(find_etcd_binary())
    found = [p for p in psutil.Process(d.proc.pid).children() if p.cmdline()[:1] == [binary]]
    assert len(found) == 1, found
    return found[0]


def assert_unix_only(etcd: psutil.Process, socket_dir: Path) -> None:
    """No TCP or UDP socket at all (so no listener: nothing to POST /v3/kv/put to), and every
    stream UNIX socket is a file in the private directory (no abstract-namespace listener)."""
    conns = etcd.net_connections(kind="all")
    inet = [c for c in conns if c.family in (socket.AF_INET, socket.AF_INET6)]
    assert inet == [], f"etcd has IP sockets: {inet}"
    for c in conns:
        if c.family == socket.AF_UNIX and c.type == socket.SOCK_STREAM and c.laddr:
            # etcd binds relative to its cwd, which is the socket directory
            path: object = c.laddr  # a UNIX socket's is its path (types-psutil knows only IP pairs)
            assert isinstance(path, str), c
            assert path in (CLIENT_SOCKET, PEER_SOCKET) or path.startswith(f"{socket_dir}/"), c
    assert Path(etcd.cwd()) == socket_dir


def assert_private(path: Path) -> None:
    st = path.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700


# -- the embedded etcd -----------------------------------------------------------------------------
@other_users
def test_embedded_etcd_refuses_other_users_and_serves_the_daemon(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    d = daemon_factory(None, "--slots", "2", "--lease-ttl", "5", embedded=True)
    endpoint = d.call("ping")["etcd"][0]
    assert endpoint.startswith("unix:/")
    client_socket = Path(endpoint.removeprefix("unix:"))
    socket_dir = client_socket.parent
    assert_private(socket_dir)
    assert_private(d.state_dir / "etcd")
    etcd = etcd_child(d)
    assert_unix_only(etcd, socket_dir)

    tcp_ports = [c.laddr.port for c in etcd.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    results = as_nobody_put(
        [("unix", str(client_socket)), ("unix", str(socket_dir / PEER_SOCKET))]
        + [("tcp", port) for port in tcp_ports]
    )
    assert [r["error"] for r in results] == ["EACCES", "EACCES"], results

    # The daemon (root) still works end to end over the socket.
    client = EtcdClient([endpoint])
    try:
        assert client.get_json(f"/elasticd/v6/nodes/{d.node_id}")["node"] == d.node_id
    finally:
        client.close()
    job = submit_job(d, tmp_path, "--nproc-per-node", "1", str(ENVDUMP))
    assert d.wait_state(job, ("SUCCEEDED", "FAILED", "KILLED"), 60)["state"] == "SUCCEEDED"


@other_users
def test_long_state_dir_puts_sockets_in_a_private_temp_dir(tmp_path: Path) -> None:
    """Under a path too long for sun_path the sockets go to /tmp/elasticd-etcd-*: there the 0700
    directory is the only thing between other users and etcd, and it is enough."""
    data_dir = tmp_path / ("deep" * 20) / "etcd"
    etcd = EmbeddedEtcd(data_dir)
    etcd.start(timeout_s=20)
    try:
        socket_dir = etcd.socket_dir
        assert socket_dir is not None
        assert socket_dir.parent == Path(tempfile.gettempdir()) and socket_dir.name.startswith(
            "elasticd-etcd-"
        )
        assert_private(socket_dir)
        assert etcd.pid is not None
        assert_unix_only(psutil.Process(etcd.pid), socket_dir)
        client = EtcdClient([etcd.endpoint])
        try:
            client.put_json("/k", {"ok": 1})
            assert client.get_json("/k") == {"ok": 1}
        finally:
            client.close()
        results = as_nobody_put([("unix", str(socket_dir / CLIENT_SOCKET))])
        assert results[0]["error"] == "EACCES", results
    finally:
        etcd.stop()
    assert not socket_dir.exists()
    assert not (data_dir / "ports.json").exists()


# -- an external etcd with mutual TLS, password users and RBAC -------------------------------------
PREFIX = "/secure/v1"
NODE_USER, NODE_PASSWORD, ROOT_PASSWORD = "elasticd-node", "n0de-pw-7f3a", "r00t-pw-c2d9"
CN_ERROR = "client certificates must have an empty subject CN; use etcd_user/etcd_password_file for identity"


def etcdctl(server: EtcdServer, who: CertFiles | None, *argv: str) -> subprocess.CompletedProcess[str]:
    ca = server.tls.ca if server.tls is not None else None
    creds = ["--cacert", str(ca)] if ca else []
    if who is not None:
        creds += ["--cert", str(who.cert), "--key", str(who.key)]
    if server.admin_password is not None and who is server.admin:
        creds += ["--user", f"root:{server.admin_password}"]
    return subprocess.run(
        [str(find_etcd_binary().parent / "etcdctl"), "--endpoints", server.endpoint, "--dial-timeout", "3s",
         "--command-timeout", "5s", *creds, *argv],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def setup_rbac(server: EtcdServer, users: dict[str, str]) -> None:
    """root (admin, with a password), role ``elasticd`` = readwrite on PREFIX/ only, ``users``
    (name: password) with that role; then auth on, and ``server`` logs in as root from now on."""
    steps = [
        ("user", "add", "root", "--new-user-password", ROOT_PASSWORD),
        ("user", "grant-role", "root", "root"),
        ("role", "add", "elasticd"),
        ("role", "grant-permission", "elasticd", "readwrite", "--prefix=true", f"{PREFIX}/"),
    ]
    for user, password in users.items():
        steps += [
            ("user", "add", user, "--new-user-password", password),
            ("user", "grant-role", user, "elasticd"),
        ]
    steps.append(("auth", "enable"))
    assert server.admin is not None
    for step in steps:
        res = etcdctl(server, server.admin, *step)
        assert res.returncode == 0, (step, res.stderr)
    server.admin_password = ROOT_PASSWORD


@pytest.fixture
def pki(tmp_path: Path) -> tuple[TestCA, dict[str, CertFiles]]:
    """Client certificates with an empty subject (what the gateway accepts with auth on), and one
    with a CN (which the gateway refuses once auth is on)."""
    ca = TestCA(tmp_path / "pki")
    ids = {name: ca.issue(name, subject_cn=False) for name in ("admin", "node", "intruder")}
    ids["with-cn"] = ca.issue(NODE_USER)
    return ca, ids


@pytest.fixture
def tls_etcd(
    tmp_path: Path, pki: tuple[TestCA, dict[str, CertFiles]]
) -> Iterator[tuple[EtcdServer, dict[str, CertFiles]]]:
    ca, ids = pki
    server = EtcdServer(tmp_path / "etcd-tls", "tls", tls=ca.server(), admin=ids["admin"])
    server.start()
    try:
        setup_rbac(server, {NODE_USER: NODE_PASSWORD})
        yield server, ids
    finally:
        server.stop()


def cert_auth(c: CertFiles, password: str | None = None) -> EtcdAuth:
    """The certificate for the transport; with a password, the node's user for its identity."""
    user = None if password is None else NODE_USER
    return EtcdAuth(ca=c.ca, cert=c.cert, key=c.key, user=user, password=password)


def password_file(directory: Path) -> Path:
    path = directory / "etcd-password"
    path.write_text(NODE_PASSWORD + "\n")
    path.chmod(0o600)
    return path


def test_daemon_runs_a_job_on_tls_etcd_with_a_password_user_and_rbac(tls_etcd: Any, tmp_path: Path) -> None:
    server, ids = tls_etcd
    node = ids["node"]
    env = dict(os.environ, ELASTICD_ETCD_CA=str(node.ca), ELASTICD_ETCD_CERT=str(node.cert))
    env |= {"ELASTICD_ETCD_KEY": str(node.key), "ELASTICD_ETCD_USER": NODE_USER}
    env["ELASTICD_ETCD_PASSWORD_FILE"] = str(password_file(tmp_path))
    args = ["--etcd-endpoints", server.endpoint, "--etcd-prefix", PREFIX, "--slots", "2", "--lease-ttl", "3"]
    d = DaemonProc(unique("tls"), tmp_path / "daemon", args, env)
    admin = EtcdClient([server.endpoint], server.client_auth())
    try:
        d.start()
        assert d.call("ping")["etcd"] == [server.endpoint]
        job = submit_job(d, tmp_path, "--nproc-per-node", "2", str(ENVDUMP))  # txns, watch, rendezvous
        assert d.wait_state(job, ("SUCCEEDED", "FAILED", "KILLED"), 60)["state"] == "SUCCEEDED"
        # The node lease outlives several TTLs: its keep-alives are allowed.
        before = admin.get(d.node_key())
        assert before is not None and before.lease != 0
        time.sleep(3 * 3.0)
        after = admin.get(d.node_key())
        assert after is not None and after.lease == before.lease
        assert "permission denied" not in d.log_text() and not d.events("watch.rearm")
    finally:
        d.stop()
        admin.close()
    assert d.proc is not None and d.proc.returncode == 0, d.log_text()[-2000:]
    assert not d.leftovers()
    assert NODE_PASSWORD not in d.log_text()
    admin = EtcdClient([server.endpoint], server.client_auth())
    try:  # the daemon's records are there, and only under PREFIX (where RBAC let it write)
        keys = [kv.key for kv in admin.get_prefix("/")]
    finally:
        admin.close()
    assert any(k.startswith(f"{PREFIX}/jobs/{job}/") for k in keys)
    assert all(k.startswith(f"{PREFIX}/") for k in keys), keys


def test_rbac_confines_the_node_and_shuts_out_intruders(tls_etcd: Any) -> None:
    server, ids = tls_etcd
    node = EtcdClient([server.endpoint], cert_auth(ids["node"], NODE_PASSWORD), timeout_s=3)
    intruder = EtcdClient([server.endpoint], cert_auth(ids["intruder"]), timeout_s=3)
    guesser = EtcdClient([server.endpoint], cert_auth(ids["intruder"], "guessed"), timeout_s=3)
    anonymous = EtcdClient([server.endpoint], EtcdAuth(ca=server.tls.ca), timeout_s=3)
    seen: list[str] = []
    try:
        # The node's user: its prefix, with a lease, a watch and transactions; nothing outside it.
        lease = node.grant_lease(5)
        cancel = node.watch_prefix(f"{PREFIX}/", lambda key, _deleted: seen.append(key), lambda: None)
        assert node.create_json(f"{PREFIX}/jobs/j/spec", {"uid": 1000}, lease=lease)
        assert not node.create_json(f"{PREFIX}/jobs/j/spec", {"uid": 0})
        assert node.read_many([Query(f"{PREFIX}/jobs/", prefix=True, count_only=True)])[0].count == 1
        assert node.refresh_lease(lease) > 0
        assert node.health()
        with pytest.raises(EtcdUnavailable, match="permission denied"):
            node.put_json("/elsewhere", 1)
        with pytest.raises(EtcdUnavailable, match="permission denied"):
            node.watch_prefix("/", lambda _k, _d: None, lambda: None)
        # Another certificate from the same CA, with no user: no read, no write, no watch.
        for attempt in (
            lambda: intruder.get(f"{PREFIX}/jobs/j/spec"),
            lambda: intruder.put_json(f"{PREFIX}/jobs/evil/spec", {"uid": 0}),
            lambda: intruder.get_prefix(f"{PREFIX}/"),
            lambda: intruder.watch_prefix(f"{PREFIX}/", lambda _k, _d: None, lambda: None),
        ):
            with pytest.raises(EtcdUnavailable, match="permission denied"):
                attempt()
        assert etcdctl(server, ids["intruder"], "put", f"{PREFIX}/jobs/evil/spec", "{}").returncode != 0
        with pytest.raises(EtcdUnavailable, match="authentication failed"):  # and a wrong password
            guesser.get(f"{PREFIX}/jobs/j/spec")
        # No client certificate: the TLS handshake fails; no connection at all.
        with pytest.raises(EtcdUnavailable, match="unreachable"):
            anonymous.get(f"{PREFIX}/jobs/j/spec")
        assert etcdctl(server, None, "get", f"{PREFIX}/jobs/j/spec").returncode != 0
        # Plain HTTP to the TLS port gets nowhere either.
        plain = EtcdClient([f"127.0.0.1:{server.client_port}"], timeout_s=2)
        try:
            with pytest.raises(EtcdUnavailable, match="unreachable"):
                plain.get(f"{PREFIX}/jobs/j/spec")
        finally:
            plain.close()
        cancel()
        assert f"{PREFIX}/jobs/j/spec" in seen
        admin = EtcdClient([server.endpoint], server.client_auth())
        try:
            assert admin.get(f"{PREFIX}/jobs/evil/spec") is None
        finally:
            admin.close()
    finally:
        for c in (node, intruder, guesser, anonymous):
            c.close()


def test_a_certificate_with_a_cn_gets_a_clear_error(tls_etcd: Any, tmp_path: Path) -> None:
    """With auth on, etcd's gateway refuses a certificate with a CN (etcd-io/etcd#10392), with or
    without a password: the client, and a daemon started with it, say what to change."""
    server, ids = tls_etcd
    for password in (None, NODE_PASSWORD):
        client = EtcdClient([server.endpoint], cert_auth(ids["with-cn"], password), timeout_s=3)
        try:
            with pytest.raises(EtcdUnavailable, match=CN_ERROR):
                client.get(f"{PREFIX}/x")
        finally:
            client.close()
    cert = ids["with-cn"]
    env = dict(os.environ, ELASTICD_ETCD_CA=str(cert.ca), ELASTICD_ETCD_CERT=str(cert.cert))
    env |= {"ELASTICD_ETCD_KEY": str(cert.key), "ELASTICD_ETCD_USER": NODE_USER}
    env["ELASTICD_ETCD_PASSWORD_FILE"] = str(password_file(tmp_path))
    d = DaemonProc(unique("cn"), tmp_path / "daemon", ["--etcd-endpoints", server.endpoint], env)
    try:
        d.start(wait=False)
        wait_for(lambda: any(CN_ERROR in e.get("error", "") for e in d.events("etcd.waiting")), 30, 0.1,
                 "the daemon to say why etcd refuses it")  # fmt: skip
    finally:
        d.stop()
    assert NODE_PASSWORD not in d.log_text()


def test_mtls_without_auth_accepts_a_certificate_with_a_cn(tmp_path: Path, pki: Any) -> None:
    """The Slurm per-allocation etcd: client certificates, no etcd auth. The gateway refuses CN
    certificates only when auth is on, so its certificates need no change."""
    ca, ids = pki
    server = EtcdServer(tmp_path / "etcd-mtls", "mtls", tls=ca.server(), admin=ids["with-cn"])
    server.start()
    client = EtcdClient([server.endpoint], cert_auth(ids["with-cn"]), timeout_s=3)
    seen: list[str] = []
    try:
        cancel = client.watch_prefix("/j/", lambda key, _deleted: seen.append(key), lambda: None)
        client.put_json("/j/spec", {"uid": 1000})
        assert client.get_json("/j/spec") == {"uid": 1000}
        wait_for(lambda: seen == ["/j/spec"], 10, 0.01, "the watch event")
        cancel()
    finally:
        client.close()
        server.stop()


def test_password_auth_survives_an_etcd_restart(tls_etcd: Any) -> None:
    """etcd forgets its (simple) tokens when it restarts: the client logs in again on "invalid auth
    token" instead of failing every call from then on."""
    server, ids = tls_etcd
    client = EtcdClient([server.endpoint], cert_auth(ids["node"], NODE_PASSWORD), timeout_s=3)
    try:
        client.put_json(f"{PREFIX}/pw", 1)
        server.stop()
        server.start()
        client.put_json(f"{PREFIX}/pw", 2)
        assert client.get_json(f"{PREFIX}/pw") == 2
    finally:
        client.close()

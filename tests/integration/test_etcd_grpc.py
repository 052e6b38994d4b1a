"""The grpc backend (``--etcd-client grpc``) with real daemons: a multi-node job that loses a node,
and identity by a client certificate's CN with etcd RBAC and no password at all (which etcd's JSON
gateway cannot do: etcd-io/etcd#10392). The KV and JobStore contracts run against it in
``tests/contract``."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticd.errors import EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.grpc.client import GrpcEtcdClient
from elasticd.etcd.types import EtcdAuth
from tests.conftest import DaemonFactory
from tests.integration.test_etcd_security import PREFIX, etcdctl, setup_rbac
from tests.support import (
    REPO,
    DaemonProc,
    EtcdServer,
    alive_pid,
    etcd_available,
    start_cluster,
    submit_job,
    unique,
    wait_round,
)
from tests.tls import CertFiles, TestCA

pytestmark = [
    pytest.mark.skipif(not etcd_available(), reason="needs an etcd binary"),
    pytest.mark.skipif(
        importlib.util.find_spec("etcd3") is None, reason="the grpc extra is not installed (elasticd[grpc])"
    ),
    pytest.mark.timeout(120),
    pytest.mark.slow,
]
SCRIPTS = REPO / "tests" / "scripts"
NODE_CN = "elasticd-node-cn"  # the etcd user the node's certificate names; it has no password


def test_a_job_over_grpc_loses_a_node_and_completes(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """Leases, their expiry, watches and transactions over grpc: the survivor restarts the round
    without the lost node and the job completes."""
    a, b = start_cluster(daemon_factory, 2, "--etcd-client", "grpc")
    job = submit_job(a, tmp_path, "--nnodes", "1:2", "--last-call", "1", str(SCRIPTS / "member.py"))
    first = wait_round(tmp_path, 0, 2)
    b.kill9()
    for r in first:
        if r["ELASTICD_OWNER"] == b.node_id and alive_pid(r["pid"]):
            os.kill(r["pid"], signal.SIGKILL)
    second = wait_round(tmp_path, 1, 1, timeout_s=20)
    assert [r["ELASTICD_OWNER"] for r in second] == [a.node_id]
    (tmp_path / "finish").touch()
    assert a.wait_state(job, ("SUCCEEDED", "FAILED"), 30)["state"] == "SUCCEEDED"
    assert a.job(job)["restarts"] == 1
    assert [e["client"] for e in a.events("etcd.connected")] == ["grpc"]


def test_children_forked_while_grpc_is_busy_reach_their_exec(etcd_server: EtcdServer) -> None:
    """grpc's fork handlers, on by default in grpcio, could abort a child between its fork and its
    exec (SIGABRT, a few in a hundred: a worker, a keeper or py-spy lost). The backend turns them
    off; 600 children at that rate would lose about 14."""
    script = SCRIPTS / "grpc_forks.py"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(
        [sys.executable, str(script), etcd_server.endpoint, "600"],
        capture_output=True, text=True, env=env, timeout=100,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.splitlines()[-1]) == {"signalled": 0, "failed": 0}, res.stderr[-2000:]


@pytest.fixture
def cn_etcd(tmp_path: Path) -> Iterator[tuple[EtcdServer, dict[str, CertFiles]]]:
    """etcd with mutual TLS and auth on: the user ``NODE_CN`` (no password) may read and write
    PREFIX/ only; certificates with the CNs ``NODE_CN`` and ``mallory`` (no such user)."""
    ca = TestCA(tmp_path / "pki")
    ids = {
        "admin": ca.issue("admin", subject_cn=False),
        "node": ca.issue(NODE_CN),
        "mallory": ca.issue("mallory"),
    }
    server = EtcdServer(tmp_path / "etcd-cn", "cn", tls=ca.server(), admin=ids["admin"])
    server.start()
    try:
        res = etcdctl(server, server.admin, "user", "add", NODE_CN, "--no-password")
        assert res.returncode == 0, res.stderr
        setup_rbac(server, {})  # root, the elasticd role on PREFIX/, auth on
        res = etcdctl(server, server.admin, "user", "grant-role", NODE_CN, "elasticd")
        assert res.returncode == 0, res.stderr
        yield server, ids
    finally:
        server.stop()


def cn_auth(c: CertFiles) -> EtcdAuth:
    return EtcdAuth(ca=c.ca, cert=c.cert, key=c.key)  # no user, no password: the CN is the user


def test_a_certificates_cn_is_the_etcd_user_over_grpc(
    cn_etcd: tuple[EtcdServer, dict[str, CertFiles]], tmp_path: Path
) -> None:
    server, ids = cn_etcd
    node, mallory = GrpcEtcdClient([server.endpoint], cn_auth(ids["node"]), 3), None
    try:
        assert node.create_json(f"{PREFIX}/probe", {"by": "cn"})
        with pytest.raises(EtcdUnavailable, match="permission denied"):
            node.put_json("/elsewhere", 1)  # the role's prefix only
        mallory = GrpcEtcdClient([server.endpoint], cn_auth(ids["mallory"]), 3)
        with pytest.raises(EtcdUnavailable):  # a CN that is no etcd user gets nothing
            mallory.get(f"{PREFIX}/probe")
    finally:
        node.close()
        if mallory is not None:
            mallory.close()
    gateway = EtcdClient([server.endpoint], cn_auth(ids["node"]), timeout_s=3)
    try:  # what the gateway cannot do with the same certificate
        with pytest.raises(EtcdUnavailable, match="empty subject CN"):
            gateway.get(f"{PREFIX}/probe")
    finally:
        gateway.close()

    cert = ids["node"]
    env = dict(os.environ, ELASTICD_ETCD_CA=str(cert.ca), ELASTICD_ETCD_CERT=str(cert.cert))
    env |= {"ELASTICD_ETCD_KEY": str(cert.key), "ELASTICD_ETCD_CLIENT": "grpc"}
    args = ["--etcd-endpoints", server.endpoint, "--etcd-prefix", PREFIX, "--slots", "2", "--lease-ttl", "3"]
    d = DaemonProc(unique("cn"), tmp_path / "daemon", args, env)
    try:
        d.start()
        job = submit_job(d, tmp_path, "--nproc-per-node", "2", str(SCRIPTS / "envdump.py"))
        assert d.wait_state(job, ("SUCCEEDED", "FAILED", "KILLED"), 60)["state"] == "SUCCEEDED"
        assert "permission denied" not in d.log_text()
    finally:
        d.stop()
    assert d.proc is not None and d.proc.returncode == 0, d.log_text()[-2000:]
    assert not d.leftovers()

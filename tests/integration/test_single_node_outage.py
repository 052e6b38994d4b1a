"""A single-node job survives etcd trouble: an etcd outage, or its daemon frozen past the lease TTL,
does not restart it; the node re-asserts its part of the round under its new lease.

(Multi-node fencing is tested in test_multinode.py: test_frozen_daemon_is_fenced_and_rejoins.)
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from tests.conftest import DaemonFactory
from tests.support import (
    REPO,
    DaemonProc,
    EtcdServer,
    alive_pid,
    submit_job,
    wait_for,
    wait_log,
    wait_round,
    worker_records,
)

pytestmark = pytest.mark.slow

MEMBER = REPO / "tests" / "scripts" / "member.py"  # runs until $OUT/finish exists
TTL = "3"


def _lease_of(client: EtcdClient, key: str) -> int | None:
    kv = client.get(key)
    return kv.lease if kv is not None else None


def _reasserted_or_restarted(client: EtcdClient, d: DaemonProc, job: str, old_lease: int) -> str:
    """Wait until the node's join of round 0 and its status are under a lease other than
    ``old_lease`` (so the old lease's expiry takes nothing of the job), or the job moved on."""
    keys = Keys(d.etcd_prefix)

    def settled() -> str | None:
        view = d.job(job)
        if view["round"] != 0 or view["restarts"] != 0 or view["state"] != "RUNNING":
            return "restarted"
        join = _lease_of(client, keys.join(job, 0, d.node_id))
        status = _lease_of(client, keys.node_status(job, d.node_id))
        if join not in (None, old_lease) and status == join:
            return "reasserted"
        return None

    return str(wait_for(settled, 60, 0.1, "the node to re-assert its part of round 0"))


def _finish_and_check(d: DaemonProc, job: str, out: Path, pid: int) -> None:
    assert alive_pid(pid), "the worker of round 0 must have run through"
    (out / "finish").touch()
    final = d.wait_state(job, ("SUCCEEDED", "FAILED"), 60)
    assert (final["state"], final["round"], final["restarts"]) == ("SUCCEEDED", 0, 0), final
    assert [r["pid"] for r in worker_records(out, 0)] == [pid] and not worker_records(out, 1)


def test_single_node_job_runs_through_an_etcd_outage(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd-own")
    etcd.start()
    client = EtcdClient([etcd.endpoint])
    try:
        d = daemon_factory(None, "--etcd-endpoints", etcd.endpoint, "--lease-ttl", TTL)
        out = tmp_path / "out"
        out.mkdir()
        job = submit_job(d, out, str(MEMBER))
        (first,) = wait_round(out, 0, 1)
        keys = Keys(d.etcd_prefix)
        wait_for(lambda: _lease_of(client, keys.node_status(job, d.node_id)), 30, 0.05, "status published")
        old = _lease_of(client, keys.join(job, 0, d.node_id))
        assert old
        etcd.stop()
        # Longer than the lease: the node gives its lease up (it cannot renew it in time).
        wait_log(d, "lease.lost", 30)
        etcd.start()  # same data dir and ports: the old lease comes back and expires a TTL later
        assert _reasserted_or_restarted(client, d, job, old) == "reasserted"
        # The old lease expires (the node no longer renews it): nothing of the job goes with it.
        wait_for(lambda: _lease_of(client, keys.janitor()) != old, 30, 0.1, "the old lease to expire")
        assert d.job(job)["restarts"] == 0
        _finish_and_check(d, job, out, first["pid"])
    finally:
        client.close()
        etcd.stop()


def test_single_node_job_survives_its_daemon_frozen_past_the_lease(
    daemon_factory: DaemonFactory, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    # Another node holds the janitor role, so it sees the frozen node's keys go while it is frozen.
    other = daemon_factory(None, "--lease-ttl", TTL)
    wait_log(other, "janitor.elected", 30)
    d = daemon_factory(None, "--lease-ttl", TTL)
    client = EtcdClient([etcd_server.endpoint])
    try:
        out = tmp_path / "out"
        out.mkdir()
        job = submit_job(d, out, str(MEMBER))
        (first,) = wait_round(out, 0, 1)
        keys = Keys(d.etcd_prefix)
        wait_for(lambda: _lease_of(client, keys.node_status(job, d.node_id)), 30, 0.05, "status published")
        old = _lease_of(client, keys.join(job, 0, d.node_id))
        assert old and d.proc is not None
        d.proc.send_signal(signal.SIGSTOP)
        try:
            # Frozen past the TTL: the lease expires, and the janitor finds the round's only member
            # gone. It waits for the node to come back instead of restarting the job.
            wait_for(lambda: client.get(d.node_key()) is None, 30, 0.1, "the frozen node's lease to expire")
            wait_log(other, "job.member_missing", 30, job=job)
            assert alive_pid(first["pid"]), "the reaper fences multi-node jobs only"
        finally:
            d.proc.send_signal(signal.SIGCONT)
        assert _reasserted_or_restarted(client, d, job, old) == "reasserted"
        wait_log(other, "job.member_back", 30, job=job)
        assert d.job(job)["restarts"] == 0
        _finish_and_check(d, job, out, first["pid"])
    finally:
        client.close()

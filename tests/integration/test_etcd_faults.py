"""etcd going away: clear errors at submit, jobs that keep running, failover between endpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import DaemonFactory
from tests.support import REPO, DaemonProc, EtcdServer, unique, wait_for

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"


def test_etcd_outage_mid_job_and_at_submit(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd-own")
    etcd.start()
    try:
        d = daemon_factory(None, "--etcd-endpoints", etcd.endpoint, "--lease-ttl", "4")
        script = tmp_path / "slow.py"
        script.write_text(
            "import time\nfor i in range(8):\n    print('tick', i, flush=True)\n    time.sleep(0.5)\n"
        )
        job_id = d.ctl("submit", "--nproc-per-node", "2", str(script), cwd=tmp_path).stdout.split()[0]
        # Workers must be running (not only the round closed) before etcd goes away.
        wait_for(lambda: len(d.job(job_id)["pids"]) == 2, 30, 0.05, "workers to start")
        etcd.stop()
        res = d.ctl("submit", str(script), cwd=tmp_path)
        assert res.returncode == 3 and "etcd_unavailable" in res.stderr
        assert d.call("ping")["node"] == d.node_id
        # The job runs on through the outage (local supervision does not need etcd), and status
        # still answers from this node's own view, marked stale.
        local = wait_for(lambda: (j := d.job(job_id))["state"] == "DONE" and j, 30, 0.2, "workers to finish")
        assert local["stale"] is True
        assert d.proc is not None and d.proc.poll() is None
        etcd.start()  # same data dir and ports
        from elasticd.etcd.client import EtcdClient

        client = EtcdClient([etcd.endpoint])
        status = d.wait_state(job_id, ("SUCCEEDED", "FAILED"), 30)
        assert status["state"] == "SUCCEEDED" and status["restarts"] == 0
        # The node re-registers once its lease is back or renewed.
        wait_for(lambda: client.get(d.node_key()) is not None, 15, 0.2, "node record back in etcd")
        ok = d.ctl("submit", "--follow", str(script), cwd=tmp_path)
        assert ok.returncode == 0, ok.stderr
        client.close()
    finally:
        etcd.stop()


def test_several_endpoints_fail_over(
    daemon_factory: DaemonFactory, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    dead = "127.0.0.1:1"
    d: DaemonProc = daemon_factory(unique("fo"), "--etcd-endpoints", f"{dead},{etcd_server.endpoint}")
    assert d.call("ping")["etcd"] == [dead, etcd_server.endpoint]
    script = tmp_path / "ok.py"
    script.write_text("print('fine')\n")
    res = d.ctl("submit", "--follow", str(script), cwd=tmp_path, env=dict(os.environ))
    assert res.returncode == 0 and "[rank0]: fine" in res.stdout
    assert d.node_id in d.ctl("nodes").stdout

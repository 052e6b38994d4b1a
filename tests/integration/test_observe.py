"""Metrics and the event history with real parts: a daemon with its metrics endpoint, etcd, and a
job whose first attempt fails; ``elasticctl events`` (and ``-f``), its bound in a real etcd, a
malformed event, and who may read whose events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.eventkeys import EventRing
from elasticd.etcd.keys import Keys
from elasticd.history.model import ClusterEvent
from elasticd.history.rings import Limits
from elasticd.history.store import EventLog
from elasticd.netaddr import free_port
from tests import monitoring as mon
from tests.conftest import DaemonFactory
from tests.support import PYTHON, DaemonProc, EtcdServer, wait_for
from tests.users import NOBODY, as_user, other_users, public_daemon, public_dir

pytestmark = pytest.mark.slow

# Attempt 0 fails at once; attempt 1 reports steps until $OUT/stop exists, then succeeds.
FAIL_ONCE = """\
import os, sys, time
from elasticd import worker
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3)
step = 0
while not os.path.exists(os.path.join(os.environ["OUT"], "stop")):
    time.sleep(0.05)
    worker.step(step)
    step += 1
"""


def exposition(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        return str(r.read().decode())


def scrape(port: int) -> dict[str, float]:
    """Every sample of the endpoint: ``name{labels}`` -> value."""
    text = exposition(port)
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def assert_serves_what_monitoring_names(port: int, m: dict[str, float], job: str) -> None:
    """Every metric the shipped dashboard and alerting rules name is served (but per-GPU ones:
    no GPU here), and a stepping rank's step time is among them."""
    assert any(k.startswith(f'elasticd_rank_step_seconds{{job="{job}",rank="0"}}') for k in m), sorted(m)
    asked = mon.referenced(mon.dashboard_exprs()) | mon.referenced(mon.rule_exprs())
    missing = asked - mon.GPU_ONLY - mon.served(exposition(port))
    assert not missing, f"named by packaging/monitoring, not served: {missing}"


def events(d: DaemonProc, *argv: str) -> list[dict[str, Any]]:
    res = d.ctl("events", "--json", *argv)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


@pytest.mark.timeout(240)
def test_metrics_during_a_job_and_its_history(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    port = free_port()
    d = daemon_factory(None, "--slots", "4", "--metrics-address", str(port))  # a port alone: loopback
    script = tmp_path / "fail_once.py"
    script.write_text(FAIL_ONCE)
    res = d.ctl("submit", "--max-restarts", "2", str(script), env=dict(os.environ, OUT=str(tmp_path)))
    assert res.returncode == 0, res.stderr
    job = res.stdout.splitlines()[0]

    # During the second attempt: the job RUNNING, the restart counted by reason, both rounds'
    # rendezvous and the failure's recovery in the histograms, its worker, its step rate, renewals.
    def running_again() -> dict[str, float] | None:
        m = scrape(port)
        rate = m.get(f'elasticd_steps_per_second{{job="{job}"}}', 0)
        ok = m.get('elasticd_jobs{state="RUNNING"}') == 1 and rate > 0
        return m if ok and m.get("elasticd_lease_renewals_total", 0) > 0 else None

    m = wait_for(running_again, 120, 0.5, "the second attempt to step (seen in /metrics)")
    assert m['elasticd_restarts_total{reason="worker_failed"}'] == 1
    assert m["elasticd_rendezvous_duration_seconds_count"] == 2
    assert m["elasticd_recovery_duration_seconds_count"] == 1
    assert m[f'elasticd_worker_processes{{job="{job}"}}'] == 1
    assert m['elasticd_worker_groups{state="RUNNING"}'] == 1
    assert m["elasticd_nodes"] == 1 and m["elasticd_etcd_up"] == 1
    assert m['elasticd_worker_failures_total{cause="user_code"}'] == 1
    assert_serves_what_monitoring_names(port, m, job)

    # ``events -f`` prints the job's success when it happens.
    follow = subprocess.Popen(
        [PYTHON, "-m", "elasticctl", "events", "-f", job, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, ELASTICD_SOCKET=str(d.socket)),
    )  # fmt: skip
    try:
        assert follow.stdout is not None
        first = json.loads(follow.stdout.readline())  # the history so far comes first
        assert first["kind"] == "submitted"
        (tmp_path / "stop").touch()
        while (line := follow.stdout.readline()) and json.loads(line)["kind"] != "succeeded":
            pass  # bounded by the test's timeout; the daemon records the end within a second
        assert line, follow.stderr.read() if follow.stderr else ""
    finally:
        follow.kill()
        follow.wait(10)

    history = events(d, job)
    kinds = [e["kind"] for e in history]
    assert kinds == ["submitted", "joined", "round", "worker_failed", "restart", "round", "succeeded", "left"]
    assert all(e["job"] == job and e["time"].endswith("+00:00") for e in history)
    assert [e["node"] for e in history[:4]] == [d.node_id] * 4
    failed, restart, again = history[3], history[4], history[5]
    assert failed["fields"]["cause"] == "user_code" and "exit code 3" in failed["fields"]["summary"]
    assert restart["fields"]["reason"] == "worker_failed" and "exit code 3" in restart["fields"]["detail"]
    assert again["fields"]["round"] == 1 and again["fields"]["reason"] == "worker_failed"
    assert [e["seq"] for e in history] == sorted(e["seq"] for e in history)
    assert {"node_up"} <= {e["kind"] for e in events(d)}  # all events: the node's own too
    text = d.ctl("events", job).stdout.splitlines()
    assert len(text) == len(history) and "succeeded" in text[-2]


def test_the_history_is_bounded_in_etcd_and_a_bad_event_is_skipped(
    daemon: DaemonProc, etcd_server: EtcdServer
) -> None:
    client = EtcdClient([etcd_server.endpoint], etcd_server.client_auth())
    try:
        keys = Keys(daemon.etcd_prefix)
        small = EventLog(client, keys, Limits(recent=2, total=5, cluster=5))
        for i in range(8):
            small.append(ClusterEvent(1e9 + i, "round", "job-x", None, f"event {i}"))
        assert len(client.get_prefix(keys.event_ring(EventRing.RECENT, "job-x"))) == 2
        assert len(client.get_prefix(keys.event_ring(EventRing.OLDER))) == 3  # the oldest went
        last = small.read().events[-1].seq
        bad = {"time": "noon", "kind": "round", "job": "job-x"}
        client.put_json(keys.event(EventRing.RECENT, last + 1, "job-x"), bad)
        client.put_json(keys.event_seq(), last + 1)
        small.append(ClusterEvent(2e9, "round", "job-x", None, "after the bad one"))
    finally:
        client.close()
    res = daemon.ctl("events", "--json")
    assert res.returncode == 0, res.stderr
    shown = [json.loads(line) for line in res.stdout.splitlines()]
    assert [e["message"] for e in shown if e["job"] == "job-x"][-1] == "after the bad one"
    assert f"skipped event events/recent/job-x/{last + 1:016d}: time: must be float" in res.stderr


@other_users
def test_others_cannot_read_a_jobs_events(daemon_factory: DaemonFactory) -> None:
    with public_dir("elasticd-events-") as public:
        d = public_daemon(daemon_factory, public)
        script = public / "ok.py"
        script.write_text("print('ok')\n")
        res = d.ctl("submit", str(script), "--python", sys.executable)
        assert res.returncode == 0, res.stderr
        job = res.stdout.splitlines()[0]
        d.wait_state(job, ("SUCCEEDED",))
        wait_for(lambda: "succeeded" in [e["kind"] for e in events(d, job)], 30, 0.2, "the end recorded")

        mine = as_user(NOBODY, NOBODY, d.socket, "events")
        assert mine["ok"]
        seen = mine["result"]["events"]
        assert seen and all(e["job"] is None for e in seen)  # node events only: not root's job's
        named = as_user(NOBODY, NOBODY, d.socket, "events", job=job)
        assert not named["ok"] and named["code"] == "permission_denied"

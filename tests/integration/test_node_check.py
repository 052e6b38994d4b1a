"""The pre-flight node check with real daemons: a node whose CPU is held to a small quota from
outside (its daemon moved into a cgroup, so the check it runs for the job is too) is left out of
an elastic job's round, with the reason in the round's event; the job runs on without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elasticctl.exits import EXIT_CHECK_FAILED
from tests.conftest import DaemonFactory
from tests.slowdowns import cpu_quota
from tests.support import REPO, start_cluster, submit_job, wait_round

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"


@pytest.mark.timeout(240)
def test_a_node_far_below_its_peers_is_left_out_of_an_elastic_round(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    a, b = start_cluster(daemon_factory, 2)
    assert b.proc is not None
    with cpu_quota([b.proc.pid], 0.15):
        job = submit_job(
            a, tmp_path, "--nnodes", "1:2", "--last-call", "5", "--node-check", str(SCRIPTS / "member.py")
        )
        (record,) = wait_round(tmp_path, 0, 1, timeout_s=90)
        assert record["ELASTICD_OWNER"] == a.node_id
        res = a.ctl("events", job, "--json")
        rounds = [e for e in map(json.loads, res.stdout.splitlines()) if e.get("kind") == "round"]
        assert rounds and f"left out by the node check: {b.node_id}: compute" in rounds[0]["message"], rounds
        (tmp_path / "finish").touch()
        assert a.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


@pytest.mark.timeout(240)
def test_a_healthy_round_passes_the_node_check(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    a, b = start_cluster(daemon_factory, 2)
    job = submit_job(a, tmp_path, "--nnodes", "2", "--node-check", str(SCRIPTS / "member.py"))
    owners = {r["ELASTICD_OWNER"] for r in wait_round(tmp_path, 0, 2, timeout_s=90)}
    assert owners == {a.node_id, b.node_id}
    (tmp_path / "finish").touch()
    assert a.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


CHECK_TRIES = 3


@pytest.mark.timeout(120)
def test_check_measures_every_node_against_the_cluster(daemon_factory: DaemonFactory) -> None:
    a, b = start_cluster(daemon_factory, 2)
    for _ in range(CHECK_TRIES):  # a check is a sample: beside the suite, a node can be caught mid-burst
        res = a.ctl("check", "--json")
        if res.returncode != EXIT_CHECK_FAILED:
            break
    assert res.returncode == 0, res.stdout + res.stderr
    reply = json.loads(res.stdout)
    rows = {r["node"]: r for r in reply["nodes"]}
    assert set(rows) == {a.node_id, b.node_id} and reply["measured_from"] == a.node_id
    assert all(r["verdict"] == "ok" and r["compute"] > 0 for r in rows.values()), rows
    assert rows[b.node_id]["rtt_s"] > 0 and rows[b.node_id]["bytes_per_s"] > 0
    assert rows[a.node_id]["rtt_s"] is None  # no link to itself
    assert reply["cluster"]["compute"] > 0
    text = a.ctl("check", b.node_id)
    assert text.returncode == 0 and "BANDWIDTH" in text.stdout and b.node_id in text.stdout, text.stderr
    assert a.node_id not in text.stdout.split("links measured")[0]  # only the node named
    unknown = a.ctl("check", "no-such-node")
    assert unknown.returncode == 3 and "node_not_found" in unknown.stderr

"""The pre-flight node check with real daemons: a node whose CPU is held to a small quota from
outside (its daemon moved into a cgroup, so the check it runs for the job is too) is left out of
an elastic job's round, with the reason in the round's event; the job runs on without it."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonFactory
from tests.support import REPO, start_cluster, submit_job, unique, wait_round

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"
V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup/unified")


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


@contextlib.contextmanager
def cpu_quota(pid: int, share: float) -> Iterator[None]:
    """Hold ``pid`` (and what it starts from now on) to ``share`` of one CPU, in 20 ms periods (the
    kernel takes no quota under 1 ms)."""
    if _writable(V1) and (V1 / "cpu.cfs_quota_us").exists():
        group, files = V1 / unique("elasticd-test"), {"cpu.cfs_period_us": "20000"}
        files["cpu.cfs_quota_us"] = str(max(1000, int(20000 * share)))
        root = V1
    elif _writable(V2) and "cpu" in (V2 / "cgroup.controllers").read_text().split():
        group, files, root = (
            V2 / unique("elasticd-test"),
            {"cpu.max": f"{max(1000, int(20000 * share))} 20000"},
            V2,
        )
    else:
        pytest.skip("no cgroup CPU controller this test may write")
    group.mkdir()
    try:
        for name, value in files.items():
            (group / name).write_text(value)
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        procs = (group / "cgroup.procs").read_text().split() if group.exists() else []
        for p in procs:
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(p)
        with contextlib.suppress(OSError):
            group.rmdir()


@pytest.mark.timeout(240)
def test_a_node_far_below_its_peers_is_left_out_of_an_elastic_round(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    a, b = start_cluster(daemon_factory, 2)
    assert b.proc is not None
    with cpu_quota(b.proc.pid, 0.15):
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


@pytest.mark.timeout(120)
def test_check_measures_every_node_against_the_cluster(daemon_factory: DaemonFactory) -> None:
    a, b = start_cluster(daemon_factory, 2)
    res = a.ctl("check", "--json")
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

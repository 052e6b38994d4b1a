"""Hang detection with real daemons and workers: a rank that reports steps and then stops, and
a plain torchrun script (no reports) whose ranks block, are found by the watch; every local
rank's stacks land in the attempt's log directory, status names the rank and its frame, and the
job restarts through the normal failure path. Waits are for events, never fixed sleeps."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import REPO, DaemonProc, start_cluster, submit_job, wait_job, wait_log

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"


def _line(script: Path, marker: str) -> int:
    return next(i for i, text in enumerate(script.read_text().splitlines(), 1) if marker in text)


@pytest.mark.timeout(180)
def test_a_rank_that_stops_reporting_is_found_dumped_and_restarted(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    script = SCRIPTS / "hang_after_step.py"
    res = daemon.ctl(
        "submit", "--hang-timeout", "3", "--max-restarts", "1", str(script), cwd=tmp_path
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.splitlines()[0]

    event = wait_log(daemon, "worker.hung", timeout_s=90)
    line = _line(script, "HANG LINE")
    assert event["rank"] == 0 and event["frame"] == f"hang_after_step.py:{line} in stuck", event
    job = wait_job(daemon, job_id, lambda j: j["state"] == "SUCCEEDED", "the restarted job to succeed", 90)
    assert job["restarts"] == 1

    stacks = (daemon.log_dir / job_id / "attempt_0" / "rank_0.stacks.txt").read_text()
    assert f"stuck ({script}:{line})" in stacks, stacks
    failure = json.loads(daemon.ctl("status", job_id, "--json").stdout)["failure"]
    assert failure["kind"] == "hang" and failure["rank"] == 0 and failure["attempt"] == 0
    assert failure["frame"] == f"hang_after_step.py:{line} in stuck"
    assert failure["message"].startswith("rank 0 hung: no progress for ")
    assert failure["message"].endswith(f" s in hang_after_step.py:{line} in stuck")
    text = daemon.ctl("status", job_id).stdout
    assert "rank 0 hung: no progress for" in text and f"hang_after_step.py:{line} in stuck" in text


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_torchrun_script_that_never_reports_is_judged_by_cpu_and_stacks(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    script = SCRIPTS / "hang_collective.py"
    res = daemon.ctl(
        "submit", "--nproc-per-node", "2", "--hang-timeout", "4", "--max-restarts", "1", str(script),
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.splitlines()[0]

    event = wait_log(daemon, "worker.hung", timeout_s=150)
    line = _line(script, "HANG LINE")
    # Both ranks stand still; the one waiting inside the collective is not the cause.
    assert event["rank"] == 1 and event["frame"] == f"hang_collective.py:{line} in wander_off", event
    job = wait_job(daemon, job_id, lambda j: j["state"] == "SUCCEEDED", "the restarted job to succeed", 150)
    assert job["restarts"] == 1
    attempt = daemon.log_dir / job_id / "attempt_0"
    assert f"wander_off ({script}:{line})" in (attempt / "rank_1.stacks.txt").read_text()
    assert "all_reduce" in (attempt / "rank_0.stacks.txt").read_text()
    failure = json.loads(daemon.ctl("status", job_id, "--json").stdout)["failure"]
    assert failure["kind"] == "hang" and failure["rank"] == 1
    assert [(f["rank"], f["message"].startswith("rank 0 hung: ")) for f in failure["also_failed"]] == [
        (0, True)
    ]


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_hang_on_one_node_restarts_the_other_through_etcd(
    daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """The rank that hangs is on one node; its peer on the other node waits in a collective that
    gloo would time out after 30 minutes. The job restarts on both within the hang timeout's
    reach, so the other node learned of the hang from the round in etcd."""
    pytest.importorskip("torch")
    a, b = start_cluster(daemon_factory, 2)
    script = SCRIPTS / "hang_across.py"
    job_id = submit_job(
        a, tmp_path, "--nnodes", "2", "--hang-timeout", "3", "--max-restarts", "1",
        "--python", sys.executable, str(script),
    )  # fmt: skip
    job = wait_job(a, job_id, lambda j: j["state"] == "SUCCEEDED", "the restarted job to succeed", 200)
    assert job["restarts"] == 1
    failure = job["failure"]
    assert failure["kind"] == "hang" and failure["rank"] == 1, failure
    assert failure["frame"] == f"hang_across.py:{_line(script, 'HANG LINE')} in <module>", failure
    hung_on = failure["node"]
    peer = a if hung_on == b.node_id else b
    assert peer.node_id != hung_on
    wait_log(peer, "attempt.started", job=job_id, round=1)  # the peer took part in the next round

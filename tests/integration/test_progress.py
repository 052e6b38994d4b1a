"""Progress in status, with real daemons and workers: each rank's last step, steps/s and time since
its last step; and a worker that abuses its progress pipe disturbs nothing. (Which rank the others
wait for: ``test_stragglers``.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, DaemonProc, log_events, wait_for, wait_job

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"


def _progress(job: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["rank"]: p for m in job.get("members", []) for p in m.get("progress", [])}


@pytest.mark.timeout(180)
def test_a_stepping_job_shows_its_progress(daemon: DaemonProc, tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path))
    res = daemon.ctl("submit", "--nproc-per-node", "2", str(SCRIPTS / "stepper.py"), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.splitlines()[0]

    def stepping(job: dict[str, Any]) -> bool:
        p = _progress(job)
        return len(p) == 2 and all((r.get("step") or 0) >= 8 and r["samples"] >= 5 for r in p.values())

    job = wait_job(daemon, job_id, stepping, "both ranks to report steps", 90)
    fast, slow = _progress(job)[0], _progress(job)[1]
    assert fast["phase"] == "step" and fast["steps_per_s"] > 0 and fast["last_step_at"] > 0
    assert slow["step_time_s"] > 2 * fast["step_time_s"]
    # Ranks that never wait for each other (no collective): neither holds the other back.
    assert not slow["straggler"] and not fast["straggler"]

    as_json = json.loads(daemon.ctl("status", job_id, "--json").stdout)
    rank1 = _progress(as_json)[1]
    assert "T" in rank1["last_step_at"]  # ISO 8601 for programs
    text = daemon.ctl("status", job_id).stdout
    assert "progress:" in text and "STEPS/S" in text and "LAST STEP" in text
    row = next(line.split() for line in text.splitlines() if line.strip().startswith("1 "))
    assert row[5] == "ago", row

    (tmp_path / "stop").touch()
    assert wait_job(daemon, job_id, lambda j: j["state"] == "SUCCEEDED", "the job to end", 60)


@pytest.mark.timeout(180)
def test_a_worker_abusing_its_progress_pipe_disturbs_nothing(daemon: DaemonProc, tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path))
    res = daemon.ctl("submit", str(SCRIPTS / "hostile_progress.py"), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.splitlines()[0]

    # The valid line after the flood arrives; the daemon answers all along.
    job = wait_job(daemon, job_id, lambda j: _progress(j).get(0, {}).get("step") == 7, "step 7", 120)
    assert job["state"] == "RUNNING"
    (tmp_path / "stop").touch()
    wait_job(daemon, job_id, lambda j: j["state"] == "SUCCEEDED", "the job to end", 60)
    junk = wait_for(lambda: log_events(daemon, "progress.junk", job=job_id), 30, what="the junk count")
    assert junk[0]["lines"] > 0 and junk[0]["rank"] == 0

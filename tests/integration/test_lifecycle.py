"""A job's records and logs do not live forever: ``rm`` of an ended job, and retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import DaemonProc, submit_job

pytestmark = pytest.mark.timeout(120)
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_rm_refuses_a_running_job_and_removes_an_ended_one(daemon: DaemonProc, tmp_path: Path) -> None:
    job = submit_job(daemon, tmp_path, str(SCRIPTS / "sleeper.py"), env={"SLEEP": "600"})
    daemon.wait_state(job, ("RUNNING",))
    res = daemon.ctl("rm", job)
    assert res.returncode == 3 and "[conflict]" in res.stderr and "kill it first" in res.stderr
    assert daemon.ctl("kill", job).returncode == 0
    assert (daemon.log_dir / job).is_dir()
    res = daemon.ctl("rm", job)
    assert res.returncode == 0, res.stderr
    assert not (daemon.log_dir / job).exists()
    gone = daemon.ctl("status", job)
    assert gone.returncode == 3 and "job_not_found" in gone.stderr
    assert daemon.ctl("rm", job).returncode == 3  # once


def test_ended_jobs_expire_after_the_retention(daemon_factory: object, tmp_path: Path) -> None:
    d: DaemonProc = daemon_factory(None, "--job-retention", "1")  # type: ignore[operator]
    job = submit_job(d, tmp_path, str(SCRIPTS / "sleeper.py"), env={"SLEEP": "0"})
    d.wait_state(job, ("SUCCEEDED",))
    # The janitor deletes the records once they are a second old; this node then drops its logs.
    from tests.support import wait_for

    wait_for(lambda: d.ctl("status", job).returncode == 3, 30, 0.2, "the job's records to expire")
    wait_for(lambda: not (d.log_dir / job).exists(), 30, 0.2, "its logs to go")

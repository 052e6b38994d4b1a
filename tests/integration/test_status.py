"""``elasticctl status`` of ended jobs against a real daemon: the final world and members' end
states, start and end times (ISO 8601 in JSON), filters, ids, and ``--watch`` until Ctrl-C."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from elasticctl.client import DaemonError
from tests.conftest import DaemonFactory
from tests.support import PYTHON, REPO, DaemonProc, hears_ctrl_c, wait_for

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"


def submit(d: DaemonProc, tmp_path: Path, *argv: str, **env: str) -> str:
    res = d.ctl("submit", *argv, env=dict(os.environ, OUT=str(tmp_path), **env), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[0]


@pytest.fixture
def ended(daemon: DaemonProc, tmp_path: Path) -> dict[str, str]:
    """Three ended jobs of 2 workers each, by their end state."""
    ok = submit(daemon, tmp_path, "--nproc-per-node", "2", str(SCRIPTS / "sleeper.py"), SLEEP="0")
    failed = submit(
        daemon, tmp_path, "--nproc-per-node", "2", "--max-restarts", "0", str(SCRIPTS / "fail_rank.py")
    )
    killed = submit(daemon, tmp_path, "--nproc-per-node", "2", str(SCRIPTS / "sleeper.py"))
    wait_for(lambda: daemon.job(killed)["state"] == "RUNNING", 30, what="the job to kill to run")
    assert daemon.ctl("kill", killed).returncode == 0
    daemon.wait_state(ok, ("SUCCEEDED",))
    daemon.wait_state(failed, ("FAILED",))
    return {"SUCCEEDED": ok, "FAILED": failed, "KILLED": killed}


def status_json(d: DaemonProc, *argv: str) -> object:
    res = d.ctl("status", "--json", *argv)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_an_ended_job_keeps_its_world_members_and_times(daemon: DaemonProc, ended: dict[str, str]) -> None:
    for state, job_id in ended.items():
        job = status_json(daemon, job_id)
        assert isinstance(job, dict)
        assert (job["state"], job["world_size"], job["nodes"]) == (state, 2, [daemon.node_id]), job
        assert [m["state"] for m in job["members"]] == [state]  # not the STOPPING its agent left
        times = {k: datetime.fromisoformat(job[k]) for k in ("submitted_at", "started_at", "ended_at")}
        assert all(t.utcoffset() == timedelta(0) for t in times.values())
        assert times["submitted_at"] <= times["started_at"] <= times["ended_at"]
        assert job[k := "ended_at"][-6:] == "+00:00" and job[k][-10] == ".", job[k]  # milliseconds
    failed = status_json(daemon, ended["FAILED"])
    assert isinstance(failed, dict)
    assert isinstance(failed["failure"]["failed_at"], str | None)

    table = daemon.ctl("status").stdout.splitlines()
    assert table[0].split()[6:9] == ["STARTED", "ENDED", "DURATION"]
    assert len(table) == 4 and all(line.split()[7] != "-" for line in table[1:]), table  # ENDED
    detail = daemon.ctl("status", ended["KILLED"]).stdout
    assert "started:" in detail and "ended:" in detail and "duration:" in detail


def test_filters_and_ids(daemon: DaemonProc, ended: dict[str, str]) -> None:
    def ids(*argv: str) -> list[str]:
        res = daemon.ctl("status", "-q", *argv)
        assert res.returncode == 0, res.stderr
        return res.stdout.splitlines()

    assert ids("--state", "SUCCEEDED") == [ended["SUCCEEDED"]]
    assert sorted(ids("--state", "killed,FAILED")) == sorted([ended["KILLED"], ended["FAILED"]])
    assert ids("--state", "RUNNING,PENDING") == []
    me = pwd.getpwuid(os.getuid()).pw_name
    assert sorted(ids("--user", me)) == sorted(ended.values()) == sorted(ids())
    assert ids("--user", "no-such-user-here") == []
    listed = status_json(daemon, "--state", "SUCCEEDED")
    assert isinstance(listed, list) and [j["id"] for j in listed] == [ended["SUCCEEDED"]]

    bad = daemon.ctl("status", "--state", "DONE")
    assert bad.returncode == 2 and "not a job state" in bad.stderr
    both = daemon.ctl("status", ended["KILLED"], "--user", me)
    assert both.returncode == 2 and "--state and --user" in both.stderr
    for args in ({"job": ended["KILLED"], "states": ["KILLED"]}, {"states": ["DONE"]}):
        with pytest.raises(DaemonError) as info:
            daemon.call("status", **args)
        assert info.value.code == "invalid_args"


def test_watch_prints_until_ctrl_c(daemon: DaemonProc, ended: dict[str, str]) -> None:
    env = dict(os.environ, ELASTICD_SOCKET=str(daemon.socket))
    argv = [PYTHON, "-m", "elasticctl", "status", "--state", "SUCCEEDED", "-q", "--watch", "0.2"]
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen(argv, env=env, preexec_fn=hears_ctrl_c, **pipes)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        # At least two looks: it redraws, and only the jobs that pass the filter.
        wait_for(lambda: lines.count(ended["SUCCEEDED"] + "\n") >= 2, 30, what="two looks of --watch")
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reader.join(10)
    assert set(lines) == {ended["SUCCEEDED"] + "\n", "\n"}
    assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")


def _states(d: DaemonProc) -> dict[str, str]:
    return {j["id"]: j["state"] for j in d.call("status")["jobs"]}


def test_status_after_a_command_shows_its_write(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """``status`` answers from the daemon's copy of every job (``manager.clustercopy``). A command
    waits for the copy to hold its own write, so the status right after a submit, a kill or an rm
    shows that write; a job another daemon submits shows here when the watch brings the change."""
    here, there = daemon_factory(), daemon_factory()
    sleeper: dict[str, Any] = {
        "entry_kind": "script", "entry": str(SCRIPTS / "sleeper.py"), "cwd": str(tmp_path),
        "python": PYTHON, "env": {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)},
    }  # fmt: skip
    _states(here)  # a read is held from now on
    job = here.call("submit", **sleeper)["id"]
    assert job in _states(here)
    wait_for(lambda: _states(here)[job] == "RUNNING", 60, what="the job to run")
    here.call("kill", job=job)
    assert _states(here)[job] == "KILLED"
    here.call("rm", job=job)
    assert job not in _states(here)
    theirs = there.call("submit", **sleeper)["id"]
    wait_for(lambda: theirs in _states(here), 10, what="the other daemon's job in this one's status")
    there.call("kill", job=theirs)
    wait_for(lambda: _states(here)[theirs] == "KILLED", 10, what="the other daemon's kill, seen here")

"""Who may do what through the socket, and paths checked as the submitter (never as root)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonFactory
from tests.support import DaemonProc
from tests.users import NOBODY, OTHER_USERS, SYSTEM_PYTHON, as_user, public_daemon, public_dir

pytestmark = [*OTHER_USERS, pytest.mark.slow]
ENV = {"PATH": "/usr/bin:/bin", "SLEEP": "600"}


@pytest.fixture
def public() -> Iterator[Path]:
    with public_dir("elasticd-perm-") as path:
        yield path


@pytest.fixture
def shared_daemon(daemon_factory: DaemonFactory, public: Path) -> DaemonProc:
    """A daemon whose socket uid nobody can reach (0666 in a world-readable directory)."""
    return public_daemon(daemon_factory, public)


def _sleeper(public: Path) -> Path:
    work = public / "work"
    work.mkdir(mode=0o777, exist_ok=True)
    work.chmod(0o777)
    script = work / "sleep.py"
    script.write_text("import os, time\ntime.sleep(float(os.environ.get('SLEEP', '0')))\n")
    script.chmod(0o644)
    return script


def _submit_args(script: Path, **extra: object) -> dict[str, Any]:
    return {
        "entry_kind": "script",
        "entry": str(script),
        "cwd": str(script.parent),
        "python": SYSTEM_PYTHON,
        "env": ENV,
    } | extra


def nobody(d: DaemonProc, cmd: str, **args: object) -> dict[str, object]:
    return as_user(NOBODY, NOBODY, d.socket, cmd, **args)


def test_only_owner_or_root_may_kill_drain_undrain_or_read_logs(
    shared_daemon: DaemonProc, public: Path
) -> None:
    d = shared_daemon
    script = _sleeper(public)
    root_job = d.call("submit", **_submit_args(script))["id"]
    d.wait_state(root_job, ("RUNNING",))
    denied = {
        "kill": {"job": root_job},
        "logs": {"job": root_job},
        "drain": {"node": d.node_id, "job": root_job},
        "undrain": {"node": d.node_id, "job": root_job},
        "rm": {"job": root_job},
    }
    for cmd, args in denied.items():
        reply = nobody(d, cmd, **args)
        assert reply["ok"] is False and reply["code"] == "permission_denied", (cmd, reply)
        assert "belongs to root" in str(reply["message"])
    for cmd in ("drain", "undrain"):  # node-wide: root only
        reply = nobody(d, cmd, node=d.node_id)
        assert reply["ok"] is False and reply["code"] == "permission_denied", (cmd, reply)
    reply = nobody(d, "undrain", node=d.node_id, gpu="GPU-0")  # returning a GPU: root only too
    assert reply["ok"] is False and reply["code"] == "permission_denied", reply
    # Everyone in the group may look.
    assert nobody(d, "status")["ok"] and nobody(d, "status", job=root_job)["ok"]
    assert nobody(d, "nodes")["ok"] and nobody(d, "ping")["ok"]
    # Nothing happened to root's job or the node.
    assert d.job(root_job)["state"] == "RUNNING"
    assert d.call("nodes")["nodes"][0]["draining"] is False

    own = nobody(d, "submit", **_submit_args(script))
    assert own["ok"], own
    own_id = own["result"]["id"]  # type: ignore[index]
    d.wait_state(own_id, ("RUNNING",))
    assert nobody(d, "logs", job=own_id)["ok"]
    drained = nobody(d, "drain", node=d.node_id, job=own_id, force=True)
    assert drained["ok"], drained
    assert nobody(d, "undrain", node=d.node_id, job=own_id)["ok"]
    killed = nobody(d, "kill", job=own_id)
    assert killed["ok"] and killed["result"]["job"]["state"] == "KILLED"  # type: ignore[index]
    assert d.call("kill", job=root_job)["job"]["state"] == "KILLED"


def test_unknown_jobs_and_nodes_are_errors_with_stable_codes(daemon: DaemonProc) -> None:
    for argv, code in [
        (("kill", "no-such-job"), "job_not_found"),
        (("logs", "no-such-job"), "job_not_found"),
        (("drain", "no-such-node"), "node_not_found"),
        (("undrain", "no-such-node"), "node_not_found"),
        (("undrain", daemon.node_id), "conflict"),  # known, but not drained
        (("drain", daemon.node_id, "--job", "no-such-job"), "job_not_found"),
        (("undrain", daemon.node_id, "--job", "no-such-job"), "job_not_found"),
    ]:
        res = daemon.ctl(*argv)
        assert res.returncode == 3 and code in res.stderr, (argv, res.stderr)


def test_paths_are_checked_as_the_submitter_with_one_answer(shared_daemon: DaemonProc, public: Path) -> None:
    d = shared_daemon
    script = _sleeper(public)
    secret = public / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "exists").mkdir()
    hidden_script = secret / "job.py"
    hidden_script.write_text("print('never')\n")
    # A root-only directory: existing or not, nobody gets the same answer (no existence oracle).
    replies = [
        nobody(d, "submit", **_submit_args(script, cwd=str(secret / name))) for name in ("exists", "missing")
    ]
    for reply, name in zip(replies, ("exists", "missing"), strict=True):
        assert reply["ok"] is False and reply["code"] == "invalid_spec", reply
        assert (
            reply["message"]
            == f"working directory {secret / name} is missing or not accessible to user nobody"
        )
    reply = nobody(d, "submit", **_submit_args(hidden_script, cwd=str(script.parent)))
    assert reply["ok"] is False and reply["code"] == "script_not_found"
    assert "missing or not readable by user nobody" in str(reply["message"])
    reply = nobody(d, "submit", **_submit_args(script, python=str(secret / "python")))
    assert reply["ok"] is False and reply["code"] == "invalid_spec"
    assert "missing or not executable by user nobody" in str(reply["message"])
    # Root may use its own directories: the check is the caller's, not a blanket refusal.
    ok = d.call("submit", **_submit_args(hidden_script, cwd=str(secret), env={"PATH": "/usr/bin:/bin"}))
    assert d.wait_state(ok["id"], ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def test_no_python_executable_resolves_against_the_jobs_cwd(daemon: DaemonProc, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    run = work / "run.sh"
    run.write_text('#!/bin/sh\necho "ran in $(pwd)" > "$OUT"\n')
    run.chmod(0o755)
    out = tmp_path / "out.txt"
    res = daemon.ctl(
        "submit", "--no-python", "--follow", "./run.sh", cwd=work, env=dict(os.environ, OUT=str(out))
    )
    assert res.returncode == 0, res.stderr
    assert out.read_text().strip() == f"ran in {work}"
    res = daemon.ctl("submit", "--no-python", "./missing.sh", cwd=work)
    assert (
        res.returncode == 3 and "script_not_found" in res.stderr and "missing or not executable" in res.stderr
    )
    assert sys.executable  # the job above ran /bin/sh, not python


def test_root_jobs_are_refused_unless_the_daemon_allows_them(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    d = daemon_factory(None, "--slots", "2", start=False)
    d.allow_root_jobs = False
    d.start()
    script = tmp_path / "job.py"
    script.write_text("print('hi')\n")
    res = d.ctl("submit", str(script))
    assert res.returncode == 3 and "permission_denied" in res.stderr and "allow_root_jobs" in res.stderr


def test_only_root_and_admins_may_check_nodes(shared_daemon: DaemonProc) -> None:
    reply = nobody(shared_daemon, "check")
    assert reply["ok"] is False and reply["code"] == "permission_denied", reply
    assert "only root may do this" in str(reply["message"])

"""Jobs run as the user who submitted them, identified by the socket's peer credentials."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticctl.client import Client, DaemonError
from tests.conftest import DaemonFactory
from tests.support import wait_for

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a daemon that switches users"),
    pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs a python that uid nobody can run"),
]


@pytest.fixture
def public_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="elasticd-uid-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(uid: int, gid: int, socket: Path, cmd: str, **args: Any) -> dict[str, Any]:
    """Send one request from a forked child that has dropped to ``uid``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            client = Client(socket, timeout_s=15)
            try:
                reply: dict[str, Any] = {"ok": True, "result": client.call(cmd, **args)}
            except DaemonError as exc:
                reply = {"ok": False, "code": exc.code, "message": exc.message}
            os.write(write_fd, json.dumps(reply).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def test_job_runs_as_submitter_and_only_owner_or_root_may_kill(
    daemon_factory: DaemonFactory, public_dir: Path
) -> None:
    d = daemon_factory(
        None,
        "--socket",
        str(public_dir / "ctl.sock"),
        start=False,
        env=dict(os.environ, ELASTICD_SOCKET_MODE="666"),
    )
    d.root = public_dir / "daemon"
    d.stderr_path = public_dir / "daemon.log"
    d.args = [a if a != str(public_dir / "ctl.sock") else str(d.socket) for a in d.args]
    d.start()
    work = public_dir / "work"
    work.mkdir(mode=0o777)
    work.chmod(0o777)
    script = work / "whoami.py"
    script.write_text(
        "import os, time\n"
        "open(os.path.join(os.path.dirname(__file__), f'uid.{os.environ[\"RANK\"]}'), 'w')"
        ".write(f'{os.getuid()} {os.getgid()}')\n"
        "time.sleep(float(os.environ.get('SLEEP', '0')))\n"
    )
    script.chmod(0o644)
    base = {
        "entry_kind": "script",
        "entry": str(script),
        "cwd": str(work),
        "python": SYSTEM_PYTHON,
        "env": {"PATH": "/usr/bin:/bin", "SLEEP": "600"},
        "nproc_per_node": 2,
    }
    reply = as_user(NOBODY, NOBODY, d.socket, "submit", **base)
    assert reply["ok"], reply
    job = reply["result"]
    assert job["user"] == "nobody"
    wait_for(lambda: (work / "uid.0").exists() and (work / "uid.1").exists(), 30, what="workers as nobody")
    assert (work / "uid.0").read_text() == f"{NOBODY} {NOBODY}"
    log = d.log_dir / job["id"] / "attempt_0" / "rank_0.log"
    assert log.stat().st_uid == NOBODY

    root_job = d.call(
        "submit", **(base | {"env": {"PATH": "/usr/bin:/bin", "SLEEP": "600"}, "nproc_per_node": 1})
    )
    denied = as_user(NOBODY, NOBODY, d.socket, "kill", job=root_job["id"])
    assert denied == {"ok": False, "code": "permission_denied", "message": denied["message"]}
    assert "belongs to root" in denied["message"]
    own = as_user(NOBODY, NOBODY, d.socket, "kill", job=job["id"])
    assert own["ok"] and own["result"]["job"]["state"] == "KILLED"
    assert d.call("kill", job=root_job["id"])["job"]["state"] == "KILLED"

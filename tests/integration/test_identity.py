"""Jobs run as the user who submitted them, identified by the socket's peer credentials."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonFactory
from tests.support import wait_for
from tests.users import NOBODY, OTHER_USERS, SYSTEM_PYTHON, as_user, public_daemon, public_dir, public_workdir

pytestmark = OTHER_USERS


@pytest.fixture
def public() -> Iterator[Path]:
    with public_dir() as path:
        yield path


def test_job_runs_as_submitter_and_only_owner_or_root_may_kill(
    daemon_factory: DaemonFactory, public: Path
) -> None:
    public_dir = public
    d = public_daemon(daemon_factory, public_dir)
    work = public_workdir(public_dir)
    script = work / "whoami.py"
    script.write_text(
        "import os, time\n"
        "open(os.path.join(os.path.dirname(__file__), f'uid.{os.environ[\"RANK\"]}'), 'w')"
        ".write(f'{os.getuid()} {os.getgid()}')\n"
        "time.sleep(float(os.environ.get('SLEEP', '0')))\n"
    )
    script.chmod(0o644)
    base: dict[str, Any] = {
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

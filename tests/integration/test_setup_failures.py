"""Failures that are not the job's fault say so, and do not spend the restart budget in a loop;
limits are enforced and an OOM kill is reported as such."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonFactory
from tests.support import DaemonProc, wait_for

pytestmark = pytest.mark.slow

ALLOCATE = "buf = []\nfor _ in range(400):\n    buf.append(bytearray(1 << 20))\nprint('survived')\n"
FAIL_ONCE = (
    "import os, sys\n"
    "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
    "    open(os.environ['MARK'], 'w').close()\n"
    "    sys.exit(3)\n"
)


def submit(d: DaemonProc, *argv: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    res = d.ctl("submit", *argv, cwd=cwd, env=dict(os.environ) | (env or {}))
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[0]


def ended(d: DaemonProc, job: str) -> dict[str, object]:
    return d.wait_state(job, ("SUCCEEDED", "FAILED", "KILLED"), 60)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")
def test_memory_limit_oom_kill_ends_with_reason_oom(daemon: DaemonProc, tmp_path: Path) -> None:
    script = tmp_path / "hog.py"
    script.write_text(ALLOCATE)
    job = submit(daemon, "--memory-limit", "64M", "--max-restarts", "0", str(script), cwd=tmp_path)
    view = ended(daemon, job)
    if (
        view["code"] != "oom"
        and "limits.backend" in daemon.log_text()
        and "rlimit" in str(daemon.events("limits.backend"))
    ):
        pytest.skip("no cgroup memory controller here: RLIMIT_AS gives MemoryError, not the OOM killer")
    assert view["state"] == "FAILED" and view["code"] == "oom", view
    assert "OOM killer" in str(view["reason"]) + str(view.get("failure"))
    small = submit(daemon, "--memory-limit", "512M", "--nofile", "64", str(script), cwd=tmp_path)
    assert ended(daemon, small)["state"] == "SUCCEEDED"


def test_an_interpreter_gone_after_submit_fails_once_with_its_own_reason(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    script = tmp_path / "once.py"
    script.write_text(FAIL_ONCE)
    mark = tmp_path / "failed-once"
    job = submit(
        daemon,
        "--python",
        str(python),
        "--max-restarts",
        "5",
        str(script),
        cwd=tmp_path,
        env={"MARK": str(mark)},
    )
    wait_for(mark.exists, 30, what="the first attempt to fail")
    python.unlink()  # the next attempt cannot start: not the job's fault, and no restart helps
    view = ended(daemon, job)
    assert view["state"] == "FAILED" and view["code"] == "interpreter_unavailable", view
    assert f"python interpreter {python} is missing" in str(view["reason"])
    assert view["restarts"] == 1  # the job's own failure; the setup failure spent nothing


def test_an_unreadable_script_for_the_next_attempt_is_entry_unavailable(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    script = tmp_path / "once.py"
    script.write_text(FAIL_ONCE)
    mark = tmp_path / "failed-once"
    job = submit(daemon, "--max-restarts", "5", str(script), cwd=tmp_path, env={"MARK": str(mark)})
    wait_for(mark.exists, 30, what="the first attempt to fail")
    script.unlink()
    view = ended(daemon, job)
    assert view["state"] == "FAILED" and view["code"] == "entry_unavailable", view
    assert view["restarts"] == 1


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "logs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mount)], check=False
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small disk needs root")
def test_a_full_log_disk_says_so_and_spends_nothing(
    daemon_factory: DaemonFactory, small_disk: Path, tmp_path: Path
) -> None:
    d = daemon_factory(None, "--slots", "2", "--log-dir", str(small_disk))
    script = tmp_path / "chatty.py"
    script.write_text("import sys\nfor i in range(100000):\n    print('x' * 100, i)\nsys.stdout.flush()\n")
    job = submit(d, "--max-restarts", "5", str(script), cwd=tmp_path)
    view = ended(d, job)
    assert view["state"] == "FAILED" and view["code"] == "log_disk_full", view
    assert "no space left for job logs" in str(view["reason"])
    assert view["restarts"] == 0
    # Full from the start: the next job is refused at launch with the same reason.
    nxt = submit(d, str(script), cwd=tmp_path)
    view = ended(d, nxt)
    assert view["code"] == "log_disk_full" and view["restarts"] == 0, view
    assert d.call("ping")["node"] == d.node_id

"""A job (running as the user) cannot make the root daemon touch, hand over or print root's files.

The job tries to plant symlinks and hard links where the next attempt's logs go; every attempt
must fail with EACCES (the log tree is root's, 0755), the next attempt must run normally, and the
root-only targets must keep their content, owner and mode. A job's working directory is entered
as the user, so a root-only directory is never a job's cwd.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elasticd.workers.proctree.spawn import Identity, worker_preexec
from elasticd.workers.zygote_program.shared import SPAWN_FAILED
from tests.conftest import DaemonFactory
from tests.support import wait_for
from tests.users import NOBODY, OTHER_USERS, SYSTEM_PYTHON, as_user, public_daemon, public_dir

pytestmark = [*OTHER_USERS, pytest.mark.timeout(120)]

SECRET = b"TOP SECRET root only\n"

PLANTER = r"""
import errno, json, os, sys

err = os.environ["TORCHELASTIC_ERROR_FILE"]
n = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
attempt_dir = os.path.dirname(err)
job_dir = os.path.dirname(attempt_dir)
secret = os.environ["SECRET"]
secret_dir = os.path.dirname(secret)
work = os.path.dirname(os.path.abspath(__file__))
own = os.path.join(work, "own.%d" % n)
open(own, "w").write("mine\n")
nxt = os.path.join(job_dir, "attempt_%d" % (n + 1))
tried = {}

def attempt(name, fn):
    try:
        fn()
        tried[name] = "ok"
    except OSError as exc:
        tried[name] = errno.errorcode.get(exc.errno, str(exc.errno))

attempt("symlink_next_attempt", lambda: os.symlink(secret_dir, nxt))
attempt("mkdir_next_attempt", lambda: os.mkdir(nxt))
attempt("symlink_log", lambda: os.symlink(secret, os.path.join(attempt_dir, "rank_1.log")))
attempt("symlink_error_file", lambda: os.symlink(secret, os.path.join(attempt_dir, "rank_1.error.json")))
attempt("unlink_error_file", lambda: os.unlink(err))
attempt("rename_over_error_file", lambda: os.rename(own, err))
attempt("unlink_log", lambda: os.unlink(os.path.join(attempt_dir, "rank_0.log")))
attempt("hardlink_secret", lambda: os.link(secret, os.path.join(attempt_dir, "rank_9.log")))
attempt("hardlink_own", lambda: os.link(own, os.path.join(attempt_dir, "rank_9.log")))
attempt("symlink_in_job_dir", lambda: os.symlink(secret, os.path.join(job_dir, "x")))
# What torch's @record does: rewrite the pre-created error file as the user.
with open(err, "w") as f:
    json.dump({"message": {"message": "planted in attempt %d" % n}}, f)
json.dump(tried, open(os.path.join(work, "tried.%d.json" % n), "w"))
print("attempt", n, "uid", os.getuid(), flush=True)
sys.exit(1 if n == 0 else 0)
"""


@pytest.fixture
def public() -> Iterator[Path]:
    with public_dir("elasticd-logsafety-") as path:
        yield path


@pytest.fixture
def secret(public: Path) -> Iterator[Path]:
    """A root-only file (0600) in a root-only directory (0700), checked untouched afterwards."""
    d = public / "secret"
    d.mkdir(mode=0o700)
    (d / "dir").mkdir(mode=0o700)
    f = d / "key"
    f.write_bytes(SECRET)
    f.chmod(0o600)
    yield f
    assert f.read_bytes() == SECRET
    for path, mode in ((f, 0o600), (d, 0o700), (d / "dir", 0o700)):
        st = path.lstat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, mode), path
    assert sorted(os.listdir(d)) == ["dir", "key"]
    assert os.listdir(d / "dir") == []


def work_dir(public: Path, script: str) -> tuple[Path, Path]:
    work = public / "work"
    work.mkdir()
    work.chmod(0o777)
    path = work / "job.py"
    path.write_text(script)
    path.chmod(0o644)
    return work, path


def spec(work: Path, script: Path, **extra: object) -> dict[str, object]:
    return {
        "entry_kind": "script",
        "entry": str(script),
        "cwd": str(work),
        "python": SYSTEM_PYTHON,
        "env": {"PATH": "/usr/bin:/bin"},
    } | extra


def logs_text(reply: dict[str, object]) -> str:
    result = reply["result"]
    assert isinstance(result, dict)
    return "".join(c["text"] for c in result["chunks"])


def test_planted_links_are_refused_and_never_followed(
    daemon_factory: DaemonFactory, public: Path, secret: Path
) -> None:
    d = public_daemon(daemon_factory, public)
    work, script = work_dir(public, PLANTER)
    reply = as_user(
        NOBODY,
        NOBODY,
        d.socket,
        "submit",
        **spec(work, script, max_restarts=1, env={"PATH": "/usr/bin:/bin", "SECRET": str(secret)}),
    )
    assert reply["ok"], reply
    job = reply["result"]["id"]
    attempt_1 = d.log_dir / job / "attempt_1"
    wait_for(
        lambda: (work / "tried.1.json").exists() and b"attempt 1" in (attempt_1 / "rank_0.log").read_bytes(),
        60,
        what="the second attempt",
    )

    for n in (0, 1):
        tried = json.loads((work / f"tried.{n}.json").read_text())
        assert tried.pop("hardlink_secret") in ("EACCES", "EPERM"), tried
        assert set(tried.values()) == {"EACCES"}, tried
    for directory in (d.log_dir, d.log_dir / job, d.log_dir / job / "attempt_0", attempt_1):
        st = directory.lstat()
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    for n in (0, 1):
        attempt = d.log_dir / job / f"attempt_{n}"
        assert sorted(os.listdir(attempt)) == ["rank_0.error.json", "rank_0.log"]
        for name in ("rank_0.log", "rank_0.error.json"):
            st = (attempt / name).lstat()
            assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o600)
        assert f"attempt {n} uid {NOBODY}" in (attempt / "rank_0.log").read_text()
    assert "planted in attempt 0" in (d.log_dir / job / "attempt_0" / "rank_0.error.json").read_text()

    mine = as_user(NOBODY, NOBODY, d.socket, "logs", job=job)
    assert mine["ok"], mine
    text = logs_text(mine) + logs_text({"result": d.call("logs", job=job)})
    assert f"attempt 0 uid {NOBODY}" in text and f"attempt 1 uid {NOBODY}" in text
    assert SECRET.decode().strip() not in text
    for escape in ("..", "../..", f"{job}/../..", "/"):
        sneaky = as_user(NOBODY, NOBODY, d.socket, "logs", job=escape)
        assert not sneaky["ok"] or SECRET.decode().strip() not in logs_text(sneaky)


def test_a_root_only_cwd_is_never_entered(daemon_factory: DaemonFactory, public: Path, secret: Path) -> None:
    d = public_daemon(daemon_factory, public)
    work, script = work_dir(
        public,
        "import os\nopen(os.path.join(os.environ['WORK'], 'ran'), 'w').write(os.getcwd())\n"
        "open('planted', 'w').write('x')\n",
    )
    reply = as_user(
        NOBODY,
        NOBODY,
        d.socket,
        "submit",
        **spec(work, script, max_restarts=0, cwd=str(secret.parent), env={"WORK": str(work)}),
    )
    if reply["ok"]:  # not refused at submission: the worker must fail to enter it
        log = d.log_dir / reply["result"]["id"] / "attempt_0" / "rank_0.log"
        message = f"elasticd: cannot enter working directory {secret.parent}: Permission denied"
        wait_for(lambda: log.exists() and message in log.read_text(), 30, what="the spawn failure")
    else:
        assert reply["code"] == "invalid_spec", reply
    assert not (work / "ran").exists()


WAITER = """
import os, sys, time
work = os.environ["WORK"]
n = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
open(os.path.join(work, "ran.%d" % n), "w").write("%s %d" % (os.getcwd(), os.getuid()))
deadline = time.time() + 60
while not os.path.exists(os.path.join(work, "go")) and time.time() < deadline:
    time.sleep(0.05)
sys.exit(1)
"""


def test_a_cwd_closed_after_submission_is_not_entered_by_the_next_attempt(
    daemon_factory: DaemonFactory, public: Path
) -> None:
    """The submit-time check passed; by the restart only root may enter the directory."""
    d = public_daemon(daemon_factory, public)
    work, script = work_dir(public, WAITER)
    cwd = public / "cwd"
    cwd.mkdir(mode=0o755)
    reply = as_user(
        NOBODY,
        NOBODY,
        d.socket,
        "submit",
        **spec(work, script, max_restarts=1, cwd=str(cwd), env={"WORK": str(work)}),
    )
    assert reply["ok"], reply
    wait_for(lambda: (work / "ran.0").exists(), 30, what="the first attempt")
    assert (work / "ran.0").read_text() == f"{cwd} {NOBODY}"
    cwd.chmod(0o700)
    (work / "go").touch()
    # The check before every attempt (as the submitter) stops it, with its own reason and no
    # restart loop; were it raced, the worker's chdir as the user would still fail (tests below).
    view = d.wait_state(reply["result"]["id"], ("FAILED",), 30)
    assert view["code"] == "entry_unavailable", view
    assert f"working directory {cwd} is missing or not accessible to user nobody" in view["reason"]
    assert not (work / "ran.1").exists()


# -- the worker's preexec, directly ------------------------------------------------------------------

PROBE = (
    "import ctypes, os, sys\n"
    "sig = ctypes.c_int()\n"
    "ctypes.CDLL(None).prctl(2, ctypes.byref(sig))\n"  # PR_GET_PDEATHSIG
    "print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), os.getcwd(), sig.value)\n"
)


def run(
    cwd: Path, identity: Identity | None, before_drop: Callable[[], None] | None = None
) -> tuple[int, str]:
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-c", PROBE],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={"PATH": "/usr/bin:/bin"},
        start_new_session=True,
        preexec_fn=worker_preexec(str(cwd), identity, before_drop),
        close_fds=True,
        timeout=30,
    )
    return proc.returncode, proc.stdout.decode()


def test_the_switch_happens_before_chdir_and_the_death_signal_after(public: Path, secret: Path) -> None:
    nobody = Identity(NOBODY, NOBODY, (NOBODY,))
    code, out = run(public, nobody)
    assert (code, out.split()) == (0, [str(NOBODY)] * 3 + [f"[{NOBODY}]", str(public), "9"])

    code, out = run(secret.parent, nobody)
    assert code == SPAWN_FAILED
    assert out == f"elasticd: cannot enter working directory {secret.parent}: Permission denied\n"

    code, out = run(secret.parent, None)  # no switch (a job of root's): root may enter
    assert code == 0 and str(secret.parent) in out


def test_before_drop_runs_as_root_and_its_failure_stops_the_worker(public: Path) -> None:
    marker = public / "hook"
    nobody = Identity(NOBODY, NOBODY, (NOBODY,))

    def hook() -> None:
        marker.write_text(str(os.geteuid()))

    code, _ = run(public, nobody, hook)
    assert code == 0 and marker.read_text() == "0"

    def broken() -> None:
        raise RuntimeError("no cgroup")

    code, out = run(public, nobody, broken)
    assert code == SPAWN_FAILED and out == "elasticd: cannot prepare the worker: no cgroup\n"

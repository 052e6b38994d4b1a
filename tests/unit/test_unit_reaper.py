"""The reaper sidecar repeats a few names and rules of the package (it imports none of it): they agree,
and the sidecar itself loads nothing but the standard library."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from elasticd.workers.cgroups import fs, kill, limits, tracking
from elasticd.workers.proctree import markers, reaper


def test_shared_names_agree() -> None:
    assert (reaper.OWNER_ENV, reaper.JOB_ENV) == (markers.OWNER_ENV, markers.JOB_ENV)
    assert reaper.V2_JOBS == fs.V2_JOBS
    assert reaper.KILL_WAIT_S == kill.KILL_WAIT_S
    assert reaper.SNAPSHOTS_LEAF == tracking.SNAPSHOTS_LEAF


def _limits_accepts(name: str) -> bool:
    try:
        limits.check_name("job_id", name)
        return True
    except limits.LimitError:
        return False


@given(
    st.text(alphabet="aZ09_.-/ \n\x00é", max_size=210)
    | st.sampled_from(["", ".", "..", "a" * 200, "a" * 201])
)
def test_job_name_rule_agrees_with_limits(name: str) -> None:
    # limits' regex ends in "$", which also matches before a final newline; the reaper is stricter
    # there (a job id never ends in one: terms.spec validates them first).
    expected = _limits_accepts(name) and not name.endswith("\n")
    assert reaper.valid_job(name) == expected


def _run(owner: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        reaper.command(owner, None) + list(extra),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={"PATH": os.environ.get("PATH", "")},
    )


def test_the_sidecar_runs_isolated_on_the_standard_library_only() -> None:
    proc = _run("unit-reaper-owner")
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"track 999999\n")  # a group that does not exist: nothing to kill
        proc.stdin.flush()
        time.sleep(0.2)  # it has started and read the line (what we check is that it *does not* load more)
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "site-packages" not in maps and "dist-packages" not in maps
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"-I" in cmdline and b"-S" in cmdline and b"elasticd.workers.proctree.reaper" in cmdline
        proc.send_signal(signal.SIGTERM)  # ignored: a stop aimed at the daemon must not take it first
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None and proc.stderr.read() == b""


def test_a_marked_process_dies_with_the_pipe_and_a_fenced_group_at_the_deadline() -> None:
    owner = f"unit-reaper-{os.getpid()}"
    env = dict(os.environ, **{markers.OWNER_ENV: owner, markers.JOB_ENV: "job-a"})
    marked = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    fenced = subprocess.Popen(["sleep", "60"], start_new_session=True)
    unrelated = subprocess.Popen(["sleep", "60"], start_new_session=True)
    proc = _run(owner)
    try:
        assert proc.stdin is not None
        proc.stdin.write(
            f"track {fenced.pid} job-b\ntrack {unrelated.pid}\nuntrack {unrelated.pid}\n".encode()
        )
        proc.stdin.write(f"deadline {time.monotonic() + 0.3:.3f}\n".encode())
        proc.stdin.flush()
        assert fenced.wait(10) == -signal.SIGKILL  # fenced: its job's marked processes (none) with it
        assert marked.poll() is None  # another job's: untouched by job-b's fence
        proc.stdin.close()  # the daemon is gone
        assert marked.wait(10) == -signal.SIGKILL
        assert proc.wait(10) == 0
        assert unrelated.poll() is None
    finally:
        for p in (marked, fenced, unrelated, proc):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_fence_takes_what_carries_its_groups_zygote_marker() -> None:
    """A warm worker's escapee carries its zygote's ``ELASTICD_JOB`` (``zygote-<random>``), not the
    job id: the fence of a group told that marker takes it, and no other zygote's."""
    owner = f"unit-reaper-z-{os.getpid()}"

    def marked(job: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ, **{markers.OWNER_ENV: owner, markers.JOB_ENV: job})
        return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)

    ours, theirs = marked("zygote-0a1b"), marked("zygote-2c3d")
    fenced = subprocess.Popen(["sleep", "60"], start_new_session=True)
    proc = _run(owner)
    try:
        assert proc.stdin is not None
        proc.stdin.write(f"track {fenced.pid} job-b zygote-0a1b\n".encode())
        proc.stdin.write(f"deadline {time.monotonic() + 0.3:.3f}\n".encode())
        proc.stdin.flush()
        assert fenced.wait(10) == -signal.SIGKILL and ours.wait(10) == -signal.SIGKILL
        assert theirs.poll() is None
        proc.stdin.close()
        assert theirs.wait(10) == -signal.SIGKILL and proc.wait(10) == 0
    finally:
        for p in (ours, theirs, fenced, proc):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_python_m_still_runs_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "elasticd.workers.proctree.reaper", "unit-reaper-m"],
        input=b"",
        timeout=30,
        check=False,
    )
    assert out.returncode == 0

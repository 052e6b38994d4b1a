"""elasticd.jobs.logdir: the job log tree is root's, and nothing a job plants is followed.

Each attack plants something where the next attempt's files go and checks that the target (a
root-only file) keeps its content, owner and mode, and that the daemon refuses with
LOG_DIR_UNSAFE (or, when reading, skips it).
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticd.errors import ConfigError
from elasticd.jobs import logdir, logread
from elasticd.jobs.logdir import Owner, create_attempt
from elasticd.terms.state import EndReason, SetupFailure

NOBODY = 65534
JOB = "job-1"
OWNER = Owner.of(NOBODY, NOBODY)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another uid"),
    pytest.mark.timeout(30),
]

Snapshot = tuple[bytes, int, int, int]


def snapshot(path: Path) -> Snapshot:
    st = path.stat()
    return path.read_bytes(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    return tmp_path / "logs"


@pytest.fixture
def secret(tmp_path: Path) -> Iterator[Path]:
    """A root-only file (0600) in a root-only directory (0700)."""
    d = tmp_path / "secret"
    d.mkdir(mode=0o700)
    f = d / "key"
    f.write_bytes(b"root only\n")
    f.chmod(0o600)
    before = snapshot(f)
    yield f
    assert snapshot(f) == before, "the target was touched"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == 0


def attempt(logs: Path, n: int = 0, ranks: tuple[int, ...] = (0,), owner: Owner = OWNER) -> list[Path]:
    files = create_attempt(logs, JOB, n, list(ranks), owner, "node-a")
    for f in files:
        os.close(f.log_fd)
    return [f.log_path for f in files]


def refused(logs: Path, n: int = 0, reason: EndReason = EndReason.LOG_DIR_UNSAFE) -> str:
    before = open_fds()
    with pytest.raises(SetupFailure) as info:
        attempt(logs, n)
    assert info.value.reason is reason
    assert open_fds() == before, "an fd leaked"
    return info.value.message


# -- a fresh tree ----------------------------------------------------------------------------------


def test_fresh_tree_is_root_0755_with_0600_files_of_the_submitter(logs: Path) -> None:
    files = create_attempt(logs, JOB, 0, [4, 5], OWNER, "node-a")
    try:
        os.write(files[0].log_fd, b"hello\n")
    finally:
        for f in files:
            os.close(f.log_fd)
    for d in (logs, logs / JOB, logs / JOB / "attempt_0"):
        st = d.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755), d
    for f in files:
        for path in (f.log_path, f.error_path):
            st = path.lstat()
            assert stat.S_ISREG(st.st_mode)
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o600), path
        assert f.error_path.read_bytes() == b""
    assert [f.log_path.name for f in files] == ["rank_4.log", "rank_5.log"]
    assert files[0].log_path.read_bytes() == b"hello\n"


def test_log_group_makes_files_0640_to_that_group(logs: Path) -> None:
    (path,) = attempt(logs, owner=Owner.of(NOBODY, NOBODY, log_gid=4242))
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, 4242, 0o640)


def test_directories_are_0755_whatever_the_umask(logs: Path) -> None:
    old = os.umask(0o077)
    try:
        attempt(logs)
    finally:
        os.umask(old)
    assert stat.S_IMODE((logs / JOB / "attempt_0").stat().st_mode) == 0o755


def test_a_restarted_daemon_reuses_the_submitters_files(logs: Path) -> None:
    (log,) = attempt(logs)
    log.write_bytes(b"before\n")
    error = log.with_name("rank_0.error.json")
    error.write_bytes(b'{"message": "stale"}')
    os.chown(error, NOBODY, NOBODY)
    os.chown(log, NOBODY, NOBODY)
    os.chmod(log, 0o604)  # the user's own choice: kept
    files = create_attempt(logs, JOB, 0, [0], OWNER, "node-a")
    os.write(files[0].log_fd, b"after\n")
    os.close(files[0].log_fd)
    assert log.read_bytes() == b"before\nafter\n"
    assert stat.S_IMODE(log.stat().st_mode) == 0o604
    assert error.read_bytes() == b""


def test_log_group_names_resolve() -> None:
    assert logdir.log_group_gid(None) is None
    assert logdir.log_group_gid("root") == 0
    assert logdir.log_group_gid("123") == 123
    with pytest.raises(ConfigError):
        logdir.log_group_gid("no-such-group-here")


# -- planted links and foreign entries -------------------------------------------------------------


@pytest.mark.parametrize("where", ["job", "attempt"])
def test_a_symlinked_directory_is_refused(logs: Path, secret: Path, where: str) -> None:
    attempt(logs, 0)
    link = logs / JOB if where == "job" else logs / JOB / "attempt_1"
    if where == "job":
        os.rename(logs / JOB, logs / "old")
    os.symlink(secret.parent, link)
    assert "symbolic link" in refused(logs, 1)
    assert sorted(os.listdir(secret.parent)) == ["key"]


@pytest.mark.parametrize("name", ["rank_0.log", "rank_0.error.json"])
def test_a_symlinked_file_is_refused(logs: Path, secret: Path, name: str) -> None:
    attempt(logs, 0)
    target = logs / JOB / "attempt_0" / name
    target.unlink()
    os.symlink(secret, target)
    assert str(target) in refused(logs, 0)


def test_a_hard_link_is_refused(logs: Path, secret: Path) -> None:
    attempt(logs, 0)
    target = logs / JOB / "attempt_0" / "rank_0.log"
    target.unlink()
    os.link(secret, target)
    os.chown(secret, NOBODY, NOBODY)  # even one the submitter owns: two names, one inode
    try:
        assert "2 hard links" in refused(logs, 0)
    finally:
        os.chown(secret, 0, 0)


def test_a_fifo_is_refused_without_blocking(logs: Path) -> None:
    attempt(logs, 0)
    target = logs / JOB / "attempt_0" / "rank_0.log"
    target.unlink()
    os.mkfifo(target)
    refused(logs, 0)


def test_an_existing_file_of_someone_else_is_refused(logs: Path) -> None:
    attempt(logs, 0)
    target = logs / JOB / "attempt_0" / "rank_0.log"
    target.unlink()
    target.write_bytes(b"root's\n")
    target.chmod(0o600)
    before = snapshot(target)
    assert "owned by uid 0" in refused(logs, 0)
    assert snapshot(target) == before


@pytest.mark.parametrize("which", ["root", "job", "attempt"])
def test_a_directory_of_another_uid_is_refused(logs: Path, which: str) -> None:
    attempt(logs, 0)
    d = {"root": logs, "job": logs / JOB, "attempt": logs / JOB / "attempt_0"}[which]
    os.chown(d, NOBODY, NOBODY)
    assert f"owned by uid {NOBODY}" in refused(logs, 0)
    assert d.stat().st_uid == NOBODY


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
def test_a_group_or_other_writable_directory_is_refused(logs: Path, mode: int) -> None:
    attempt(logs, 0)
    (logs / JOB).chmod(mode)
    assert "writable" in refused(logs, 1)
    assert not (logs / JOB / "attempt_1").exists()


def test_only_the_operators_symlinks_lead_to_the_log_root(tmp_path: Path, secret: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "byroot")
    attempt(tmp_path / "byroot" / "logs")  # root's own link: the operator's choice
    assert (tmp_path / "real" / "logs" / JOB / "attempt_0" / "rank_0.log").exists()
    os.symlink(secret.parent, tmp_path / "bynobody")
    os.chown(tmp_path / "bynobody", NOBODY, NOBODY, follow_symlinks=False)
    assert "symbolic link of uid 65534" in refused(tmp_path / "bynobody")
    assert "symbolic link of uid 65534" in refused(tmp_path / "bynobody" / "logs")


def test_an_ancestor_writable_by_everyone_is_refused(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    assert "writable by everyone" in refused(tmp_path / "open" / "logs")
    (tmp_path / "open").chmod(0o1777)  # sticky, like /tmp: others cannot replace our entries
    attempt(tmp_path / "open" / "logs")


# -- reading ---------------------------------------------------------------------------------------


def test_reads_skip_links_fifos_and_names_that_leave_the_tree(logs: Path, secret: Path) -> None:
    (log,) = attempt(logs, 0)
    log.write_bytes(b"0123456789\n")
    d = logs / JOB / "attempt_0"
    os.symlink(secret, d / "rank_1.log")
    os.mkfifo(d / "rank_2.log")
    parts = (JOB, "attempt_0")
    assert logread.read_range(logs, (*parts, "rank_0.log"), 2, 3) == b"234"
    assert logread.read_tail(logs, (*parts, "rank_0.log"), 4) == b"789\n"
    assert logread.read_range(logs, (*parts, "rank_1.log"), 0, 100) is None
    assert logread.read_range(logs, (*parts, "rank_2.log"), 0, 100) is None
    assert logread.read_tail(logs, (*parts, "rank_1.log"), 100) == b""
    assert logread.read_small(logs, ("..", "secret", "key")) == b""
    assert logread.read_small(logs / JOB, ("..", JOB, "attempt_0", "rank_0.log")) == b""
    assert sorted(logread.list_dir(logs, parts)) == [
        "rank_0.error.json",
        "rank_0.log",
        "rank_1.log",
        "rank_2.log",
    ]
    assert logread.list_dir(logs, ("nope",)) == []


# -- a full disk -----------------------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs with few inodes (tmpfs directories and empty files take no blocks)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=16,mode=0755", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10, check=False)


def fill(mnt: Path) -> None:
    fd = os.open(mnt / "blocks", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError):
            while True:
                os.write(fd, b"x" * 4096)
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        for i in range(1000):
            (mnt / f"inode{i}").touch()


def test_no_space_for_a_directory_is_log_disk_full(tiny_fs: Path) -> None:
    assert not logdir.log_disk_full(tiny_fs)
    fill(tiny_fs)
    assert logdir.log_disk_full(tiny_fs)
    message = refused(tiny_fs / "logs", 0, EndReason.LOG_DISK_FULL)
    assert message == f"no space left for job logs in {tiny_fs} on node node-a"


def test_no_space_for_a_file_is_log_disk_full(tiny_fs: Path) -> None:
    attempt(tiny_fs / "logs", 0)
    (tiny_fs / "logs" / JOB / "attempt_1").mkdir()
    fill(tiny_fs)
    message = refused(tiny_fs / "logs", 1, EndReason.LOG_DISK_FULL)
    assert f"in {tiny_fs / 'logs' / JOB / 'attempt_1'} on node node-a" in message


def test_a_missing_log_dir_is_not_full(tmp_path: Path) -> None:
    assert not logdir.log_disk_full(tmp_path / "nope")
    assert not logdir.log_disk_full(tmp_path)


def test_over_quota_when_handing_a_file_over_is_log_disk_full(
    logs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempt(logs, 0)

    def over_quota(fd: int, uid: int, gid: int) -> None:
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(os, "fchown", over_quota)
    refused(logs, 1, EndReason.LOG_DISK_FULL)
    assert os.listdir(logs / JOB / "attempt_1") == []  # no root-owned leftover to trip the next try


def test_remove_job_deletes_the_tree_and_never_follows_a_planted_link(tmp_path: Path) -> None:
    from elasticd.jobs.logdir import remove_job

    root = tmp_path / "logs"
    job = root / "job-1" / "attempt_0"
    job.mkdir(parents=True)
    (job / "rank_0.log").write_text("x")
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    (job / "evil").symlink_to(outside)  # a job tries to have root delete what the link points to
    assert remove_job(root, "job-1")
    assert not (root / "job-1").exists() and (outside / "keep").read_text() == "keep"
    assert not remove_job(root, "job-1") and not remove_job(root, "../precious")
    assert (outside / "keep").exists()


def test_remove_job_finishes_when_another_removal_takes_parts_of_the_tree_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rm`` and the sweep of logs with no records may remove one tree at once: each entry the
    other removed first is gone, and neither fails (a failure here once stopped the daemon)."""
    from elasticd.jobs.logdir import remove_job

    root = tmp_path / "logs"
    for attempt in range(2):
        (root / "job-1" / f"attempt_{attempt}").mkdir(parents=True)
        (root / "job-1" / f"attempt_{attempt}" / "rank_0.log").write_text("x")
    real_unlink, real_rmdir = os.unlink, os.rmdir

    def other_removal_first(real: Any) -> Any:
        def call(path: Any, *, dir_fd: int | None = None) -> None:
            real(path, dir_fd=dir_fd)  # the other removal
            real(path, dir_fd=dir_fd)  # this one: FileNotFoundError

        return call

    monkeypatch.setattr(os, "unlink", other_removal_first(real_unlink))
    monkeypatch.setattr(os, "rmdir", other_removal_first(real_rmdir))
    assert remove_job(root, "job-1")
    monkeypatch.undo()
    assert not (root / "job-1").exists()

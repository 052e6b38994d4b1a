"""workers.cgroups.tracking against a fake unified hierarchy, and the fallback where there is none."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from elasticd.terms.ids import valid_job_id
from elasticd.workers.cgroups.fs import V2_DAEMON, V2_JOBS, KernelFs
from elasticd.workers.cgroups.kill import kill_cgroup, members
from elasticd.workers.cgroups.tracking import (
    POOL_LEAF,
    CgroupJob,
    CgroupTracker,
    NoTracker,
    Tracker,
    detect,
)
from elasticd.workers.group import ColdSpawner, Launch, WorkerGroup
from elasticd.workers.proctree import markers
from tests.fakes import NoReaper


class FakeUnified(KernelFs):
    """Plain directories standing in for a v2 hierarchy without controllers.

    mkdir makes ``cgroup.procs`` (and ``cgroup.kill`` unless ``killable`` is False); rmdir is
    EBUSY while processes or children remain; a pid written to a ``cgroup.procs`` leaves every
    other; ``cgroup.events`` says whether the subtree holds a pid; writing "1" to ``cgroup.kill``
    empties the subtree but for the ``stubborn`` pids, and records what it killed.
    """

    def __init__(self, root: Path, *, killable: bool = True, deny: str = "") -> None:
        self.root = root
        self.killable = killable
        self.deny = deny
        self.stubborn: set[str] = set()
        self.killed: list[str] = []
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.procs").write_text("")

    def mkdir(self, path: Path) -> None:
        if self.deny and self.deny in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        super().mkdir(path)
        (path / "cgroup.procs").write_text("")
        if self.killable:
            (path / "cgroup.kill").write_text("")

    def rmdir(self, path: Path) -> None:
        if not path.is_dir():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        if pids(path) or any(p.is_dir() for p in path.iterdir()):
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        for f in path.iterdir():
            f.unlink()
        os.rmdir(path)

    def read(self, path: Path) -> str:
        if path.name == "cgroup.events" and path.parent.is_dir():
            return f"populated {int(bool(subtree(path.parent)))}\nfrozen 0\n"
        return super().read(path)

    def write(self, path: Path, text: str) -> None:
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        if path.name == "cgroup.kill" and text == "1":
            for procs in path.parent.rglob("cgroup.procs"):
                left = [p for p in pids(procs.parent) if p in self.stubborn]
                self.killed += [p for p in pids(procs.parent) if p not in self.stubborn]
                procs.write_text("".join(f"{p}\n" for p in left))
        elif path.name == "cgroup.procs":
            for other in self.root.rglob("cgroup.procs"):
                other.write_text("".join(f"{p}\n" for p in pids(other.parent) if p != text))
            path.write_text("".join(f"{p}\n" for p in [*pids(path.parent), text]))
        else:
            path.write_text(text)


def pids(cgroup: Path) -> list[str]:
    return (cgroup / "cgroup.procs").read_text().split()


def subtree(cgroup: Path) -> list[str]:
    return [p for procs in sorted(cgroup.rglob("cgroup.procs")) for p in pids(procs.parent)]


def host(tmp_path: Path, own: str = "/", v2: bool = True) -> tuple[Path, Path]:
    """mountinfo and /proc/self/cgroup of a hybrid host (v1 memory, v2 at ``unified``, or none)."""
    mounts = [f"/ {tmp_path}/memory rw,relatime - cgroup cgroup rw,memory"]
    if v2:
        mounts.append(f"/ {tmp_path}/unified rw,relatime - cgroup2 cgroup2 rw")
    (tmp_path / "mountinfo").write_text("".join(f"1 0 0:1 {m}\n" for m in mounts))
    (tmp_path / "cgroup").write_text(f"4:memory:/\n0::{own}\n")
    return tmp_path / "mountinfo", tmp_path / "cgroup"


def detect_on(tmp_path: Path, fs: FakeUnified, own: str = "/", v2: bool = True) -> Tracker:
    mountinfo, proc_cgroup = host(tmp_path, own, v2)
    return detect(instance="node-1", mountinfo=mountinfo, proc_cgroup=proc_cgroup, fs=fs)


@pytest.fixture
def fs(tmp_path: Path) -> FakeUnified:
    return FakeUnified(tmp_path / "unified")


@pytest.fixture
def tracker(tmp_path: Path, fs: FakeUnified) -> CgroupTracker:
    found = detect_on(tmp_path, fs)
    assert isinstance(found, CgroupTracker)
    return found


# --- detection ------------------------------------------------------------------------------------


def test_detect_uses_the_unified_hierarchy_without_controllers(
    tmp_path: Path, tracker: CgroupTracker
) -> None:
    assert tracker.base == tmp_path / "unified" / V2_JOBS / "node-1"
    assert [p.name for p in tracker.base.iterdir() if p.is_dir()] == []  # the probe is gone


def test_detect_puts_jobs_beside_a_daemon_moved_into_its_leaf(tmp_path: Path, fs: FakeUnified) -> None:
    fs.mkdir(tmp_path / "unified" / "svc")
    fs.mkdir(tmp_path / "unified" / "svc" / V2_DAEMON)
    found = detect_on(tmp_path, fs, own=f"/svc/{V2_DAEMON}")
    assert found.base == tmp_path / "unified" / "svc" / V2_JOBS / "node-1"


@pytest.mark.parametrize("why", ["no v2", "no cgroup.kill", "not permitted", "unreadable"])
def test_detect_falls_back_and_leaves_nothing(tmp_path: Path, why: str) -> None:
    fs = FakeUnified(
        tmp_path / "unified", killable=why != "no cgroup.kill", deny="node-1" * (why == "not permitted")
    )
    if why == "unreadable":
        found = detect(mountinfo=tmp_path / "absent", proc_cgroup=tmp_path / "absent", fs=fs)
    else:
        found = detect_on(tmp_path, fs, v2=why != "no v2")
    assert isinstance(found, NoTracker) and found.base is None
    assert not (tmp_path / "unified" / V2_JOBS).exists()
    job = found.job("job-1")
    assert job.join(0) is None and job.kill() == []
    job.close()
    assert found.sweep() == ()


# --- one job ---------------------------------------------------------------------------------------


def test_join_opens_the_leaf_the_child_writes_to(tracker: CgroupTracker) -> None:
    job = tracker.job("job-1")
    fd = job.join(3)
    assert fd is not None
    try:
        os.write(fd, b"0")  # what the child does; the fake records it as it is
    finally:
        os.close(fd)
    assert pids(tracker.base / "job-1" / "rank_3") == ["0"]


def test_join_skips_a_leaf_the_limits_already_joined(tracker: CgroupTracker) -> None:
    job = tracker.job("job-1")
    assert job.join(0, (tracker.base / "job-1" / "rank_0",)) is None
    assert not (tracker.base / "job-1" / "rank_0").exists()


def test_join_clears_a_leftover_leaf(tracker: CgroupTracker, fs: FakeUnified) -> None:
    job = tracker.job("job-1")
    os.close(job.join(0) or -1)
    fs.write(tracker.base / "job-1" / "rank_0" / "cgroup.procs", "41")
    fd = job.join(0)
    assert fd is not None
    os.close(fd)
    assert fs.killed == ["41"] and pids(tracker.base / "job-1" / "rank_0") == []


def test_kill_takes_every_rank_then_close_removes_the_job(tracker: CgroupTracker, fs: FakeUnified) -> None:
    job = tracker.job("job-1")
    for rank, pid in ((0, "10"), (1, "11")):
        os.close(job.join(rank) or -1)
        fs.write(tracker.base / "job-1" / f"rank_{rank}" / "cgroup.procs", pid)
    assert job.kill() == []
    assert sorted(fs.killed) == ["10", "11"]
    job.close()
    assert not (tracker.base / "job-1").exists() and tracker.base.is_dir()


def test_kill_reports_what_survives_the_bounded_wait(tracker: CgroupTracker, fs: FakeUnified) -> None:
    job = tracker.job("job-1")
    os.close(job.join(0) or -1)
    fs.write(tracker.base / "job-1" / "rank_0" / "cgroup.procs", "12")
    fs.stubborn.add("12")
    slept: list[float] = []
    assert not kill_cgroup(fs, job.path, wait_s=0.05, sleep=slept.append)
    assert slept and max(slept) <= 0.05  # it polled, with short naps
    assert members(fs, job.path) == [12]
    job.close()  # busy: kept (and logged) rather than raising
    assert (tracker.base / "job-1" / "rank_0").is_dir()


def test_a_missing_cgroup_is_already_dead(tmp_path: Path, fs: FakeUnified) -> None:
    assert kill_cgroup(fs, tmp_path / "unified" / "nope")
    CgroupJob(fs, tmp_path / "unified" / "nope").close()


def test_bad_job_ids_never_become_paths(tracker: CgroupTracker) -> None:
    for bad in ("..", "a/b", "", "cgroup.kill/x"):
        with pytest.raises(Exception, match="cannot name a cgroup"):
            tracker.job(bad)


# --- what a crashed predecessor left, and a clean stop ------------------------------------------


def test_sweep_kills_and_removes_every_job_and_release_the_levels(
    tmp_path: Path, tracker: CgroupTracker, fs: FakeUnified
) -> None:
    for job_id, pid in (("job-1", "20"), ("job-2", "21")):
        job = tracker.job(job_id)
        os.close(job.join(0) or -1)
        fs.write(job.path / "rank_0" / "cgroup.procs", pid)
    assert sorted(p.name for p in tracker.sweep()) == ["job-1", "job-2"]
    assert sorted(fs.killed) == ["20", "21"]
    tracker.release()
    assert not (tmp_path / "unified" / V2_JOBS).exists()


def test_the_pools_leaf_holds_parked_zygotes_and_goes_with_the_base(
    tmp_path: Path, tracker: CgroupTracker, fs: FakeUnified
) -> None:
    """Parked zygotes (warm.pool) live in ``<base>/_zygotes``, which no job id can name; the pool's
    close kills and removes it, and so does a restarted daemon's sweep of the base."""
    for bad in (POOL_LEAF, "_probe-1"):
        assert not valid_job_id(bad)
    fd = tracker.pool_procs()
    try:
        os.write(fd, b"30")
    finally:
        os.close(fd)
    assert pids(tracker.base / POOL_LEAF) == ["30"]
    tracker.drop_pool()
    assert fs.killed == ["30"] and not (tracker.base / POOL_LEAF).exists()
    os.close(tracker.pool_procs())
    fs.write(tracker.base / POOL_LEAF / "cgroup.procs", "31")
    assert [p.name for p in tracker.sweep()] == [POOL_LEAF] and fs.killed == ["30", "31"]
    tracker.release()
    assert not (tmp_path / "unified" / V2_JOBS).exists()


def test_release_keeps_the_shared_level_another_daemon_uses(tmp_path: Path, tracker: CgroupTracker) -> None:
    other = detect(
        instance="node-2", mountinfo=tmp_path / "mountinfo", proc_cgroup=tmp_path / "cgroup", fs=tracker._fs
    )
    tracker.release()
    assert other.base is not None and other.base.is_dir() and not tracker.base.exists()
    other.release()
    assert not (tmp_path / "unified" / V2_JOBS).exists()


# --- the group with either kind of tracking, real processes --------------------------------------

# An orphan in a session of its own (not a descendant, not in the worker's group): only the
# environment marker it keeps finds it.
FORK_ESCAPEE = (
    "import os, subprocess, sys, time\n"
    "env = dict(os.environ, ELASTICD_JOB=sys.argv[2]) if sys.argv[2:] else None\n"  # a zygote's marker
    "sh = subprocess.run(['/bin/sh', '-c', 'sleep 1000 >/dev/null 2>&1 & echo $!'], start_new_session=True,\n"
    "                    env=env, capture_output=True, text=True)\n"
    "open(sys.argv[1], 'w').write(sh.stdout.strip())\n"
    "time.sleep(1000)\n"
)


class _MarkedSpawner(ColdSpawner):
    """As a zygote's ``WarmSpawner``: its workers' processes may carry the zygote's own marker."""

    def markers(self) -> frozenset[str]:
        return frozenset({"zygote-0a1b"})


def _run_group(tmp_path: Path, tracker: Tracker, marker: str = "") -> tuple[int, list[int]]:
    """Start one worker that leaves a marked escapee in a new session, stop it; (escapee, stuck).
    ``marker``: the escapee's ``ELASTICD_JOB`` is that of the group's zygote instead of the job's."""
    pid_file = tmp_path / "escapee"
    log_fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    env = dict(os.environ, **{markers.OWNER_ENV: f"unit-{os.getpid()}", markers.JOB_ENV: "job-1"})
    argv = (sys.executable, "-c", FORK_ESCAPEE, str(pid_file), *([marker] if marker else []))
    launch = Launch(0, 0, argv, env, str(tmp_path), log_fd, tmp_path / "log", tmp_path / "error.json")

    async def run() -> tuple[int, list[int]]:
        spawner = _MarkedSpawner() if marker else None
        group = WorkerGroup([launch], NoReaper(), 5.0, tracking=tracker.job("job-1"), spawner=spawner)  # type: ignore[arg-type]
        await group.start()
        try:
            for _ in range(600):
                if pid_file.exists() and pid_file.read_text():
                    break
                await asyncio.sleep(0.05)
            escapee = int(pid_file.read_text())
            assert os.getsid(escapee) != group.workers[0].pid
        finally:
            stuck = await group.stop()
        return escapee, stuck

    return asyncio.run(run())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("marker", ["", "zygote-0a1b"])
def test_without_v2_the_fallback_still_stops_a_marked_escapee(tmp_path: Path, marker: str) -> None:
    fs = FakeUnified(tmp_path / "unified")
    tracker = detect_on(tmp_path, fs, v2=False)
    assert isinstance(tracker, NoTracker)
    escapee, stuck = _run_group(tmp_path, tracker, marker)
    try:
        assert stuck == [] and _gone(escapee)
    finally:
        if not _gone(escapee):
            os.kill(escapee, signal.SIGKILL)


def test_the_worker_joins_through_the_parents_fd_and_the_stop_kills_and_removes(
    tmp_path: Path, tracker: CgroupTracker, fs: FakeUnified
) -> None:
    escapee, stuck = _run_group(tmp_path, tracker)
    try:
        assert stuck == [] and _gone(escapee)
        assert fs.killed == ["0"]  # the child wrote "0" to the leaf its parent opened; stop killed it
        assert not (tracker.base / "job-1").exists()
    finally:
        if not _gone(escapee):
            os.kill(escapee, signal.SIGKILL)

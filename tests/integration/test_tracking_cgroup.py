"""No escapees: what a worker leaves behind, out of its session and without its environment, dies with it.

A worker (tests/scripts/escaper.py) leaves a ``sleep`` that none of the fallback's ways can find:
double-forked (not a descendant), ``setsid`` (not in the worker's process group), ``env -i`` (no
ELASTICD_* marker). Only the job's tracking cgroup holds it. Each test checks that it did escape
the fallback and is in the cgroup, then that it dies when the job's workers are stopped, each way
they can be. Runs where this host has a unified hierarchy with ``cgroup.kill`` that root may use.
"""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

import psutil
import pytest

from elasticd.workers.cgroups import tracking
from elasticd.workers.cgroups.fs import V2_JOBS, KernelFs
from elasticd.workers.cgroups.hierarchy import own_dir, parse_mountinfo, parse_proc_cgroup
from elasticd.workers.cgroups.kill import remove_tree
from elasticd.workers.proctree import markers
from elasticd.workers.proctree.reaper import Reaper
from tests.conftest import DaemonFactory
from tests.support import REPO, DaemonProc, alive_pid, wait_for, wait_log

pytestmark = [pytest.mark.root, pytest.mark.timeout(180), pytest.mark.slow]

ESCAPER = REPO / "tests" / "scripts" / "escaper.py"


@pytest.fixture(autouse=True)
def _tracking_host() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups")
    probe = tracking.detect(instance=f"probe-{os.getpid()}-{secrets.token_hex(3)}")
    probe.release()
    if probe.base is None:
        pytest.skip("no unified cgroup hierarchy with cgroup.kill here")


def v2_cgroup(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))


def escapee(out: Path, attempt: int, rank: int = 0) -> tuple[int, int]:
    """The escaped process's pid, and its worker's, once the worker wrote them."""
    path = out / f"escapee.{attempt}.{rank}"
    wait_for(path.exists, 60, what=f"worker {attempt}.{rank} to leave its escapee")
    pid, worker = (int(x) for x in path.read_text().split())
    return pid, worker


def assert_escaped_all_but_the_cgroup(pid: int, worker: int, node: str, job_id: str) -> None:
    proc = psutil.Process(pid)
    # The worker leads its own session and group (sid = pgid = its pid), whether or not it still runs.
    assert os.getsid(pid) not in (worker, os.getsid(0)) and os.getpgid(pid) != worker
    assert markers.OWNER_ENV not in proc.environ() and proc.ppid() != worker
    assert f"/elasticd.jobs/{node}/{job_id}/rank_" in v2_cgroup(pid)


def wait_dead(pid: int, what: str) -> None:
    wait_for(lambda: not alive_pid(pid), 15, what=what)


def submit(d: DaemonProc, out: Path, mode: str, *flags: str) -> str:
    env = dict(os.environ, OUT=str(out), MODE=mode)
    res = d.ctl("submit", *flags, str(ESCAPER), env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[0]


def instance_cgroup_gone(d: DaemonProc) -> bool:
    """The daemon's ``<own>/elasticd.jobs/<node>`` (it shares this process's v2 cgroup)."""
    own = own_dir(
        parse_mountinfo(Path("/proc/self/mountinfo").read_text()),
        parse_proc_cgroup(Path("/proc/self/cgroup").read_text()),
        None,
    )
    return own is not None and not (own / V2_JOBS / d.node_id).exists()


def test_kill_takes_the_escapee(daemon: DaemonProc, tmp_path: Path) -> None:
    job_id = submit(daemon, tmp_path, "sleep", "--nproc-per-node", "2")
    found = [escapee(tmp_path, 0, rank) for rank in (0, 1)]
    for pid, worker in found:
        assert_escaped_all_but_the_cgroup(pid, worker, daemon.node_id, job_id)
    res = daemon.ctl("kill", job_id)
    assert res.returncode == 0, res.stderr
    for pid, _ in found:
        wait_dead(pid, "the escapee to die with the killed job")
    daemon.stop()
    assert instance_cgroup_gone(daemon)


def test_the_jobs_end_takes_the_escapee(daemon: DaemonProc, tmp_path: Path) -> None:
    job_id = submit(daemon, tmp_path, "exit")
    pid, worker = escapee(tmp_path, 0)
    assert_escaped_all_but_the_cgroup(pid, worker, daemon.node_id, job_id)
    assert daemon.wait_state(job_id, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
    wait_dead(pid, "the escapee to die once the job succeeded")


def test_a_restart_takes_the_previous_attempts_escapee(daemon: DaemonProc, tmp_path: Path) -> None:
    job_id = submit(daemon, tmp_path, "fail-first", "--max-restarts", "1")
    first, worker = escapee(tmp_path, 0)
    assert_escaped_all_but_the_cgroup(first, worker, daemon.node_id, job_id)
    second, _ = escapee(tmp_path, 1)  # the next attempt started: the first one's workers were stopped
    wait_dead(first, "the first attempt's escapee to die at the restart")
    assert alive_pid(second) and daemon.job(job_id)["state"] == "RUNNING"
    assert daemon.ctl("kill", job_id).returncode == 0
    wait_dead(second, "the second attempt's escapee to die with the killed job")


def test_the_reaper_takes_the_escapee_when_the_daemon_is_killed(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    d = daemon_factory(None)
    job_id = submit(d, tmp_path, "sleep")
    pid, worker = escapee(tmp_path, 0)
    assert_escaped_all_but_the_cgroup(pid, worker, d.node_id, job_id)
    d.kill9()
    wait_dead(pid, "the reaper to kill the escapee")
    wait_for(lambda: instance_cgroup_gone(d), 15, what="the reaper to remove the daemon's cgroups")


def test_recovery_takes_what_a_crashed_daemon_and_its_reaper_left(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    d = daemon_factory(None)
    job_id = submit(d, tmp_path, "sleep")
    pid, worker = escapee(tmp_path, 0)
    assert_escaped_all_but_the_cgroup(pid, worker, d.node_id, job_id)
    assert d.proc is not None
    reapers = [
        p for p in psutil.Process(d.proc.pid).children() if "elasticd.workers.proctree.reaper" in p.cmdline()
    ]
    assert len(reapers) == 1
    reapers[0].kill()
    wait_for(lambda: not alive_pid(reapers[0].pid), 15, what="the reaper to die")  # the daemon's zombie
    d.kill9()
    wait_for(lambda: not alive_pid(worker), 15, what="the worker to die with its daemon (death signal)")
    assert alive_pid(pid)  # nothing left could find it: only the next daemon's sweep
    d.start()
    wait_dead(pid, "recovery to kill the escapee")
    assert d.events("recover.swept")
    assert d.wait_state(job_id, ("RUNNING",), 30)["restarts"] == 1
    assert d.ctl("kill", job_id).returncode == 0


def test_recovery_takes_a_parked_zygote_that_outlived_its_daemon_and_reaper(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """A parked zygote whose preload cleared its parent-death signal, stuck (stopped: it would
    otherwise leave at its control socket's end), its daemon and reaper killed: it lives on in the
    pool's cgroup until the next daemon's recovery, which leaves nothing."""
    (tmp_path / "keepalive.py").write_text(
        "import ctypes\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0\n"
    )
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    d = daemon_factory(None)
    res = d.ctl("submit", "--preload", "keepalive", str(script))
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.split()[0]
    assert d.wait_state(job_id, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    pid = wait_log(d, "zygote.parked", job=job_id)["pid"]
    assert v2_cgroup(pid).endswith(f"/elasticd.jobs/{d.node_id}/{tracking.POOL_LEAF}")
    assert d.proc is not None
    reapers = [
        p for p in psutil.Process(d.proc.pid).children() if "elasticd.workers.proctree.reaper" in p.cmdline()
    ]
    reapers[0].kill()
    wait_for(lambda: not alive_pid(reapers[0].pid), 15, what="the reaper to die")
    os.kill(pid, signal.SIGSTOP)
    d.kill9()
    assert alive_pid(pid)  # no death signal, no reaper: only the next daemon can take it
    d.start()
    wait_dead(pid, "recovery to kill the parked zygote")
    assert not d.leftovers()
    d.stop()
    assert instance_cgroup_gone(d)


def test_the_reapers_fence_takes_the_jobs_cgroup_but_its_keeper(tmp_path: Path) -> None:
    """The fence, without a cluster: the real sidecar, told a fenced job and a deadline now past.
    The job's snapshot keeper trains nothing and holds what the node resumes from: the fence spares
    it, and it goes when the daemon does."""
    node = f"fence-{secrets.token_hex(3)}"
    tracker = tracking.detect(instance=node)
    assert tracker.base is not None
    job = tracker.job("fenced-job")
    assert isinstance(job, tracking.CgroupJob)

    def sleeper_in(fd: int | None) -> psutil.Popen:
        assert fd is not None
        proc = psutil.Popen(
            ["/bin/sleep", "1000"], preexec_fn=lambda: os.write(fd, b"0"), start_new_session=True
        )
        os.close(fd)
        return proc

    sleeper, keeper = sleeper_in(job.join(0)), sleeper_in(job.join_snapshots())
    reaper = Reaper(node, tracker.base)
    try:
        reaper.start()
        assert "/fenced-job/rank_0" in v2_cgroup(sleeper.pid)
        assert f"/fenced-job/{tracking.SNAPSHOTS_LEAF}" in v2_cgroup(keeper.pid)
        reaper.track(keeper.pid)
        # Only the cgroup can find it: it carries no marker, and the group told is a finished one's.
        gone = psutil.Popen(["/bin/true"])
        gone.wait()
        reaper.track(gone.pid, "fenced-job")
        reaper.set_deadline(0.001)  # CLOCK_MONOTONIC long past
        sleeper.wait(15)
        assert sleeper.returncode == -signal.SIGKILL
        assert keeper.is_running() and keeper.status() != psutil.STATUS_ZOMBIE
        reaper.close()  # the daemon is gone
        keeper.wait(15)
        assert keeper.returncode == -signal.SIGKILL
    finally:
        for proc in (sleeper, keeper):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reaper.close()
        remove_tree(KernelFs(), job.path)
        tracker.release()
    assert not tracker.base.exists()

"""Parked zygotes, with real daemons and real workers: the next identical job adopts the previous
one's zygote (same pid, ``zygote.adopted``) and its workers are still indistinguishable from cold
ones; a job that differs in anything, or is another user's, starts its own; an edited preload
module makes a parked zygote stale, as does an edit that lets a script reach torch; a parked
zygote expires, stops with its daemon, and dies with a killed one, leaving nothing behind."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from elasticd.workers.cgroups.tracking import POOL_LEAF
from tests.conftest import DaemonFactory
from tests.integration.test_zygote import assert_like_cold, run_contract, spawned_modes
from tests.support import DaemonProc, alive_pid, log_events, submit_job, wait_for, wait_log
from tests.users import NOBODY, SYSTEM_PYTHON, as_user, other_users, public_daemon, public_dir, public_workdir

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(300), pytest.mark.slow]
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def v2_cgroup(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "")


def tracked(d: DaemonProc) -> bool:
    return bool(log_events(d, "tracking.backend", backend="cgroup2"))


def pool_cgroup(d: DaemonProc) -> Path | None:
    """``<own>/elasticd.jobs/<node>/_zygotes`` where the daemon tracks in cgroups (it shares ours)."""
    event = next(iter(log_events(d, "tracking.backend", backend="cgroup2")), None)
    return None if event is None else Path(event["cgroup"]) / POOL_LEAF


def test_an_identical_job_adopts_the_parked_zygote(daemon: DaemonProc, tmp_path: Path) -> None:
    out = tmp_path / "out"  # the same OUT: the same environment, so the same zygote
    first_job, _ = run_contract(daemon, out)
    parked = wait_log(daemon, "zygote.parked", job=first_job)
    assert parked["rss"] > 0
    if tracked(daemon):
        assert v2_cgroup(parked["pid"]).endswith(f"/{daemon.node_id}/_zygotes"), v2_cgroup(parked["pid"])
    shutil.move(out, tmp_path / "first")
    job, warm = run_contract(daemon, out)
    adopted = wait_log(daemon, "zygote.adopted", job=job)
    assert (adopted["pid"], adopted["from_job"]) == (parked["pid"], first_job)
    assert not log_events(daemon, "zygote.spawned", job=job), "started a zygote besides the adopted one"
    assert {r["ppid"] for r in warm.values()} == {parked["pid"]}, "not forked from the adopted zygote"
    assert spawned_modes(daemon, job) == ["warm", "warm"]
    _, cold = run_contract(daemon, tmp_path / "cold", "--no-warm")
    assert_like_cold(daemon, warm, cold)
    again = wait_log(daemon, "zygote.parked", job=job)  # parked again, once this job is done here
    assert again["pid"] == parked["pid"]


def test_a_job_that_differs_in_env_or_cwd_starts_its_own(daemon: DaemonProc, tmp_path: Path) -> None:
    script = str(SCRIPTS / "fresh_contract.py")
    first = submit_job(daemon, tmp_path, script)
    assert daemon.wait_state(first, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    parked = wait_log(daemon, "zygote.parked", job=first)
    other_env = submit_job(daemon, tmp_path, script, env={"SOMETHING_ELSE": "1"})
    wait_log(daemon, "zygote.spawned", 60, job=other_env)  # decided: a zygote of its own
    assert daemon.wait_state(other_env, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = daemon.ctl("submit", script, env=dict(os.environ, OUT=str(tmp_path)), cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    other_cwd = res.stdout.split()[0]
    wait_log(daemon, "zygote.spawned", 60, job=other_cwd)
    assert daemon.wait_state(other_cwd, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    assert not log_events(daemon, "zygote.adopted"), "adopted a zygote that was not identical"
    # One per user: each newer zygote of the same user replaced the one parked before.
    dropped = wait_log(daemon, "zygote.dropped", job=first)
    assert (dropped["pid"], dropped["why"]) == (parked["pid"], "evicted")


def _run_versioned(daemon: DaemonProc, tmp_path: Path, *flags: str) -> tuple[str, str]:
    """Run ``train.py``, which writes the VERSION of its local ``model.py`` (both written the first
    time, ``model.py`` at 1; after that as the test left them); the job and the version rank 0 saw."""
    script = tmp_path / "train.py"
    if not script.exists():
        (tmp_path / "model.py").write_text("VERSION = 1\n")
        script.write_text(
            "import os, model\n"
            "seen = os.path.join(os.environ['OUT'], 'v.' + os.environ['RANK'])\n"
            "open(seen, 'w').write(str(model.VERSION))\n"
        )
    job = submit_job(daemon, tmp_path, *flags, str(script))
    assert daemon.wait_state(job, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    return job, (tmp_path / "v.0").read_text()


def test_an_edited_preload_module_makes_the_parked_zygote_stale(daemon: DaemonProc, tmp_path: Path) -> None:
    def run() -> tuple[str, str]:
        return _run_versioned(daemon, tmp_path, "--preload", "model")

    first, version = run()
    assert version == "1"
    parked = wait_log(daemon, "zygote.parked", job=first)
    (tmp_path / "model.py").write_text("VERSION = 22\n")  # the user edits it and submits again
    second, version = run()
    assert version == "22", "a worker ran the module as it was when the zygote imported it"
    stale = wait_log(daemon, "zygote.stale", job=second)
    assert stale["pid"] == parked["pid"] and stale["changed"] == str(tmp_path / "model.py")
    assert log_events(daemon, "zygote.ready", job=second), "no fresh zygote for the job"
    assert log_events(daemon, "zygote.dropped", pid=parked["pid"], why="stale")
    wait_for(lambda: not alive_pid(parked["pid"]), 15, what="the stale zygote to be stopped")
    wait_log(daemon, "zygote.parked", job=second)  # (parked as the job leaves, just after it ends)
    third, version = run()  # nothing changed since: the fresh one is adopted
    assert version == "22" and wait_log(daemon, "zygote.adopted", job=third)["from_job"] == second


def test_a_script_that_cannot_import_torch_gets_a_warm_parent_without_it(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    """Its imports are the standard library's and a local module's: no torch in its parent. Once
    the local module imports torch, the parked parent is stale (the module was read to decide) and
    the next job's parent imports torch."""
    first, version = _run_versioned(daemon, tmp_path)
    assert version == "1" and wait_log(daemon, "zygote.ready", job=first)["torch"] is False
    parked = wait_log(daemon, "zygote.parked", job=first)
    (tmp_path / "model.py").write_text("import torch\nVERSION = 2\n")
    second, version = _run_versioned(daemon, tmp_path)
    assert version == "2"
    stale = wait_log(daemon, "zygote.stale", job=second)
    assert stale["pid"] == parked["pid"] and stale["changed"] == str(tmp_path / "model.py")
    assert wait_log(daemon, "zygote.ready", job=second)["torch"] is True


def test_a_parked_zygote_expires(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d = daemon_factory(None, "--warm-keep-s", "3")
    job = submit_job(d, tmp_path, str(SCRIPTS / "fresh_contract.py"))
    assert d.wait_state(job, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    parked = wait_log(d, "zygote.parked", job=job)
    dropped = wait_log(d, "zygote.dropped", 30, pid=parked["pid"])
    assert dropped["why"] == "expired" and dropped["parked_s"] >= 3.0
    wait_for(lambda: not alive_pid(parked["pid"]), 15, what="the expired zygote to be stopped")


def test_no_warm_jobs_neither_park_nor_adopt(daemon: DaemonProc, tmp_path: Path) -> None:
    script = str(SCRIPTS / "fresh_contract.py")
    warm = submit_job(daemon, tmp_path, script)
    assert daemon.wait_state(warm, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    wait_log(daemon, "zygote.parked", job=warm)
    cold = submit_job(daemon, tmp_path, "--no-warm", script)
    assert daemon.wait_state(cold, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    assert spawned_modes(daemon, cold) == ["cold"] and not log_events(daemon, "zygote.adopted")


def test_parked_zygotes_stop_with_their_daemon(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d = daemon_factory(None)
    job = submit_job(d, tmp_path, str(SCRIPTS / "fresh_contract.py"))
    assert d.wait_state(job, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    parked = wait_log(d, "zygote.parked", job=job)
    assert d.stop() == 0
    assert not alive_pid(parked["pid"]) and log_events(d, "zygote.dropped", pid=parked["pid"], why="closed")
    assert not d.leftovers()


def test_a_parked_zygote_dies_with_a_killed_daemon(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d = daemon_factory(None)
    job = submit_job(d, tmp_path, str(SCRIPTS / "fresh_contract.py"))
    assert d.wait_state(job, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    parked = wait_log(d, "zygote.parked", job=job)
    pool = pool_cgroup(d)
    assert pool is None or pool.is_dir()
    d.kill9()
    wait_for(lambda: not alive_pid(parked["pid"]), 15, what="the parked zygote to die with its daemon")
    assert not d.leftovers()
    if pool is not None:  # the reaper killed and removed the daemon's cgroups, the pool's too
        wait_for(lambda: not pool.exists(), 15, what="the reaper to remove the pool's cgroup")
    d.start()  # a restarted daemon finds nothing of it (its recovery's sweep would kill it)
    assert not d.leftovers() and not log_events(d, "recover.killing")


@other_users
def test_a_job_never_gets_another_users_zygote(daemon_factory: DaemonFactory) -> None:
    """root's and nobody's jobs, identical but for the user: each gets only its own user's zygote."""
    with public_dir() as public:
        d = public_daemon(daemon_factory, public)
        work = public_workdir(public)
        script = work / "who.py"
        script.write_text("import json, os\nprint(json.dumps([os.getuid(), os.getppid()]))\n")
        script.chmod(0o644)
        args: dict[str, Any] = {
            "entry_kind": "script", "entry": str(script), "cwd": str(work), "python": SYSTEM_PYTHON,
            "env": {"PATH": "/usr/bin:/bin"}, "preload": ["json"],
        }  # fmt: skip

        def submit(uid: int) -> str:
            reply = d.call("submit", **args) if uid == 0 else as_user(uid, uid, d.socket, "submit", **args)
            if uid == 0:
                reply = {"ok": True, "result": reply}
            assert reply["ok"], reply
            job = str(reply["result"]["id"])
            assert d.wait_state(job, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED", d.log_text()[
                -3000:
            ]
            return job

        roots = submit(0)
        root_zygote = wait_log(d, "zygote.parked", job=roots)["pid"]
        nobodys = submit(NOBODY)
        assert wait_log(d, "zygote.ready", job=nobodys)["pid"] != root_zygote
        nobody_zygote = wait_log(d, "zygote.parked", job=nobodys)["pid"]
        again = submit(NOBODY)
        assert wait_log(d, "zygote.adopted", job=again)["pid"] == nobody_zygote
        wait_log(d, "zygote.parked", job=again)
        root_again = submit(0)
        assert wait_log(d, "zygote.adopted", job=root_again)["pid"] == root_zygote
        adoptions = {(e["job"], e["pid"]) for e in log_events(d, "zygote.adopted")}
        assert adoptions == {(again, nobody_zygote), (root_again, root_zygote)}, adoptions
        rank0 = d.log_dir / again / "attempt_0" / "rank_0.log"
        assert json.loads(rank0.read_text().splitlines()[-1]) == [NOBODY, nobody_zygote]

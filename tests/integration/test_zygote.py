"""Warm workers: forked from a per-job zygote that imported torch once, and indistinguishable to the
script from workers exec'd afresh (``--no-warm``), attempt after attempt; a zygote that dies or
cannot start leaves the job to cold workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonFactory
from tests.support import DaemonProc, log_events, submit_job, wait_for, wait_log
from tests.users import NOBODY, SYSTEM_PYTHON, as_user, other_users, public_daemon, public_dir, public_workdir

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(240), pytest.mark.slow]
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
# What legitimately differs between two jobs (ids, ports, fd numbers of the daemon's pipes, the
# socket of the job's snapshot keeper where the daemons keep snapshots).
JOB_SPECIFIC = {"MASTER_PORT", "ELASTICD_PROGRESS_FD", "ELASTICD_HEARTBEAT_FILE", "ELASTICD_SNAPSHOT_SOCKET"}
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


def records(out: Path, job: str) -> dict[tuple[int, int], dict[str, Any]]:
    """``fresh_contract.py``'s records by (round, rank), with the job id and OUT made neutral."""
    found = {}
    for path in out.glob("fresh.*.json"):
        _, rnd, rank, _ = path.name.split(".")
        text = path.read_text().replace(job, "<job>").replace(str(out), "<out>")
        found[(int(rnd), int(rank))] = json.loads(text)
    return found


def run_contract(d: DaemonProc, out: Path, *flags: str) -> tuple[str, dict[tuple[int, int], dict[str, Any]]]:
    """Two ranks; round 0 fails (every rank exits 3), round 1 succeeds."""
    out.mkdir()
    argv = [
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        *flags,
        str(SCRIPTS / "fresh_contract.py"),
        "--lr",
    ]
    job = submit_job(d, out, *argv, "0.1", env={"EXIT_ROUND_0": "3"})
    assert d.wait_state(job, ("SUCCEEDED", "FAILED"), 180)["state"] == "SUCCEEDED", d.log_text()[-3000:]
    found = records(out, job)
    assert sorted(found) == [(0, 0), (0, 1), (1, 0), (1, 1)], sorted(found)
    return job, found


def spawned_modes(d: DaemonProc, job: str) -> list[str]:
    return [e["mode"] for e in log_events(d, "group.spawned", job=job)]


SAME = [
    "main_name", "main_file", "main_spec", "main_loader", "main_keys", "argv", "orig_argv", "cmdline",
    "executable", "flags", "path", "cwd", "ids", "rlimits", "umask", "fds", "signals", "sigmask", "threads",
    "session_leader", "pdeathsig", "stdin", "cgroup", "cuda_initialized", "gc",
]  # fmt: skip


def assert_like_cold(
    daemon: DaemonProc,
    warm: dict[tuple[int, int], dict[str, Any]],
    cold: dict[tuple[int, int], dict[str, Any]],
) -> None:
    """Every attempt's warm workers found what the cold ones found (``fresh_contract.py``)."""
    for where in sorted(cold):
        for key in SAME:
            w, c = warm[where][key], cold[where][key]
            assert w == c, f"{key} of (round, rank) {where}: warm {w!r} != cold {c!r}"
        for env in ("env", "environ"):  # os.environ, and /proc/<pid>/environ
            w_env, c_env = warm[where][env], cold[where][env]
            assert sorted(w_env) == sorted(c_env), f"{env} names of {where}: {set(w_env) ^ set(c_env)}"
            differ = {k for k in c_env if w_env[k] != c_env[k]} - JOB_SPECIFIC - {AGENT_STORE}
            # a warm parent forks the store host that every rank is a client of; cold, rank 0 hosts it
            assert (w_env[AGENT_STORE], c_env[AGENT_STORE]) == ("True", "False"), where
            assert not differ, f"{env} of {where}: {[(k, w_env[k], c_env[k]) for k in sorted(differ)]}"
    if log_events(daemon, "tracking.backend", backend="cgroup2"):
        for (_, rank), r in warm.items():
            assert r["cgroup"][0].endswith(f"/<job>/rank_{rank}"), f"not in its rank's cgroup: {r['cgroup']}"
    assert all("torch" in r["preloaded"] for r in warm.values()), "torch not imported before the script"
    assert all(r["preloaded"] == [] for r in cold.values()), "a cold worker found torch imported"
    assert all(r["threads"] == 1 for r in warm.values()), "a thread of the zygote survived the fork"
    assert not any(r["cuda_initialized"] for r in warm.values()), "CUDA initialised in a warm worker"
    for key in ("random", "torch_random", "torch_seed"):
        values = [r[key] for r in warm.values()]
        assert len(set(values)) == len(values), f"{key} repeats across warm ranks or attempts: {values}"


def test_a_warm_worker_is_indistinguishable_from_a_cold_one(daemon: DaemonProc, tmp_path: Path) -> None:
    """The same job, warm and ``--no-warm``: every attempt's workers find the same things."""
    warm_job, warm = run_contract(daemon, tmp_path / "warm")
    cold_job, cold = run_contract(daemon, tmp_path / "cold", "--no-warm")
    assert_like_cold(daemon, warm, cold)
    zygotes = log_events(daemon, "zygote.ready", job=warm_job)
    assert len(zygotes) == 1, f"one zygote per job and node, got {zygotes}"
    parents = {r["ppid"] for r in warm.values()}
    assert parents == {zygotes[0]["pid"]}, f"workers' parents {parents}, zygote {zygotes[0]['pid']}"
    assert spawned_modes(daemon, warm_job) == ["warm", "warm"], "not every attempt was forked"
    assert spawned_modes(daemon, cold_job) == ["cold", "cold"], "--no-warm forked"
    assert not log_events(daemon, "zygote.spawned", job=cold_job), "--no-warm started a zygote"
    wait_log(daemon, "zygote.parked", job=warm_job)  # kept for the next identical job (warm.pool)


def test_a_warm_worker_is_found_and_killed_by_its_scripts_name(daemon: DaemonProc, tmp_path: Path) -> None:
    """``pgrep -f`` and ``pkill -f`` find warm workers by their script, as a user stops their run."""
    script = tmp_path / "train_by_name.py"  # a path no other test's process holds
    script.write_text((SCRIPTS / "member.py").read_text())
    job = submit_job(
        daemon, tmp_path, "--nproc-per-node", "2", "--max-restarts", "0", str(script), "--lr", "0.1"
    )
    wait_for(lambda: len(list(tmp_path.glob("w.0.*.json"))) == 2, 120, what="the workers")
    pids = sorted(json.loads(p.read_text())["pid"] for p in tmp_path.glob("w.0.*.json"))
    found = subprocess.run(["pgrep", "-f", f"{script} --lr 0.1$"], capture_output=True, text=True, timeout=10)
    assert sorted(int(p) for p in found.stdout.split()) == pids, found
    cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes().split(b"\0")
    assert cmdline[-5:] == [b"-u", str(script).encode(), b"--lr", b"0.1", b""], cmdline
    subprocess.run(["pkill", "-f", str(script)], check=True, timeout=10)
    status = daemon.wait_state(job, ("SUCCEEDED", "FAILED"), 60)
    assert status["state"] == "FAILED", status
    assert spawned_modes(daemon, job) == ["warm"]
    wait_log(daemon, "zygote.parked", job=job)  # the zygote shows its loader: pkill -f left it


def test_a_crash_prints_the_scripts_traceback_as_python_does(daemon: DaemonProc, tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    job = submit_job(daemon, tmp_path, "--max-restarts", "0", str(script))
    status = daemon.wait_state(job, ("SUCCEEDED", "FAILED"), 120)
    assert status["state"] == "FAILED"
    tail = (daemon.log_dir / job / "attempt_0" / "rank_0.log").read_text()
    assert spawned_modes(daemon, job) == ["warm"]
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', tail)
    assert frames == [(str(script), "<module>"), (str(script), "f")], tail
    assert "ValueError: boom" in tail


def test_a_lost_zygote_fails_its_attempt_the_next_runs_cold_and_a_new_one_warms_the_rest(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    job = submit_job(daemon, tmp_path, "--nproc-per-node", "2", "--max-restarts", "2",
                     str(SCRIPTS / "member.py"))  # fmt: skip
    ready = wait_log(daemon, "zygote.ready", 120, job=job)
    wait_for(lambda: len(list(tmp_path.glob("w.0.*.json"))) == 2, 60, what="round 0's workers")
    os.kill(ready["pid"], signal.SIGKILL)
    lost = wait_log(daemon, "zygote.lost", 30, job=job)
    assert lost["pid"] == ready["pid"]
    wait_for(lambda: len(list(tmp_path.glob("w.1.*.json"))) == 2, 60, what="round 1's workers")
    assert log_events(daemon, "zygote.cold", job=job, round=1), "no log line for the cold fallback"
    assert wait_log(daemon, "zygote.replaced", 30, job=job)["times"] == 1
    fresh = lambda: [e for e in log_events(daemon, "zygote.ready", job=job) if e["pid"] != ready["pid"]]  # noqa: E731
    again = wait_for(fresh, 120, what="a new zygote ready")[0]
    worker = json.loads((tmp_path / "w.1.0.json").read_text())["pid"]
    os.kill(worker, signal.SIGKILL)  # round 2 forks from the new zygote
    wait_for(lambda: len(list(tmp_path.glob("w.2.*.json"))) == 2, 60, what="round 2's workers")
    (tmp_path / "finish").touch()
    assert daemon.wait_state(job, ("SUCCEEDED", "FAILED"), 60)["state"] == "SUCCEEDED"
    assert spawned_modes(daemon, job) == ["warm", "cold", "warm"]
    assert again["pid"] != ready["pid"]


def test_a_zygote_that_cannot_start_leaves_the_job_to_cold_workers(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    job = submit_job(daemon, tmp_path, "--preload", "no_such_module_here", str(SCRIPTS / "fresh_contract.py"))
    assert daemon.wait_state(job, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED"
    why = wait_log(daemon, "zygote.unavailable", job=job)
    assert "no_such_module_here" in why["reason"]
    assert spawned_modes(daemon, job) == ["cold"]


@other_users
def test_another_users_job_runs_warm_on_the_system_python(daemon_factory: DaemonFactory) -> None:
    with public_dir() as public:
        d = public_daemon(daemon_factory, public)
        work = public_workdir(public)
        script = work / "who.py"
        script.write_text(
            "import sys\nloaded = 'json' in sys.modules\nimport json, os\n"
            "rec = {'json': loaded, 'ids': [os.getuid(), os.getgid()], 'ppid': os.getppid(),\n"
            "       'cmdline': open('/proc/self/cmdline', 'rb').read().decode().split(chr(0))}\n"
            "path = os.path.join(os.path.dirname(__file__), 'rec.' + os.environ['RANK'])\n"
            "open(path, 'w').write(json.dumps(rec))\n"
        )
        script.chmod(0o644)
        args = {"entry_kind": "script", "entry": str(script), "cwd": str(work), "python": SYSTEM_PYTHON,
                "env": {"PATH": "/usr/bin:/bin"}, "nproc_per_node": 2, "preload": ["json"]}  # fmt: skip
        reply = as_user(NOBODY, NOBODY, d.socket, "submit", **args)
        assert reply["ok"], reply
        job = reply["result"]["id"]
        assert d.wait_state(job, ("SUCCEEDED", "FAILED"), 120)["state"] == "SUCCEEDED", d.log_text()[-3000:]
        ready = wait_log(d, "zygote.ready", job=job)
        recs = [json.loads((work / f"rec.{r}").read_text()) for r in (0, 1)]
        assert all(r["json"] for r in recs), "json was not preloaded"
        assert all(r["ids"] == [NOBODY, NOBODY] for r in recs), recs
        assert {r["ppid"] for r in recs} == {ready["pid"]}, "not forked from the zygote"
        assert all(r["cmdline"][-3:] == ["-u", str(script), ""] for r in recs), recs  # retitled unprivileged
        assert spawned_modes(d, job) == ["warm"]

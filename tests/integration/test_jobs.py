"""Jobs on one host, end to end: real daemon, real socket, real worker processes."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from elasticd.daemon.testhooks import FAKE_GPUS_ENV
from tests.conftest import DaemonFactory
from tests.support import REPO, DaemonProc, hears_ctrl_c, wait_for

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"
TORCHRUN_VARS = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES",
]  # fmt: skip


def submit(d: DaemonProc, *argv: str, **kw: object) -> str:
    res = d.ctl("submit", *argv, **kw)  # type: ignore[arg-type]
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[0]


def test_submit_prints_id_first_and_workers_get_torchrun_env(daemon: DaemonProc, tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path), MY_VAR="carried", RANK="stale", OMP_NUM_THREADS="")
    env.pop("OMP_NUM_THREADS")
    res = daemon.ctl(
        "submit",
        "--nproc-per-node",
        "3",
        "--max-restarts",
        "2",
        "--name",
        "envcheck",
        "--env",
        "EXTRA=1",
        "--follow",
        str(SCRIPTS / "envdump.py"),
        "--",
        "--flag",
        "value",
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.splitlines()[0]
    assert job_id.startswith("envcheck-")
    dumps = [json.loads((tmp_path / f"env.{r}.json").read_text()) for r in range(3)]
    ports = set()
    for rank, dump in enumerate(dumps):
        e = dump["env"]
        assert all(v in e for v in TORCHRUN_VARS)
        assert (e["RANK"], e["LOCAL_RANK"], e["ROLE_RANK"]) == (str(rank),) * 3
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["ROLE_WORLD_SIZE"]) == ("3", "3", "3")
        assert (e["GROUP_RANK"], e["GROUP_WORLD_SIZE"], e["ROLE_NAME"]) == ("0", "1", "default")
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0" and e["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert e["TORCHELASTIC_RUN_ID"] == job_id
        assert e["OMP_NUM_THREADS"] == "1"
        assert e["MY_VAR"] == "carried" and e["EXTRA"] == "1"
        assert dump["argv"][1:] == ["--flag", "value"]
        assert dump["cwd"] == str(tmp_path)
        assert dump["exe"] == sys.executable  # the submitter's python (this venv)
        ports.add((e["MASTER_ADDR"], e["MASTER_PORT"]))
    assert len(ports) == 1
    status = json.loads(daemon.ctl("status", job_id, "--json").stdout)
    assert status["state"] == "SUCCEEDED" and status["restarts"] == 0
    assert "rank 2 wrote its environment" in daemon.ctl("logs", job_id, "--rank", "2").stdout


def test_env_clear_module_and_no_python(daemon: DaemonProc, tmp_path: Path) -> None:
    res = daemon.ctl(
        "submit",
        "--env-clear",
        "--env",
        f"OUT={tmp_path}",
        "--env",
        f"PYTHONPATH={SCRIPTS}",
        "--follow",
        "-m",
        "envdump",
        env=dict(os.environ, SECRET="x"),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    env = json.loads((tmp_path / "env.0.json").read_text())["env"]
    assert "SECRET" not in env and env["OUT"] == str(tmp_path) and env["RANK"] == "0"

    res = daemon.ctl("submit", "--follow", "--no-python", "sh", "--", "-c", "echo via-sh $RANK", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "[rank0]: via-sh 0" in res.stdout


def test_restarts_then_fails_with_first_failure_details(daemon: DaemonProc, tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path), FAIL_RANK="1", FAIL_CODE="3")
    res = daemon.ctl(
        "submit",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--follow",
        str(SCRIPTS / "fail_rank.py"),
        env=env,
    )
    assert res.returncode == 4
    job_id = res.stdout.splitlines()[0]
    job = json.loads(daemon.ctl("status", job_id, "--json").stdout)
    assert job["state"] == "FAILED" and job["restarts"] == 2
    assert job["failure"]["rank"] == 1 and job["failure"]["exit_code"] == 3
    assert "something went wrong in rank 1" in job["failure"]["output_tail"]
    assert "rank 1" in job["error"]
    # Every attempt ran both ranks, with the restart count in the environment, in its own log dir.
    for attempt in range(3):
        for rank in range(2):
            assert (tmp_path / f"attempt.{attempt}.{rank}").exists()
            log = daemon.log_dir / job_id / f"attempt_{attempt}" / f"rank_{rank}.log"
            assert f"attempt {attempt} rank {rank}" in log.read_text()
    assert "first failure: rank 1" in res.stderr
    # The healthy rank of each attempt was stopped, not left running.
    pids = [int((tmp_path / f"attempt.{a}.0").read_text()) for a in range(3)]
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


def test_failure_by_signal_is_reported(daemon: DaemonProc, tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path), FAIL_RANK="0", FAIL_SIGNAL="SIGSEGV")
    job_id = submit(daemon, "--max-restarts", "0", str(SCRIPTS / "fail_rank.py"), env=env)
    job = daemon.wait_state(job_id, ("FAILED",))
    assert job["failure"]["signal"] == "SIGSEGV" and job["failure"]["exit_code"] is None


def test_kill_removes_every_process_including_escaped_grandchildren(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    env = dict(os.environ, OUT=str(tmp_path))
    job_id = submit(daemon, "--nproc-per-node", "2", str(SCRIPTS / "forky.py"), env=env)
    pid_files = [tmp_path / "pids.0", tmp_path / "pids.1"]
    wait_for(lambda: all(p.exists() and p.read_text() for p in pid_files), 30, what="workers to fork")
    pids = [int(x) for p in pid_files for x in p.read_text().split()]
    assert all(psutil.pid_exists(p) for p in pids)
    res = daemon.ctl("kill", job_id)
    assert res.returncode == 0, res.stderr
    assert "KILLED" in res.stdout
    gone = lambda: not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]  # noqa: E731
    wait_for(gone, 5, what="every process of the job to be gone")
    assert daemon.job(job_id)["state"] == "KILLED"
    again = daemon.ctl("kill", job_id)
    assert again.returncode == 3 and "conflict" in again.stderr


def test_gpu_jobs_get_disjoint_devices_and_overflow_waits_pending(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    d = daemon_factory(None, env={**os.environ, FAKE_GPUS_ENV: "4"})
    env = dict(os.environ, OUT=str(tmp_path))
    a = submit(d, "--nproc-per-node", "2", str(SCRIPTS / "sleeper.py"), env=env)
    b = submit(d, "--nproc-per-node", "2", str(SCRIPTS / "sleeper.py"), env=env)
    ja, jb = d.wait_state(a, ("RUNNING",)), d.wait_state(b, ("RUNNING",))
    devs_a, devs_b = set(ja["devices"].split(",")), set(jb["devices"].split(","))
    assert len(devs_a) == len(devs_b) == 2 and not devs_a & devs_b

    def logged_devices(job_id: str) -> bool:
        return "devices=" in d.ctl("logs", job_id).stdout

    for job_id, devs in ((a, ja["devices"]), (b, jb["devices"])):
        wait_for(functools.partial(logged_devices, job_id), 30)
        assert f"devices='{devs}'" in d.ctl("logs", job_id).stdout

    c = submit(d, "--nproc-per-node", "1", str(SCRIPTS / "sleeper.py"), env=env)
    pending = d.job(c)
    assert pending["state"] == "PENDING" and "waiting for 1 free GPUs (0 of 4 free now)" in pending["reason"]
    assert "waiting for 1 free GPUs" in d.ctl("status").stdout

    too_big = d.ctl("submit", "--nproc-per-node", "5", str(SCRIPTS / "sleeper.py"))
    assert too_big.returncode == 3
    assert "insufficient_capacity" in too_big.stderr and "has 4" in too_big.stderr

    d.ctl("kill", a)
    jc = d.wait_state(c, ("RUNNING",), 30)
    assert set(jc["devices"].split(",")) <= devs_a
    for job_id in (b, c):
        d.ctl("kill", job_id)


def test_missing_script_and_bad_input_are_refused_clearly(daemon: DaemonProc, tmp_path: Path) -> None:
    res = daemon.ctl("submit", str(tmp_path / "nope.py"))
    assert res.returncode == 2 and "script not found" in res.stderr
    res = daemon.ctl("submit", "--nnodes", "3:1", str(SCRIPTS / "sleeper.py"))
    assert res.returncode == 3 and "invalid_spec" in res.stderr
    res = daemon.ctl("submit", "--nproc-per-node", "0", str(SCRIPTS / "sleeper.py"))
    assert res.returncode == 3 and "nproc_per_node" in res.stderr
    res = daemon.ctl("submit", "--python", "/no/such/python", str(SCRIPTS / "sleeper.py"))
    assert res.returncode == 3 and "python interpreter /no/such/python is missing" in res.stderr
    res = daemon.ctl("submit", "--no-python", "no-such-binary-xyz")
    assert res.returncode == 3 and "script_not_found" in res.stderr
    # The script vanishing between the CLI's check and the daemon's is caught by the daemon.
    raw = daemon.client()
    with pytest.raises(Exception) as err:
        raw.call(
            "submit",
            entry_kind="script",
            entry=str(tmp_path / "gone.py"),
            cwd=str(tmp_path),
            python=sys.executable,
        )
    assert getattr(err.value, "code", "") == "script_not_found"
    raw.close()
    res = daemon.ctl("status", "no-such-job")
    assert res.returncode == 3 and "job_not_found" in res.stderr
    assert daemon.ctl("ping").returncode == 0


def test_logs_follow_streams_until_the_end(daemon: DaemonProc, tmp_path: Path) -> None:
    script = tmp_path / "talk.py"
    script.write_text(
        "import time\nfor i in range(5):\n    print('line', i, flush=True)\n    time.sleep(0.2)\n"
    )
    job_id = submit(daemon, "--nproc-per-node", "2", str(script), cwd=tmp_path)
    res = daemon.ctl("logs", "-f", job_id)
    assert res.returncode == 0
    for rank in (0, 1):
        assert [ln for ln in res.stdout.splitlines() if ln.startswith(f"[rank{rank}]")] == [
            f"[rank{rank}]: line {i}" for i in range(5)
        ]
    only = daemon.ctl("logs", job_id, "--rank", "1").stdout
    assert "[rank1]: line 4" in only and "[rank0]" not in only


def test_signal_on_follow_leaves_job_running(daemon: DaemonProc, tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "elasticctl", "submit", "--follow", str(SCRIPTS / "sleeper.py")],
        env=dict(os.environ, ELASTICD_SOCKET=str(daemon.socket)),
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=hears_ctrl_c,
    )
    assert proc.stdout is not None
    job_id = proc.stdout.readline().strip()
    daemon.wait_state(job_id, ("RUNNING",))
    proc.send_signal(signal.SIGINT)
    assert proc.wait(10) == 130
    assert daemon.job(job_id)["state"] == "RUNNING"
    daemon.ctl("kill", job_id)

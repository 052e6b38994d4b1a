"""Real torch.distributed (gloo, CPU): rank 1 crashes, rank 0 then fails on the broken collective.
The report names rank 1, the root cause, with rank 0 under "also failed", the same way in
``status --json``, ``status`` and ``--follow``'s last words; no text is said twice."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests.support import REPO, DaemonProc, start_cluster, submit_job, wait_for, wait_job, wait_log

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
SCRIPT = REPO / "tests" / "scripts" / "crash_collective.py"


@pytest.mark.timeout(180)
def test_the_first_rank_to_fail_is_the_root_cause(daemon: DaemonProc, tmp_path: Path) -> None:
    env = dict(os.environ, CRASH_RANK="1")
    res = daemon.ctl(
        "submit", "--nproc-per-node", "2", "--max-restarts", "0", "--follow", str(SCRIPT),
        env=env, timeout_s=150, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 4, res.stdout + res.stderr
    job_id = res.stdout.splitlines()[0]

    job = json.loads(daemon.ctl("status", job_id, "--json").stdout)
    failure = job["failure"]
    assert job["state"] == "FAILED"
    assert failure["rank"] == 1 and failure["exit_code"] == 1, failure
    assert failure["message"] == "RuntimeError: rank 1 crashed on purpose"
    assert "[rank1]: RuntimeError: rank 1 crashed on purpose" in failure["output_tail"]
    (other,) = failure["also_failed"]
    assert other["rank"] == 0 and other["exit_code"] == 1 and other["signal"] is None, other
    assert other["message"].startswith("RuntimeError:") and "\n" not in other["message"]
    assert other["failed_at"] >= failure["failed_at"]
    assert failure["also_failed_more"] == 0

    # --follow: each rank's lines once prefixed, torch's own "[rank1]:" kept as it is.
    out = res.stdout
    assert "[rank1]: Traceback (most recent call last):" in out and "[rank0]: rank 0 reduced 2.0" in out
    assert "[rank1]: [rank1]:" not in out and "[rank0]: [rank0]:" not in out
    # --follow's last words and status name the same root cause, each fact once.
    status = daemon.ctl("status", job_id)
    assert status.returncode == 0, status.stderr
    for text in (res.stderr, status.stdout):
        assert "first failure: rank 1 (local rank 1 on " in text
        assert ", exit code 1: RuntimeError: rank 1 crashed on purpose" in text
        assert "also failed: rank 0 (local rank 0), exit code 1: RuntimeError:" in text
        assert "exit code 1: exit code 1" not in text and "[rank1]: [rank1]:" not in text
    assert status.stdout.count("rank 1 (local 1 on") == 1  # reason and error: one line
    assert job["error"].startswith("rank 1 (local 1 on") and "also failed: rank 0" in job["error"]


BLAME = REPO / "tests" / "scripts" / "blame_across.py"


@pytest.mark.timeout(180)
def test_the_first_failure_across_nodes_is_the_root_cause_even_if_its_node_spoke_last(
    daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """Node B's rank crashes first, but B is frozen: node A ends the job naming its own later
    failure. When B comes back it amends the final record: the root cause is B's rank, by time,
    and A's rank is listed as also failed, on its node."""
    a, b = start_cluster(daemon_factory, 2, ttl=15.0)
    job_id = submit_job(
        a, tmp_path, "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "0",
        "--python", sys.executable, str(BLAME),
    )  # fmt: skip
    wait_for(lambda: len(list(tmp_path.glob("started.*"))) == 4, 60, what="4 workers started")
    members = {m["group_rank"]: m["node"] for m in a.job(job_id)["members"]}
    first, second = (a, b) if members[1] == b.node_id else (b, a)  # second: the node of group rank 1
    assert second.proc is not None
    os.kill(second.proc.pid, signal.SIGSTOP)
    try:
        (tmp_path / "go").write_text("")
        ended = wait_job(first, job_id, lambda j: j["state"] == "FAILED", "the job to fail", 60)
        assert ended["failure"]["node"] == first.node_id, ended["failure"]  # the later failure, first
    finally:
        os.kill(second.proc.pid, signal.SIGCONT)
    job = wait_job(
        first, job_id, lambda j: j["failure"]["node"] == second.node_id, "the root cause amended", 60
    )
    failure = job["failure"]
    assert failure["rank"] == 2 and failure["message"] == "RuntimeError: the real crash", failure
    assert failure["exception"] == "RuntimeError" and failure["kind"] == "user_code"
    assert {(f["rank"], f.get("node")) for f in failure["also_failed"]} >= {(0, first.node_id)}
    assert job["reason"].startswith(f"rank 2 (local 0 on {second.node_id}) failed"), job["reason"]
    assert job["cause"] == "user_code"
    wait_log(second, "root_cause.amended", job=job_id)


@pytest.mark.timeout(120)
def test_a_job_failing_the_same_way_with_no_progress_stops_before_its_budget_is_spent(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    script = tmp_path / "same.py"
    script.write_text("d = {}\nd['missing']\n")
    res = daemon.ctl("submit", "--max-restarts", "9", "--follow", str(script), timeout_s=100, cwd=tmp_path)
    assert res.returncode == 4, res.stdout + res.stderr
    job = daemon.job(res.stdout.splitlines()[0])
    assert (job["state"], job["code"], job["restarts"]) == ("FAILED", "repeated_failure", 2), job
    assert job["failure"]["exception"] == "KeyError" and job["cause"] == "user_code"
    assert "failed the same way 3 times in a row with no progress" in job["reason"]
    assert "7 of 9 restarts left" in job["reason"]
    status = daemon.ctl("status", job["id"])
    assert "failed the same way 3 times" in status.stdout and "(KeyError)" in status.stdout


def _written(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.mark.timeout(150)
def test_a_worker_killed_from_outside_again_and_again_is_restarted_until_its_budget_is_spent(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    """A plain script (no steps) whose worker is SIGKILLed from outside a few seconds into each
    attempt, three times in a row: not the job's own doing, so it is restarted as torchrun would,
    and its fourth attempt succeeds."""
    script = tmp_path / "killed.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "if attempt == 3:\n"
        "    sys.exit(0)\n"
        "pathlib.Path(os.environ['OUT'], f'pid.{attempt}').write_text(str(os.getpid()))\n"
        "time.sleep(120)\n"
    )
    job_id = submit_job(daemon, tmp_path, "--max-restarts", "5", "--max-same-failures", "3", str(script))
    for attempt in range(3):
        pid = int(wait_for(partial(_written, tmp_path / f"pid.{attempt}"), 60, what=f"attempt {attempt}"))
        os.kill(pid, signal.SIGKILL)
    job = daemon.wait_state(job_id, ("SUCCEEDED", "FAILED"), timeout_s=60)
    assert (job["state"], job["restarts"]) == ("SUCCEEDED", 3), job

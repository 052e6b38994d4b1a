"""Goodput with real daemons: a job that waits in the queue, checkpoints, crashes, redoes steps,
hangs and is drained, whose every second's cause is known from its own stamps
(``tests/scripts/goodput_faults.py``) and the daemon's log; status's figure per cause must be
within 2% of the job's wall time of what those stamps say."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonFactory
from tests.support import (
    REPO,
    DaemonProc,
    log_events,
    submit_job,
    wait_for,
    wait_job,
    wait_log,
    write_script,
)

SCRIPT = REPO / "tests" / "scripts" / "goodput_faults.py"
QUEUED_S = 5.0  # how long the measured job waits behind the one that holds every slot
DRAINED_S = 3.0  # how long its node stays drained
TOLERANCE = 0.02  # of the wall time, per cause


def _stamps(out: Path) -> dict[tuple[int, str, int], float]:
    found: dict[tuple[int, str, int], float] = {}
    for line in (out / "stamps").read_text().splitlines():
        launch, kind, step, at = line.split()
        found[(int(launch), kind, int(step))] = float(at)
    return found


def _steps(stamps: dict[tuple[int, str, int], float], launch: int) -> list[float]:
    """The launch's step stamps, in order."""
    return sorted(at for (i, kind, _), at in stamps.items() if i == launch and kind == "step")


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def expected(job: dict[str, Any], out: Path, launches: list[float], hung_at: float) -> dict[str, float]:
    """Each cause's seconds as the stamps say: ``launches`` are the attempts' starts (the daemon's
    ``attempt.started``), ``hung_at`` when the hang was named (``worker.hung``)."""
    s = _stamps(out)
    steps = [_steps(s, i) for i in range(4)]
    ckpt = s[(0, "ckpt_end", 5)] - s[(0, "ckpt_begin", 5)]
    redone_end = s[(1, "step", 10)]  # steps 6..10 ran again; the first one's time is the restart's
    want: dict[str, float] = defaultdict(float)
    want["waiting"] = (launches[0] - job["submitted_at"]) + (launches[3] - steps[2][-1])
    want["waiting"] += job["ended_at"] - steps[3][-1]  # from the last step to the exit
    want["startup"] = (steps[0][0] - launches[0]) + (steps[3][0] - launches[3])
    want["checkpoint"] = ckpt
    want["restart"] = (steps[1][0] - steps[0][-1]) + (steps[2][0] - hung_at)
    want["hung"] = hung_at - steps[1][-1]
    want["redone"] = redone_end - steps[1][0]
    want["productive"] = (steps[0][-1] - steps[0][0] - ckpt) + (steps[1][-1] - redone_end)
    want["productive"] += (steps[2][-1] - steps[2][0]) + (steps[3][-1] - steps[3][0])
    return dict(want)


def _queue_behind_a_full_node(daemon: DaemonProc, tmp_path: Path) -> tuple[Path, str]:
    held = tmp_path / "holder"
    held.mkdir()
    script = write_script(
        tmp_path / "hold.py",
        "import os, time\n"
        "while not os.path.exists(os.path.join(os.environ['OUT'], 'release')):\n"
        "    time.sleep(0.05)\n",
    )
    holder = submit_job(daemon, held, "--nproc-per-node", "2", str(script))
    daemon.wait_state(holder, ("RUNNING",), 30)
    return held, holder


@pytest.mark.timeout(240)
def test_every_cause_matches_the_stamps_within_two_percent(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    daemon = daemon_factory(None, "--slots", "2")
    held, holder = _queue_behind_a_full_node(daemon, tmp_path)
    out = tmp_path / "job"
    out.mkdir()
    env = dict(os.environ, STEP_S="0.25", LAST="40")
    job_id = submit_job(daemon, out, "--hang-timeout", "3", "--max-restarts", "5", str(SCRIPT), env=env)
    wait_for(lambda: daemon.job(job_id)["state"] == "PENDING", 10, 0.1, "the job to queue")
    time.sleep(max(0.0, daemon.job(job_id)["submitted_at"] + QUEUED_S - time.time()))  # a known wait
    assert daemon.job(job_id)["state"] == "PENDING"  # still queued: the holder has every slot
    (held / "release").touch()
    daemon.wait_state(holder, ("SUCCEEDED",), 30)

    hung = wait_log(daemon, "worker.hung", timeout_s=90, job=job_id)
    wait_for(lambda: len(_steps(_stamps(out), 2)) >= 8, 60, 0.1, "8 steps after the hang")
    assert daemon.ctl("drain", daemon.node_id, "--force", "--grace", "5").returncode == 0
    wait_for(lambda: len(log_events(daemon, "attempt.stopped", job=job_id)) >= 3, 30, 0.1, "the drain's stop")
    time.sleep(DRAINED_S)  # a known wait, drained
    assert daemon.ctl("undrain", daemon.node_id).returncode == 0
    job = wait_job(daemon, job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), "the job's end", 90)
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 2, job

    launches = [_at(e) for e in daemon.events("attempt.started") if e.get("job") == job_id]
    assert len(launches) == 4, launches
    want = expected(job, out, launches, _at(hung))
    got, wall = job["goodput"]["by_cause_s"], job["goodput"]["wall_s"]
    assert abs(wall - (job["ended_at"] - job["submitted_at"])) < 1e-6
    assert abs(sum(want.values()) - wall) < TOLERANCE * wall, (want, wall)
    off = {c: round(got[c] - want[c], 2) for c in want}
    assert all(abs(d) <= TOLERANCE * wall for d in off.values()), (off, got, want, wall)

"""Goodput with real daemons: a job that waits in the queue, checkpoints, crashes, redoes steps,
hangs and is drained, whose every second's cause is known from its own stamps
(``tests/scripts/goodput_faults.py``) and the daemon's log; status's figure per cause must be
within 2% of the job's wall time of what those stamps say. A job whose node's daemon is killed
and started again keeps the productive seconds from before (``tests/scripts/goodput_restart.py``),
and a hang on one node is hung on its peer too (``tests/scripts/hang_across.py``)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from elasticd.rendezvous.model import NodeStatus
from tests.conftest import DaemonFactory
from tests.support import (
    REPO,
    DaemonProc,
    EtcdServer,
    log_events,
    start_cluster,
    submit_job,
    wait_for,
    wait_job,
    wait_log,
    write_script,
)

pytestmark = pytest.mark.slow

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
    said = f"off {off}; got {got}; want {want}; wall {wall}"  # whole: pytest cuts a long repr
    assert all(abs(d) <= TOLERANCE * wall for d in off.values()), said


def _next_report(daemon: DaemonProc, job_id: str) -> dict[str, Any]:
    """The job's status once its node's report was published again (every 5 s while it steps)."""
    seen = daemon.job(job_id)["goodput"]["wall_s"]
    return wait_job(daemon, job_id, lambda j: j["goodput"]["wall_s"] != seen, "a report", 10)


@pytest.mark.timeout(180)
def test_a_daemon_killed_and_started_again_keeps_the_jobs_productive_seconds(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    daemon = daemon_factory(None)
    out = tmp_path / "job"
    out.mkdir()
    script = REPO / "tests" / "scripts" / "goodput_restart.py"
    job_id = submit_job(daemon, out, "--max-restarts", "2", str(script), env=dict(STEP_S="0.2", LAST="400"))
    wait_for(lambda: (out / "stamps").exists() and len(_steps(_stamps(out), 0)) >= 30, 60, 0.1, "30 steps")
    # Right after a report, so that what it settled is known here: the seconds after it are lost
    # with the daemon (the restart's), like the work of a crashed step.
    submitted_at, written_s = (job := _next_report(daemon, job_id))["submitted_at"], job["goodput"]["wall_s"]
    daemon.kill9()
    killed_at = time.time()
    daemon.start()
    resumed = wait_log(daemon, "goodput.resumed", timeout_s=30, job=job_id)
    wait_for(lambda: len(_steps(_stamps(out), 1)) >= 30, 60, 0.1, "30 steps after the restart")
    job = _next_report(daemon, job_id)  # while it runs: its end has a figure of its own
    assert job["restarts"] == 1, job

    stamps, reported_at = _stamps(out), submitted_at + job["goodput"]["wall_s"]
    before = [at for at in _steps(stamps, 0) if at <= submitted_at + written_s]
    after = _steps(stamps, 1)
    kept = before[-1] - before[0]  # what the report the restarted daemon read back had settled
    productive = kept + (reported_at - after[0])  # the step in flight counts as its step would
    got, total = job["goodput"]["by_cause_s"], job["goodput"]["wall_s"]
    assert abs(sum(got.values()) - total) < 1e-6 * total
    assert abs(resumed["productive_s"] - kept) <= TOLERANCE * total, (resumed, kept, total)
    assert abs(got["productive"] - productive) <= TOLERANCE * total, (got, productive, total)
    assert got["restart"] >= after[0] - killed_at  # the daemon's downtime, to the first step after
    queued = before[0] - submitted_at  # waiting and starting up, at most
    assert got["waiting"] + got["startup"] <= queued + TOLERANCE * total, (got, queued)
    assert daemon.ctl("kill", job_id).returncode == 0


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_hang_on_one_node_is_hung_on_its_peer_too(
    daemon_factory: DaemonFactory, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """The peer's rank waits in a collective for the hung rank: its node books that time as hung
    (from the round's record), not as a restart of its own."""
    pytest.importorskip("torch")
    a, b = start_cluster(daemon_factory, 2)
    script = REPO / "tests" / "scripts" / "hang_across.py"
    job_id = submit_job(
        a, tmp_path, "--nnodes", "2", "--hang-timeout", "3", "--max-restarts", "1",
        "--python", sys.executable, str(script),
    )  # fmt: skip
    job = wait_job(a, job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), "the restarted job's end", 200)
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 1 and job["failure"]["kind"] == "hang", job
    client, keys = EtcdClient([etcd_server.endpoint]), Keys(a.etcd_prefix)
    try:
        reports = {d.node_id: client.get(keys.node_status(job_id, d.node_id)) for d in (a, b)}
    finally:
        client.close()
    hung = {n: NodeStatus.from_json(json.loads(kv.value)).goodput for n, kv in reports.items() if kv}
    hung_on = job["failure"]["node"]
    peer = next(n for n in hung if n != hung_on)
    ours, theirs = hung[hung_on], hung[peer]
    assert ours is not None and theirs is not None, reports
    assert ours.hung_s >= 3 and abs(theirs.hung_s - ours.hung_s) < 1.0, (ours, theirs)

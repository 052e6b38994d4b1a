"""Graceful scale-in: drain and undrain, SIGTERM drains, and no training step lost (with a ledger)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DaemonFactory
from tests.support import (
    REPO,
    DaemonProc,
    alive_pid,
    log_events,
    start_cluster,
    submit_job,
    wait_for,
    wait_job,
    wait_log,
    wait_round,
    worker_records,
)

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"
EXAMPLE = REPO / "examples" / "elastic_train.py"
TTL = 3.0


def test_drain_refuses_below_min_then_force_and_undrain(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    a, b = start_cluster(daemon_factory, 2)
    job = submit_job(a, tmp_path, "--nnodes", "2", str(SCRIPTS / "member.py"))
    wait_round(tmp_path, 0, 2)
    refused = a.ctl("drain", b.node_id)
    assert refused.returncode == 3 and "below their minimum" in refused.stderr and "--force" in refused.stderr
    assert not worker_records(tmp_path, 1)
    forced = a.ctl("drain", b.node_id, "--force", "--grace", "2")
    assert forced.returncode == 0 and job in forced.stdout
    view = a.wait_state(job, ("RESTARTING",), 10)
    assert view["restarts"] == 0  # leaving is not a failure

    # b's record says so once b's daemon republishes it (its own thread, after the scan that saw
    # the drain: not ordered with the job's round).
    def draining() -> bool:
        return bool({n["node"]: n for n in a.call("nodes")["nodes"]}[b.node_id]["draining"])

    wait_for(draining, 15, 0.1, "b's record to say draining")
    assert "draining" in a.ctl("nodes").stdout
    # a has joined round 1 (or it closed, which the asserts below then reject).
    joined = "1 of 2 node(s) joined round 1"
    view = wait_job(a, job, lambda v: v["state"] != "RESTARTING" or joined in v["reason"],
                    "a to join round 1", timeout_s=20)  # fmt: skip
    assert view["state"] == "RESTARTING" and view["round"] == 1, view
    assert not worker_records(tmp_path, 1)  # 1 of 2: waits for a node
    assert b.ctl("undrain", b.node_id).returncode == 0
    # A round's result is written once: round 1 closing with b too proves that it did not close
    # with a alone while b was drained.
    assert {r["ELASTICD_OWNER"] for r in wait_round(tmp_path, 1, 2)} == {a.node_id, b.node_id}
    assert a.job(job)["restarts"] == 0
    (tmp_path / "finish").touch()
    assert a.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def test_drained_node_takes_no_new_job_and_job_drain(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    a, b = start_cluster(daemon_factory, 2)
    assert a.ctl("drain", b.node_id).returncode == 0
    held = submit_job(b, tmp_path, str(SCRIPTS / "sleeper.py"))  # single-node: pinned to b
    # A submit replies only after its daemon has looked at every job it is not part of (a scan, which
    # reads the drain record too), and a daemon that takes a job logs job.joining before that reply.
    assert not log_events(b, "job.joining", job=held)
    assert a.job(held)["state"] == "PENDING"
    assert b.ctl("undrain", b.node_id).returncode == 0
    a.wait_state(held, ("RUNNING",), 10)
    a.ctl("kill", held)

    out = tmp_path / "elastic"
    out.mkdir()
    job = submit_job(a, out, "--nnodes", "1:2", "--last-call", "1", str(SCRIPTS / "member.py"))
    wait_round(out, 0, 2)
    assert a.ctl("drain", b.node_id, "--job", job).returncode == 0
    wait_round(out, 1, 1)
    wait_log(b, "job.left", job=job)  # b's part has ended: its scans look at the job again
    # Round 1 runs with a seat free. b's next submit replies after b has looked again at every job
    # it is not part of (as above): by then b has decided about this one, and it takes the new one.
    probe_out = tmp_path / "probe"
    probe_out.mkdir()
    (probe_out / "finish").touch()
    probe = submit_job(b, probe_out, str(SCRIPTS / "member.py"))  # single-node: runs on b
    assert len(log_events(b, "job.joining", job=job)) == 1  # round 0's
    assert b.call("nodes")["nodes"] and not worker_records(out, 2)  # b stays out of this job only
    assert b.wait_state(probe, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
    (out / "finish").touch()
    assert a.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def test_sigterm_drains_the_node_before_exit(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    ds = start_cluster(daemon_factory, 3)
    job = submit_job(ds[0], tmp_path, "--nnodes", "1:3", "--last-call", "1", str(SCRIPTS / "member.py"))
    wait_round(tmp_path, 0, 3)
    t0 = time.monotonic()
    assert ds[2].stop(30) == 0
    assert time.monotonic() - t0 < 10
    wait_round(tmp_path, 1, 2, timeout_s=10)
    view = ds[0].job(job)
    assert view["restarts"] == 0 and view["world_size"] == 2
    bumps = [e for d in ds for e in d.events("round.bumped")]
    assert [(e["reason"], e["spend"]) for e in bumps] == [("member_left", False)]
    assert "shut down" in bumps[0]["detail"]
    (tmp_path / "finish").touch()
    assert ds[0].wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


# -- zero lost steps ------------------------------------------------------------------------------


def reference_weights(steps: int) -> list[float]:
    """The same training, uninterrupted, in one process on the whole global batch."""
    import torch

    sys.path.insert(0, str(REPO / "examples"))
    try:
        import elastic_train as et
    finally:
        sys.path.pop(0)
    model = et.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        x, y = et.batch(step, 0, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def final_weights(ckpt: Path) -> list[float]:
    import torch

    state = torch.load(ckpt, weights_only=False)
    assert state["step"] > 0
    return [v for t in state["model"].values() for v in t.flatten().tolist()]


def ledger(path: Path) -> list[tuple[int, int]]:
    return [(int(s), int(w)) for s, w in (line.split() for line in path.read_text().splitlines())]


def progress(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_drain_scale_up_drain_loses_no_step(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # Long enough that the undrained node's return (a zygote's start and a round, 5-8 s on a
    # loaded 2-core machine, more under CI's parallel soaks) comes well before the job's end.
    steps = 480
    a, b, c = start_cluster(daemon_factory, 3, "--stop-grace", "20")
    book = tmp_path / "ledger"
    ckpt = tmp_path / "ckpt.pt"
    args = ["--steps", str(steps), "--checkpoint", str(ckpt), "--every", "100000", "--step-time", "0.05"]
    job = submit_job(
        a,
        tmp_path,
        "--nnodes",
        "1:3",
        "--last-call",
        "1",
        str(EXAMPLE),
        "--",
        *args,
        env={"LEDGER": str(book)},
    )

    def at_world(world: int, more_steps: int) -> None:
        wait_for(lambda: any(w == world for _, w in ledger(book)[-3:]) if book.exists() else False, 90, 0.1,
                 f"training at world {world}")  # fmt: skip
        target = progress(book) + more_steps
        wait_for(lambda: progress(book) >= target, 60, 0.1, f"{more_steps} more steps")

    at_world(3, 10)
    assert a.ctl("drain", c.node_id).returncode == 0
    at_world(2, 10)
    assert a.ctl("undrain", c.node_id).returncode == 0
    at_world(3, 10)
    assert a.ctl("drain", b.node_id).returncode == 0
    at_world(2, 5)
    final = a.wait_state(job, ("SUCCEEDED", "FAILED"), 180)
    assert final["state"] == "SUCCEEDED", final
    assert final["restarts"] == 0  # membership changes spend no restart
    entries = ledger(book)
    assert [s for s, _ in entries] == list(range(steps))  # contiguous, no gap, no duplicate
    worlds = [w for i, (_, w) in enumerate(entries) if i == 0 or entries[i - 1][1] != w]
    assert worlds == [3, 2, 3, 2]
    assert final_weights(ckpt) == pytest.approx(reference_weights(steps), rel=1e-4, abs=1e-5)


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_worker_crash_loses_only_steps_since_checkpoint(daemon: DaemonProc, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    steps, every = 120, 10
    book = tmp_path / "ledger"
    ckpt = tmp_path / "ckpt.pt"
    args = ["--steps", str(steps), "--checkpoint", str(ckpt), "--every", str(every), "--step-time", "0.03"]
    job = submit_job(
        daemon, tmp_path, "--nproc-per-node", "2", str(EXAMPLE), "--", *args, env={"LEDGER": str(book)}
    )
    wait_for(lambda: progress(book) >= 45, 90, 0.1, "45 steps")
    victim = daemon.job(job)["pids"][1]
    os.kill(victim, signal.SIGKILL)
    final = daemon.wait_state(job, ("SUCCEEDED", "FAILED"), 180)
    assert final["state"] == "SUCCEEDED" and final["restarts"] == 1
    done = [s for s, _ in ledger(book)]
    assert sorted(set(done)) == list(range(steps))  # nothing missing
    repeated = len(done) - steps
    assert 0 <= repeated <= every  # only what followed the last checkpoint is done again
    first_resume = next(i for i in range(1, len(done)) if done[i] <= done[i - 1])
    assert done[first_resume] % every == 0
    assert final_weights(ckpt) == pytest.approx(reference_weights(steps), rel=1e-4, abs=1e-5)
    assert not alive_pid(victim)


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_worker_helper_runs_under_plain_torchrun(tmp_path: Path) -> None:
    """The same script and helper under torchrun: SIGTERM to the agent stops every rank after the
    same step with a checkpoint, and a second run resumes from it and finishes."""
    import subprocess

    pytest.importorskip("torch")
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun not installed next to this python")
    book, ckpt = tmp_path / "ledger", tmp_path / "ckpt.pt"
    argv = [str(torchrun), "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "--steps", "400",
            "--checkpoint", str(ckpt), "--every", "100000", "--step-time", "0.05"]  # fmt: skip
    env = dict(os.environ, LEDGER=str(book))
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for(lambda: progress(book) >= 20, 120, 0.1, "20 steps under torchrun")
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    import torch

    stopped_at = torch.load(ckpt, weights_only=False)["step"]
    assert stopped_at == progress(book)  # the checkpoint holds every completed step
    argv[argv.index("400")] = str(stopped_at + 10)
    subprocess.run(argv, env=env, check=True, timeout=180, capture_output=True)
    assert [s for s, _ in ledger(book)] == list(range(stopped_at + 10))

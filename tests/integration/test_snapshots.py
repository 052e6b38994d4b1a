"""Memory snapshots under real daemons: a worker SIGKILLed mid-step resumes from the keeper's
memory (no disk read, at most the step it was in redone); a node SIGKILLed is resumed from its
peer's replica; a /dev/shm smaller than the bound is refused at submit."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from elasticd.node import hostmemory
from elasticd.node.snapshotbound import derive
from elasticd.workers.snapshot_program.client import KeeperClient
from tests.support import REPO, DaemonProc, log_events, start_cluster, submit_job, wait_for, wait_log

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
SCRIPT = REPO / "tests" / "scripts" / "snapshot_train.py"


def restored(log: str) -> list[dict[str, str]]:
    return [
        dict(re.findall(r"(\w+)=(\S+)", m)) for m in re.findall(r"elasticd: snapshot\.restored (.*)", log)
    ]


DERIVED = derive(hostmemory.read())  # what a daemon of this host derives when nothing is set


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bound", ["set", "derived"])
def test_a_killed_worker_resumes_from_memory(daemon_factory, tmp_path: Path, bound: str) -> None:  # type: ignore[no-untyped-def]
    """Snapshots are on by default: a daemon with no snapshot_bytes derives its bound from the host."""
    if bound == "derived" and not DERIVED:
        pytest.skip("this host's memory or /dev/shm is too small for a derived bound")
    flags = ("--snapshot-bytes", str(64 << 20)) if bound == "set" else ()
    daemon: DaemonProc = daemon_factory(None, "--slots", "2", *flags)
    node = daemon.call("nodes")["nodes"][0]
    assert node["snapshot_source"] == bound and node["snapshot_bytes"] > 0
    assert f"({bound})" in daemon.ctl("nodes").stdout
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), STEPS="20", CRASH_STEP="12", CRASH_RANK="1")
    env["ELASTICD_SNAPSHOT_PERSIST_EVERY"] = "5"
    res = daemon.ctl(
        "submit",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--follow",
        str(SCRIPT),
        env=env,
        timeout_s=100,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    job_id = res.stdout.splitlines()[0]
    assert daemon.job(job_id)["restarts"] == 1
    ledgers = {
        (a, r): [int(s) for s in (out / f"ledger.{a}.{r}").read_text().split()]
        for a in (0, 1)
        for r in (0, 1)
    }
    assert ledgers[(0, 1)] == list(range(12))  # rank 1 died in step 12
    # Rank 0 may be stopped after step 11's all-reduce but before it wrote step 11 down (a SIGKILL
    # is not waited on), or before its snapshot of it: it is one step behind then, never ahead.
    assert ledgers[(0, 0)] in (list(range(11)), list(range(12)))
    logs = daemon.log_dir / job_id / "attempt_1"
    texts = [(logs / f"rank_{rank}.log").read_text() for rank in (0, 1)]
    assert all([r["source"] for r in restored(t)] == ["memory"] for t in texts), texts
    resumed = sorted({int(restored(t)[0]["step"]) for t in texts})
    # Both resumed at the newest snapshot every rank took, 12 (after step 11) or 11: from memory,
    # where the disk held step 10 only; at most the steps in flight are redone.
    assert resumed in ([11], [12]), (resumed, ledgers)
    assert ledgers[(1, 0)] == ledgers[(1, 1)] == list(range(resumed[0], 20))
    first = (daemon.log_dir / job_id / "attempt_0" / "rank_0.log").read_text()
    assert restored(first) == [] and "snapshot.memory_skipped" in first
    # one keeper served both attempts, and went with the job
    wait_log(daemon, "snapshots.closed", job=job_id)
    assert len(daemon.events("snapshots.spawned")) == 1
    assert json.loads((out / "result.json").read_text())["attempt"] == 1


@pytest.mark.timeout(120)
def test_a_job_that_fails_leaves_its_last_snapshot_in_the_file(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemon: DaemonProc = daemon_factory(None, "--slots", "2", "--snapshot-bytes", str(64 << 20))
    out = tmp_path / "out"
    out.mkdir()
    env = {"STEPS": "20", "CRASH_STEP": "8", "CRASH_RANK": "1", "CRASH_HOW": "raise"}
    env["ELASTICD_SNAPSHOT_PERSIST_EVERY"] = "5"  # rank 0 writes step 5 itself
    job = submit_job(daemon, out, "--nproc-per-node", "2", "--max-restarts", "0", str(SCRIPT), env=env)
    assert daemon.wait_state(job, ("SUCCEEDED", "FAILED"), 90)["state"] == "FAILED"
    # rank 1 raised in step 8; rank 0, the file's writer, was stopped after its snapshot of step 8
    wait_log(daemon, "snapshots.closed", job=job)
    assert [e["step"] for e in log_events(daemon, "snapshots.persisted", job=job)] == [8]
    import torch

    assert torch.load(out / "ckpt.pt", weights_only=False)["step"] == 8
    rank0 = (daemon.log_dir / job / "attempt_0" / "rank_0.log").read_text()
    assert "snapshot.persisted step=5" in rank0 and "snapshot.persisted step=8" not in rank0
    assert not log_events(daemon, "snapshots.lost", job=job)  # its exit after the job's end is no loss


def test_a_dev_shm_smaller_than_the_bound_is_refused_at_submit(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemon: DaemonProc = daemon_factory(None, "--slots", "1", "--snapshot-bytes", str(1 << 44))
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    res = daemon.ctl("submit", str(script))
    assert res.returncode == 3, res.stdout + res.stderr
    assert "snapshot_space" in res.stderr and "/dev/shm" in res.stderr
    assert daemon.call("status")["jobs"] == []


@pytest.mark.timeout(180)
def test_a_lost_node_is_resumed_from_its_peers_replica(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b, spare = start_cluster(daemon_factory, 3, "--snapshot-bytes", str(64 << 20))
    out = tmp_path / "out"
    out.mkdir()
    env = {"STEPS": "12", "PAUSE_STEP": "6", "CRASH_STEP": "-1", "CRASH_RANK": "1"}
    env["ELASTICD_SNAPSHOT_PERSIST_EVERY"] = "0"  # never on disk: only memory can resume it
    job = submit_job(a, out, "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "2",
                     "--nodes", f"{a.node_id},{b.node_id},{spare.node_id}", str(SCRIPT), env=env)  # fmt: skip
    wait_for(lambda: (out / "paused").exists(), 90, 0.1, "rank 1 to stop after step 6")
    ran = [d for d in (a, b, spare) if (d.log_dir / job / "attempt_0").exists()]
    paused_on = next(d for d in ran if (d.log_dir / job / "attempt_0" / "rank_1.log").exists())
    held_on = next(d for d in ran if d is not paused_on)
    spare = next(d for d in (a, b, spare) if d not in ran)
    keeper = KeeperClient(wait_log(held_on, "snapshots.ready", job=job)["socket"])
    name = str((out / "ckpt.pt").absolute())
    wait_for(
        lambda: any(h.replica and h.rank == 1 and h.step == 7 for h in keeper.held(name)),
        30, 0.05, "rank 1's snapshot of step 7 to reach the other node",
    )  # fmt: skip
    keeper.close()
    paused_on.kill9()  # the node is gone: its workers and its keeper with it (the reaper)
    final = held_on.wait_state(job, ("SUCCEEDED", "FAILED"), 120)
    assert final["state"] == "SUCCEEDED", final
    # no file existed to resume from: the first one is the restored snapshot, written behind
    first = held_on.log_dir / job / "attempt_1" / "rank_0.log"
    text = (
        first.read_text()
        if first.exists()
        else (spare.log_dir / job / "attempt_1" / "rank_0.log").read_text()
    )
    # written by the restored rank 0, or (skipped there) by the keeper of the node that held the
    # old rank 0's snapshot, once its workers stopped
    behind = (
        "snapshot.persisted step=7"
        if "snapshot.persisted step=7" in text
        else "snapshot.persist_skipped step=7"
    )
    assert text.index("snapshot.restored source=memory") < text.index(behind)
    assert [int(s) for s in (out / "ledger.1.1").read_text().split()] == list(range(7, 12))
    assert [int(s) for s in (out / "ledger.1.0").read_text().split()] == list(range(7, 12))
    logs = {d.node_id: d.log_dir / job / "attempt_1" for d in (held_on, spare)}
    rank1 = next(p / "rank_1.log" for p in logs.values() if (p / "rank_1.log").exists())
    assert restored(rank1.read_text()) == [{"source": "peer", "rank": "1", "step": "7", "from_rank": "1"}]


def test_a_keeper_that_dies_is_said_and_the_job_goes_on(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemon: DaemonProc = daemon_factory(None, "--slots", "1", "--snapshot-bytes", str(64 << 20))
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(60)\n")
    res = daemon.ctl("submit", "--no-warm", str(script))
    assert res.returncode == 0, res.stderr
    job = res.stdout.splitlines()[0]
    ready = wait_log(daemon, "snapshots.ready", job=job)
    os.kill(ready["pid"], signal.SIGKILL)
    lost = wait_log(daemon, "snapshots.lost", job=job)
    assert lost["pid"] == ready["pid"] and lost["status"] == -signal.SIGKILL
    assert daemon.job(job)["state"] == "RUNNING"
    assert daemon.ctl("kill", job).returncode == 0
    daemon.wait_state(job, ("KILLED",))

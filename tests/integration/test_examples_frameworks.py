"""The Lightning and Hugging Face examples under ``elasticrun`` on the CPU: a worker SIGKILLed
mid-run (its pid from the daemon's records) is restarted, resumes from the memory snapshot of the
last step it saved, and the job finishes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DaemonFactory
from tests.support import PYTHON, REPO, DaemonProc, log_events, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(240), pytest.mark.slow]
EXAMPLES = REPO / "examples"


def restored(log: str) -> list[dict[str, str]]:
    return [
        dict(re.findall(r"(\w+)=(\S+)", m)) for m in re.findall(r"elasticd: snapshot\.restored (.*)", log)
    ]


def elasticrun(
    daemon: DaemonProc, tmp_path: Path, restarts: int, preload: str, *argv: str
) -> subprocess.Popen[str]:
    """``argv`` (a script and its arguments) under elasticrun: 2 ranks, ``restarts`` restarts
    allowed, the zygote importing ``preload`` once for every attempt."""
    env = dict(os.environ, ELASTICD_SOCKET=str(daemon.socket), ELASTICD_SNAPSHOT_PERSIST_EVERY="0")
    cmd = [PYTHON, "-c", "import sys; from elasticctl.run import main; sys.exit(main())",
           "--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts), "--preload", preload,
           *argv]  # fmt: skip
    return subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def kill_rank_1_when_paused(
    daemon: DaemonProc, tmp_path: Path, preload: str, script: str, *argv: str, restarts: int = 1
) -> tuple[str, str]:
    """Run ``script`` under elasticrun (``elasticrun``); once rank 1 says it paused, SIGKILL it;
    the job's id and elasticrun's stdout once it ended (succeeded after one restart, or failed
    with none allowed)."""
    paused = tmp_path / "paused"
    argv = (str(EXAMPLES / script), *argv, "--pause-file", str(paused))
    proc = elasticrun(daemon, tmp_path, restarts, preload, *argv)
    try:
        wait_for(lambda: paused.exists() and paused.read_text().endswith("\n"), 180, 0.1, "rank 1 to pause")
        # the node's published status may lag a rank that pauses fast (its store was up before it)
        job = wait_for(lambda: [j for j in daemon.call("status")["jobs"] if len(j["pids"]) == 2], 30)[0]
        victim = job["pids"][1]
        assert victim == int(paused.read_text())  # the daemon's rank 1 is the worker that paused
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode == 0) == (restarts > 0), (out[-2000:], err[-3000:])
    assert daemon.job(job["id"])["restarts"] == min(restarts, 1)
    return str(job["id"]), out


@pytest.mark.timeout(300)
def test_the_lightning_example_killed_mid_run_resumes_from_memory(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("lightning", reason="the Lightning example needs lightning (the test extra)")
    daemon: DaemonProc = daemon_factory(None, "--slots", "2", "--snapshot-bytes", str(64 << 20))
    job, out = kill_rank_1_when_paused(daemon, tmp_path, "lightning.pytorch", "lightning_train.py",
                                       "--steps", "8", "--pause-at", "5",
                                       "--ckpt-dir", str(tmp_path / "ckpt"))  # fmt: skip
    logs = daemon.log_dir / job / "attempt_1"
    for rank in (0, 1):
        text = (logs / f"rank_{rank}.log").read_text()
        # the snapshot of step 5, though the file (written at the first save only) held step 1
        assert [(r["source"], r["step"]) for r in restored(text)] == [("memory", "5")], text
        assert f"rank {rank}: start at step 5 (attempt 1)" in text, text
    assert "finished at step 8 (attempt 1)" in out, out


@pytest.mark.timeout(300)
def test_the_hugging_face_example_killed_mid_run_resumes_from_memory(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers", reason="the Hugging Face example needs transformers (the test extra)")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (the test extra)")
    daemon: DaemonProc = daemon_factory(None, "--slots", "2", "--snapshot-bytes", str(64 << 20))
    out_dir = tmp_path / "out"
    job, out = kill_rank_1_when_paused(daemon, tmp_path, "transformers.trainer", "hf_train.py",
                                       "--steps", "8", "--pause-at", "5",
                                       "--persist-every", "3", "--output-dir", str(out_dir))  # fmt: skip
    logs = daemon.log_dir / job / "attempt_1"
    for rank in (0, 1):
        text = (logs / f"rank_{rank}.log").read_text()
        # the snapshot of step 5 (each rank its own), though HF's newest directory held step 3
        assert [(r["source"], r["step"], r["from_rank"]) for r in restored(text)] == [
            ("memory", "5", str(rank))
        ], text
        assert f"rank {rank}: start at step 5 (attempt 1)" in text, text
    assert "finished at step 8 (attempt 1)" in out, out
    # HF's layout on disk, as HF writes it, at the end; elasticd's file, behind, up to the end too
    assert sorted(p.name for p in out_dir.glob("checkpoint-*")) == ["checkpoint-8"]
    import torch

    assert torch.load(out_dir / "elasticd-snapshot.pt", weights_only=False)["step"] == 8


@pytest.mark.timeout(300)
def test_a_failed_hugging_face_job_leaves_its_last_step_and_the_next_job_resumes_there(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """No restart allowed: the keeper writes the newest snapshot to ``elasticd-snapshot.pt`` once
    the workers have failed (nothing was persisted in the loop, and HF wrote no directory), before
    elasticrun returns; a new job on the same output directory, whose keepers hold nothing, resumes
    from that file."""
    pytest.importorskip("transformers", reason="the Hugging Face example needs transformers (the test extra)")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (the test extra)")
    daemon: DaemonProc = daemon_factory(None, "--slots", "2", "--snapshot-bytes", str(64 << 20))
    out_dir = tmp_path / "out"
    import torch

    first, _ = kill_rank_1_when_paused(daemon, tmp_path, "transformers.trainer", "hf_train.py",
                                       "--steps", "8", "--pause-at", "5", "--persist-every", "0",
                                       "--output-dir", str(out_dir), restarts=0)  # fmt: skip
    # Written after FAILED, and before elasticrun returned: it waits for this node to wind the job up.
    assert [e["step"] for e in log_events(daemon, "snapshots.persisted", job=first)] == [5]
    assert not list(out_dir.glob("checkpoint-*"))
    assert torch.load(out_dir / "elasticd-snapshot.pt", weights_only=False)["step"] == 5
    again = elasticrun(daemon, tmp_path, 0, "transformers.trainer", str(EXAMPLES / "hf_train.py"),
                       "--steps", "8", "--persist-every", "0", "--output-dir", str(out_dir))  # fmt: skip
    out, err = again.communicate(timeout=180)
    assert again.returncode == 0, (out[-2000:], err[-3000:])
    second = next(p.name for p in daemon.log_dir.iterdir() if p.name != first)
    for rank in (0, 1):
        text = (daemon.log_dir / second / "attempt_0" / f"rank_{rank}.log").read_text()
        assert [(r["source"], r["step"]) for r in restored(text)] == [("disk", "5")], text
        assert f"rank {rank}: start at step 5 (attempt 0)" in text, text
    assert "finished at step 8 (attempt 0)" in out, out

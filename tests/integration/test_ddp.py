"""Real torch.distributed (gloo, CPU): a DDP job crashes once, resumes from its checkpoint, finishes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import REPO, DaemonProc

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
SCRIPT = REPO / "tests" / "scripts" / "ddp_checkpoint.py"


def run(daemon: DaemonProc, out: Path, **env: str) -> tuple[str, dict[str, object]]:
    out.mkdir()
    full = dict(os.environ, OUT=str(out), STEPS="30", CKPT_EVERY="5", **env)
    res = daemon.ctl(
        "submit",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--follow",
        str(SCRIPT),
        env=full,
        timeout_s=180,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.splitlines()[0], json.loads((out / "result.json").read_text())


@pytest.mark.timeout(300)
def test_ddp_crash_resumes_from_checkpoint(daemon: DaemonProc, tmp_path: Path) -> None:
    job_id, result = run(daemon, tmp_path / "crash", CRASH_STEP="12", CRASH_RANK="1")
    status = daemon.job(job_id)
    assert status["state"] == "SUCCEEDED" and status["restarts"] == 1
    assert result["final_step"] == 30 and result["attempt"] == 1 and result["world_size"] == 2
    first = [int(s) for s in (tmp_path / "crash" / "ledger.0").read_text().split()]
    second = [int(s) for s in (tmp_path / "crash" / "ledger.1").read_text().split()]
    assert first == list(range(12))  # rank 1 died at the start of step 12
    assert second == list(range(10, 30))  # resumed from the checkpoint written after step 9
    assert "crashing at step 12" in (daemon.log_dir / job_id / "attempt_0" / "rank_1.log").read_text()

    _, clean = run(daemon, tmp_path / "clean", CRASH_STEP="-1")
    assert clean["attempt"] == 0
    for got, want in zip(result["weights"], clean["weights"], strict=True):  # type: ignore[call-overload]
        assert got == pytest.approx(want, rel=1e-6, abs=1e-7)

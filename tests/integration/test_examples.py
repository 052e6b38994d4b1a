"""The examples from the field run under torchrun and, unchanged, under ``elasticrun``, with the
same result; the snapshot trainer, crashed once under elasticrun, resumes to the result of a run
that never crashed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.diagnose import stacks
from tests.support import PYTHON, REPO, DaemonProc

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(180), pytest.mark.slow]
EXAMPLES = REPO / "examples"


def launch(
    launcher: str, cwd: Path, *argv: str, daemon: DaemonProc, env: dict[str, str] | None = None
) -> str:
    """Run ``argv`` under torchrun (``python -m torch.distributed.run``) or elasticrun; its stdout."""
    full = dict(os.environ) | (env or {})
    if launcher == "torchrun":
        cmd = [PYTHON, "-m", "torch.distributed.run", *argv]
    else:
        cmd = [PYTHON, "-c", "import sys; from elasticctl.run import main; sys.exit(main())", *argv]
        full["ELASTICD_SOCKET"] = str(daemon.socket)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=full, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{launcher} did not end in 150 s; its processes:\n{stacks(argv[-1])}") from exc
    assert res.returncode == 0, (launcher, res.stdout[-2000:], res.stderr[-3000:])
    return res.stdout


def result(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def test_the_mnist_trainer_learns_the_same_weights_under_torchrun_and_elasticrun(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    runs = {}
    for launcher in ("torchrun", "elasticrun"):
        out = tmp_path / f"{launcher}.json"
        launch(launcher, tmp_path, "--standalone", "--nproc-per-node", "2", str(EXAMPLES / "mnist_ddp.py"),
               "--epochs", "3", "--result", str(out), daemon=daemon)  # fmt: skip
        runs[launcher] = result(out)
    assert runs["torchrun"] == runs["elasticrun"]
    assert runs["torchrun"]["world"] == 2 and runs["torchrun"]["accuracy"] > 0.8  # it did learn


def test_the_snapshot_trainer_crashed_once_resumes_to_the_weights_of_a_clean_run(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    trainer = str(EXAMPLES / "snapshot_trainer.py")
    clean = tmp_path / "clean.json"
    launch("torchrun", tmp_path, "--standalone", "--nproc-per-node", "2", trainer, "--epochs", "6",
           "--snapshot", str(tmp_path / "clean" / "snap.pt"), "--result", str(clean),
           daemon=daemon)  # fmt: skip
    # Rank 1 dies in the middle of epoch 3 on the first attempt; elasticd restarts the job once, and
    # the workers pick up the snapshot taken after epoch 2.
    crashed = tmp_path / "crashed.json"
    out = launch("elasticrun", tmp_path, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                 trainer, "--epochs", "6", "--snapshot", str(tmp_path / "crashed" / "snap.pt"),
                 "--result", str(crashed), daemon=daemon, env={"CRASH_AT_EPOCH": "3"})  # fmt: skip
    assert "resuming from" in out and "after epoch 2 (attempt 1)" in out, out
    a, b = result(clean), result(crashed)
    assert (a["attempt"], b["attempt"]) == (0, 1)
    assert (a["epoch"], a["digest"], a["loss"]) == (b["epoch"], b["digest"], b["loss"]) and a["epoch"] == 5

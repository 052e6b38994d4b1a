"""Memory snapshots where torch is installed without numpy (its CPU wheel runs without it): a
2-rank gloo job saves to its keeper, a rank is killed, and both ranks load the snapshot back
(``worker.load_checkpoint``, whose agreement is a collective) with ``import numpy`` failing in
every worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, DaemonProc

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
SCRIPT = REPO / "tests" / "scripts" / "snapshot_train.py"

# Found before the real numpy on the path: an import of numpy fails as if it were not installed,
# and says so in a file, so that the test knows the workers ran with it.
BLOCKER = """\
import os
if os.environ.get("NUMPY_BLOCKED_LOG"):
    with open(os.environ["NUMPY_BLOCKED_LOG"] + f".{os.getpid()}", "w") as f:
        f.write("blocked\\n")
raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
"""


def without_numpy(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import numpy; torch still imports in it."""
    blocker = tmp_path / "no_numpy" / "numpy"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=str(blocker.parent))
    probe = "import torch\ntry:\n    import numpy\nexcept ImportError:\n    print('torch without numpy')\n"
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "torch without numpy", res.stdout + res.stderr
    return env


@pytest.mark.timeout(150)
def test_a_killed_worker_resumes_from_memory_without_numpy(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemon: DaemonProc = daemon_factory(None, "--slots", "2", "--snapshot-bytes", str(64 << 20))
    out = tmp_path / "out"
    out.mkdir()
    env = without_numpy(tmp_path) | {"OUT": str(out), "STEPS": "16", "CRASH_STEP": "9", "CRASH_RANK": "1"}
    env |= {"NUMPY_BLOCKED_LOG": str(out / "numpy_blocked"), "ELASTICD_SNAPSHOT_PERSIST_EVERY": "5"}
    res = daemon.ctl(
        "submit", "--nproc-per-node", "2", "--max-restarts", "1", "--follow", str(SCRIPT),
        env=env, timeout_s=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    job_id = res.stdout.splitlines()[0]
    assert daemon.job(job_id)["restarts"] == 1
    # torch's imports asked for numpy and were refused, in the warm parent (which imports what an
    # optimizer would: each worker then asks no more) or in the workers: the job ran without it
    assert list(out.glob("numpy_blocked.*"))
    for rank in (0, 1):
        text = (daemon.log_dir / job_id / "attempt_1" / f"rank_{rank}.log").read_text()
        assert "snapshot.restored source=memory" in text and "step=9" in text, text
        assert [int(s) for s in (out / f"ledger.1.{rank}").read_text().split()] == list(range(9, 16))
    assert json.loads((out / "result.json").read_text())["attempt"] == 1

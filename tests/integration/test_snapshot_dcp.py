"""torch.distributed.checkpoint on the snapshot keeper, with real gloo ranks and a real keeper
process: a state sharded over 2 ranks is loaded at 1 rank from memory, and from the
directory (the reason said) when no keeper holds it; the directory is written behind, from the
snapshots, a step's files never over another's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticd.netaddr import free_port
from tests.keeper_proc import Keeper
from tests.support import REPO

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
SCRIPT = REPO / "tests" / "scripts" / "dcp_snapshot.py"


@pytest.fixture
def keepers() -> Iterator[list[Keeper]]:
    made: list[Keeper] = []
    yield made
    for k in made:
        k.close()


def run(world: int, keeper: Keeper, out: Path, mode: str, step: int = 3, **more: str) -> list[str]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MODE=mode, OUT=str(out)
        )
        env["STEP"] = str(step)
        env |= more
        env |= {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "ELASTICD_SNAPSHOT_SOCKET": keeper.socket,
        }
        env["PYTHONPATH"] = str(REPO)
        procs.append(
            subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stderr=subprocess.PIPE, text=True)
        )
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [3 if more.get("DIE") else 0] * world, errs
    return errs


@pytest.mark.timeout(120)
def test_sharded_state_resumes_at_another_world_size(keepers: list[Keeper], tmp_path: Path) -> None:
    keepers.append(Keeper())
    run(2, keepers[0], tmp_path, "save")
    want = [float(i) for i in range(24)]
    errs = run(1, keepers[0], tmp_path, "load")  # both shards, from the keeper
    assert "snapshot.restored source=memory" in errs[0] and "step=3" in errs[0], errs
    assert json.loads((tmp_path / "loaded.1.json").read_text()) == {"w": want, "step": 3}
    keepers.append(Keeper())  # a node that holds nothing: the directory, and why
    errs = run(1, keepers[1], tmp_path, "load")
    assert "snapshot.memory_skipped" in errs[0] and "reason=no snapshot in memory" in errs[0], errs
    assert json.loads((tmp_path / "loaded.1.json").read_text()) == {"w": want, "step": 3}


@pytest.mark.timeout(120)
def test_the_directory_is_written_behind_and_a_newer_step_replaces_an_older_one_whole(
    keepers: list[Keeper], tmp_path: Path
) -> None:
    keepers += [Keeper(), Keeper()]
    ckpt = tmp_path / "dcp"
    for step in (3, 4):
        errs = run(2, keepers[0], tmp_path, "save", step)
        assert "snapshot.persisted kind=dcp step=" + str(step) in errs[0], errs
        # each rank's shard in files of its step, the commit's .metadata, no records left, nothing older
        assert sorted(p.name for p in ckpt.iterdir() if p.name != ".elasticd.lock") == [
            ".metadata",
            f"__0_s{step}_0.distcp",
            f"__1_s{step}_0.distcp",
        ]
        errs = run(1, keepers[1], tmp_path, "load")  # no keeper holds it: torch's reader, on the directory
        assert "snapshot.memory_skipped" in errs[0], errs
        want = [float(i + step - 3) for i in range(24)]
        assert json.loads((tmp_path / "loaded.1.json").read_text()) == {"w": want, "step": step}


@pytest.mark.timeout(120)
def test_workers_that_die_leave_the_newest_step_to_their_keepers(
    keepers: list[Keeper], tmp_path: Path
) -> None:
    """No write behind in the loop, and none at exit (the ranks end as a SIGKILL ends them): once
    told the group stopped, the keeper writes each rank's shards and the commit of the newest
    step whose metadata it holds, as the submitter; torch's reader loads it."""
    keepers += [Keeper(), Keeper()]
    ckpt = tmp_path / "dcp"
    run(2, keepers[0], tmp_path, "save", 3, PERSIST="0", DIE="1")
    run(2, keepers[0], tmp_path, "save", 4, PERSIST="0", DIE="1")
    assert not (ckpt / ".metadata").exists()
    keepers[0].ctl.send(json.dumps({"op": "persist"}).encode())  # the daemon: the group stopped
    keepers[0].ctl.settimeout(120)
    reports: list[dict[str, Any]] = []
    while sum(r["ev"] in ("persisted", "persist_failed") for r in reports) < 5:  # 2 steps x 2 ranks, 1 commit
        reports.append(json.loads(keepers[0].ctl.recv(4096)))
    assert all(r["ev"] != "persist_failed" for r in reports), reports
    assert sorted(p.name for p in ckpt.iterdir() if p.name != ".elasticd.lock") == [
        ".metadata",
        "__0_s4k_0.distcp",
        "__1_s4k_0.distcp",
    ]
    errs = run(1, keepers[1], tmp_path, "load")
    assert "snapshot.memory_skipped" in errs[0], errs
    assert json.loads((tmp_path / "loaded.1.json").read_text()) == {
        "w": [float(i + 1) for i in range(24)],
        "step": 4,
    }

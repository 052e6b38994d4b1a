"""``save_checkpoint``/``load_checkpoint`` against a real keeper process, in this process (no
daemon, one rank): the file written behind every N snapshots and at once on a stop, the fallbacks
to disk (``memory=False``, over the bound, the keeper gone), and where a load comes from."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.keeper_proc import Keeper
from tests.users import NOBODY, SYSTEM_PYTHON, other_users

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture
def snapshots(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Keeper]]:
    """A fresh ``Snapshots`` for each test, pointed at the keeper the test starts."""
    from elasticd import worker
    from elasticd.workers.snapshot_program import memory

    keepers: list[Keeper] = []

    def start(bound: int = 64 << 20) -> Keeper:
        keeper = Keeper(bound, address="")
        keepers.append(keeper)
        monkeypatch.setenv("ELASTICD_SNAPSHOT_SOCKET", keeper.socket)
        fresh = memory.Snapshots()
        for name in ("save", "restore", "flush"):
            monkeypatch.setattr(memory, name, getattr(fresh, name))
        monkeypatch.setattr(memory, "SNAPSHOTS", fresh)
        return keeper

    monkeypatch.setattr(worker, "_STOPS", [])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # a first save chains its own
    yield start  # type: ignore[misc]
    for keeper in keepers:
        keeper.close()


def state(step: int) -> dict[str, object]:
    return {"step": step, "w": torch.full((256,), float(step))}


def on_disk(path: Path) -> int | None:
    return int(torch.load(path, weights_only=False)["step"]) if path.exists() else None


def test_the_file_follows_every_n_snapshots_and_at_once_on_a_stop(
    snapshots: type[Keeper], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from elasticd import worker
    from elasticd.workers.snapshot_program import memory

    snapshots()
    monkeypatch.setenv("ELASTICD_SNAPSHOT_PERSIST_EVERY", "3")
    ckpt = tmp_path / "ckpt.pt"
    for step in (1, 2):
        worker.save_checkpoint(state(step), ckpt)
    memory.flush()
    assert on_disk(ckpt) is None  # memory only
    worker.save_checkpoint(state(3), ckpt)
    memory.flush()
    assert on_disk(ckpt) == 3
    stop = worker.GracefulStop()
    try:
        stop._handle(signal.SIGTERM, None)
        worker.save_checkpoint(state(4), ckpt)
        assert on_disk(ckpt) == 4  # written before save_checkpoint returned
    finally:
        stop.restore()
    loaded = worker.load_checkpoint(ckpt)
    assert loaded["step"] == 4 and torch.equal(loaded["w"], state(4)["w"])


def test_disk_whenever_memory_cannot(snapshots, tmp_path: Path, capfd) -> None:  # type: ignore[no-untyped-def]
    from elasticd import worker

    keeper = snapshots(bound=4 << 20)  # two segments of 2 MiB
    ckpt = tmp_path / "ckpt.pt"
    worker.save_checkpoint(state(1), ckpt, memory=False)
    assert on_disk(ckpt) == 1
    big = {"step": 2, "w": torch.zeros(1 << 20)}  # 4 MiB: over the bound
    worker.save_checkpoint(big, ckpt)
    assert on_disk(ckpt) == 2
    assert "snapshot.unavailable" in capfd.readouterr().err
    snapshots()  # a new keeper (a new node's): nothing in memory, so the file, and why
    keeper.close()
    assert worker.load_checkpoint(ckpt)["step"] == 2
    err = capfd.readouterr().err
    assert "snapshot.memory_skipped rank=0 reason=no snapshot in memory" in err
    assert "snapshot.restored source=disk step=2" in err


def test_a_script_that_ends_leaves_its_newest_snapshot_in_the_file(snapshots, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from elasticd import worker
    from elasticd.workers.snapshot_program import memory

    snapshots()
    ckpt = tmp_path / "ckpt.pt"
    for step in (1, 2):
        worker.save_checkpoint(state(step), ckpt, persist_every=10)
    memory.flush()
    assert on_disk(ckpt) is None
    memory.SNAPSHOTS.at_exit()  # what atexit runs at a normal exit
    assert on_disk(ckpt) == 2


@other_users
def test_no_other_user_reaches_a_jobs_keeper() -> None:
    import subprocess

    from elasticd.workers.snapshot_program.client import KeeperClient, SnapshotError

    keeper = Keeper(uid=NOBODY, address="", python=SYSTEM_PYTHON)  # a job of uid nobody
    try:
        where = Path(keeper.socket).parent
        assert where.stat().st_uid == NOBODY and where.stat().st_mode & 0o777 == 0o700
        # root can open the path, but the keeper hangs up on any uid but its own
        with pytest.raises(SnapshotError):
            KeeperClient(keeper.socket).held("/c.pt")
        # another user cannot even reach the socket
        probe = f"import socket as s; s.socket(s.AF_UNIX, s.SOCK_SEQPACKET).connect({keeper.socket!r})"
        other = subprocess.run(
            [SYSTEM_PYTHON, "-c", probe],
            user=NOBODY - 1,
            group=NOBODY - 1,
            extra_groups=[],
            capture_output=True,
        )
        assert other.returncode != 0 and b"PermissionError" in other.stderr
    finally:
        keeper.close()


def test_a_state_without_a_step_numbers_on_from_the_restored_one(snapshots, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from elasticd import worker
    from elasticd.workers.snapshot_program import memory

    snapshots()
    ckpt = tmp_path / "ckpt.pt"
    for i in range(3):
        worker.save_checkpoint({"w": torch.full((4,), float(i))}, ckpt)  # steps 0, 1, 2 by count
    assert worker.load_checkpoint(ckpt)["w"][0] == 2.0
    fresh = memory.Snapshots()  # the next worker process: its count starts again
    memory.SNAPSHOTS, memory.save, memory.restore = fresh, fresh.save, fresh.restore
    assert worker.load_checkpoint(ckpt)["w"][0] == 2.0
    worker.save_checkpoint({"w": torch.full((4,), 3.0)}, ckpt)  # step 3, not 0
    assert worker.load_checkpoint(ckpt)["w"][0] == 3.0


def test_a_failing_script_leaves_its_newest_snapshot_to_the_keeper(snapshots, tmp_path: Path, capfd) -> None:  # type: ignore[no-untyped-def]
    """An uncaught exception: the worker does not write at exit (that would hold the group's
    stop); its keeper writes the newest snapshot once told the group stopped, and a later
    worker's write of an older step is skipped (the file never goes back)."""
    from elasticd import worker
    from elasticd.workers.snapshot_program import memory

    keeper = snapshots()
    ckpt = tmp_path / "ckpt.pt"
    for step in (1, 2, 3):
        worker.save_checkpoint(state(step), ckpt, persist_every=2)
    memory.flush()
    assert on_disk(ckpt) == 2
    sys.excepthook(RuntimeError, RuntimeError("the loss is nan"), None)  # what an uncaught one runs
    memory.SNAPSHOTS.at_exit()
    assert on_disk(ckpt) == 2 and "snapshot.persist_left" in capfd.readouterr().err
    keeper.ctl.send(json.dumps({"op": "persist"}).encode())  # the daemon: the group stopped
    keeper.ctl.settimeout(120)
    reports = [json.loads(keeper.ctl.recv(4096)) for _ in range(2)]
    assert [(r["ev"], r["step"]) for r in reports] == [("persisting", 3), ("persisted", 3)], reports
    assert on_disk(ckpt) == 3
    assert not memory.may_write(memory.SNAPSHOTS.client(), str(ckpt.absolute()), 3)

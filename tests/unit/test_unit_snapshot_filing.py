"""The keeper's writes behind (``snapshot_program.filing``): which snapshot it writes when the
workers stop, the order a worker's own write takes after it, its children's ends and bound, and
the daemon's reading of its reports."""

from __future__ import annotations

import os
import select
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.workers.snapshot_program import filing
from elasticd.workers.snapshot_program import keeper as k
from elasticd.workers.snapshot_program.protocol import Report, WriteReport
from elasticd.workers.snapshot_program.replies import SKIP, WAIT, WRITE, Claimed, Committed
from elasticd.workers.snapshot_program.requests import Begin, Claim, Commit, Written
from elasticd.workers.warm.snapshotkeeper import parse_report
from tests.unit.test_unit_snapshots import begun, frame_bytes


def commit(keeper: k.Keeper, step: int, rank: int = 0, file: bool = True, name: str = "/c.pt") -> None:
    reply, fd = begun(keeper.handle(Begin(name, rank, step, 100, file, "/lib")))
    frame_bytes(keeper, reply, fd, step, b"x" * 50)
    done, _ = keeper.handle(Commit(name, rank, reply.slot, reply.gen))
    assert isinstance(done, Committed)


def close_all(keeper: k.Keeper) -> None:
    for pair in [*keeper.slots.values(), *keeper.replicas.values()]:
        for slot in pair:
            if slot.fd >= 0:
                os.close(slot.fd)


@given(
    st.booleans(),
    st.integers(-1, 9),
    st.integers(-1, 9),
    st.one_of(st.none(), st.integers(0, 9)),
    st.integers(0, 9),
)
def test_the_keeper_writes_only_newer_fresh_steps_and_a_worker_never_writes_behind_it(
    dirty: bool, on_disk: int, running: int, newest: int | None, step: int
) -> None:
    filed = filing.Filed(0)
    filed.dirty, filed.on_disk, filed.running = dirty, on_disk, running
    written = max(on_disk, running)
    assert filing.due(filed, newest) == (dirty and newest is not None and newest > written)
    verdict = filing.claim(filed, step)
    if step <= written:
        assert verdict == SKIP  # the file has it, or the keeper's write of it (or newer) runs
    else:
        assert verdict == (WAIT if running >= 0 else WRITE)  # lands after the keeper's
    assert filing.claim(None, step) == WRITE  # a file this keeper never wrote from


def test_the_newest_snapshot_of_the_writing_rank_is_taken_once_and_pinned() -> None:
    keeper = k.Keeper(64 << 20)
    for step in (1, 2, 3):
        commit(keeper, step)
    commit(keeper, 5, rank=1, file=False)  # another rank's snapshot of the same checkpoint
    commit(keeper, 9, name="/other.pt", file=False)  # a name no rank writes a file of
    keeper.handle(Written("/c.pt", 2))  # the worker's every-N write
    [due] = keeper.take_due()
    assert (due.name, due.step, due.lib) == ("/c.pt", 3, "/lib") and due.length > 0
    with pytest.raises(OSError):
        os.pwrite(due.fd, b"x", 0)  # read-only
    os.close(due.fd)
    pair = keeper.slots[("/c.pt", 0)]
    assert pair[k.newest(pair)].pinned  # the next snapshots go elsewhere while the child reads it
    assert keeper.take_due() == []  # nothing committed since: a second stop writes nothing
    # a worker restored from step 3 skips it; one at step 4 waits for the keeper's write
    skip, none = keeper.handle(Claim("/c.pt", 3))
    assert skip == Claimed(SKIP) and none is None
    waiter_r, waiter_w = os.pipe()
    keeper.writing("/c.pt", waiter_r)
    wait, end = keeper.handle(Claim("/c.pt", 4))
    assert wait == Claimed(WAIT) and end is not None
    os.close(waiter_w)  # the child ends
    assert select.select([end], [], [], 1)[0] == [end] and os.read(end, 1) == b""
    os.close(end)
    keeper.wrote("/c.pt", 3, ok=True)
    os.close(waiter_r)
    assert keeper.handle(Claim("/c.pt", 4))[0] == Claimed(WRITE)
    commit(keeper, 4)
    keeper.handle(Written("/c.pt", 4))
    assert keeper.take_due() == []  # the worker wrote its newest itself (a planned stop)
    close_all(keeper)


def test_a_checkpoint_directorys_shards_are_filed_per_rank_and_both_held_steps_are_written() -> None:
    """Every rank snapshots its shard under one name: each is filed on its own, and both of its
    complete steps newer than the directory go (the coordinator commits the newest step whose
    metadata it holds; a rank may hold the next step's shard already)."""
    keeper, shards, meta = k.Keeper(64 << 20), "/d#dcp", "/d#dcp-meta"
    for rank in (0, 1):
        for step in (3, 4):
            commit(keeper, step, rank=rank, name=shards)
    commit(keeper, 3, name=meta)
    keeper.handle(Written(f"{shards}@1", 3))  # rank 1's thread wrote step 3
    due = keeper.take_due()
    assert sorted((d.name, d.step) for d in due) == [
        ("/d#dcp-meta", 3), ("/d#dcp@0", 3), ("/d#dcp@0", 4), ("/d#dcp@1", 4)
    ]  # fmt: skip
    for d in due:
        os.close(d.fd)
    assert keeper.take_due() == []
    close_all(keeper)


@given(st.text(max_size=8), st.integers(0, 99))
def test_a_shards_file_key_names_its_rank_and_gives_its_snapshots_name_back(name: str, rank: int) -> None:
    shards = f"/ckpt/{name}{filing.DCP_SHARDS}"
    assert filing.file_key(shards, rank) == f"{shards}@{rank}"
    assert filing.slot_name(filing.file_key(shards, rank)) == shards
    plain = f"/ckpt/{name}.pt"
    assert filing.file_key(plain, rank) == plain and filing.slot_name(plain) == plain


def test_a_failed_write_is_not_retried_at_the_next_stop() -> None:
    keeper = k.Keeper(64 << 20)
    commit(keeper, 1)
    [due] = keeper.take_due()
    os.close(due.fd)
    keeper.wrote("/c.pt", due.step, ok=False)
    assert keeper.filed["/c.pt"].on_disk == -1 and keeper.take_due() == []
    close_all(keeper)


class FakeFiles:
    def __init__(self, due: list[filing.Due]) -> None:
        self.due = due
        self.ended: list[tuple[str, int, bool]] = []
        self.waiters: dict[str, int] = {}

    def take_due(self) -> list[filing.Due]:
        due, self.due = self.due, []
        return due

    def writing(self, name: str, waiter: int) -> None:
        self.waiters[name] = waiter

    def wrote(self, name: str, step: int, ok: bool) -> None:
        self.ended.append((name, step, ok))


def run_behind(monkeypatch: pytest.MonkeyPatch, child: str, timeout_s: float = 60.0) -> list[WriteReport]:
    """``Behind`` as the keeper's loop drives it, with ``child`` as the persister's program."""
    monkeypatch.setattr(filing, "CHILD", child)
    said: list[WriteReport] = []
    fd = os.open("/dev/null", os.O_RDONLY)
    files = FakeFiles([filing.Due("/c.pt", fd, 10, 7, "")])
    behind = filing.Behind(files, said.append)
    behind.start()
    deadline = time.monotonic() + timeout_s
    while behind.children and time.monotonic() < deadline:
        ready, _, _ = select.select(behind.fds(), [], [], behind.timeout())
        behind.read(ready)
        behind.poll()
    assert not behind.children and len(files.ended) == 1
    return said


def test_a_writes_end_says_how_it_went() -> None:
    assert filing.outcome(0, False, b"noise\n") == (True, "")
    assert filing.outcome(1, False, b"Traceback\nOSError: No space left\n") == (
        False,
        "OSError: No space left",
    )
    assert filing.outcome(-9, False, b"") == (False, "exit status -9")
    assert filing.outcome(0, True, b"") == (False, f"timed out after {filing.WRITE_TIMEOUT_S:.0f} s")
    assert len(filing.outcome(1, False, b"x" * 1000)[1]) == filing.MAX_TAIL


def test_a_childs_end_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    said = run_behind(monkeypatch, "pass")
    assert [m.report for m in said] == [Report.PERSISTING, Report.PERSISTED] and said[1].step == 7
    said = run_behind(
        monkeypatch, "import sys; print('noise\\nOSError: No space left', file=sys.stderr); sys.exit(1)"
    )
    assert said[-1].report is Report.PERSIST_FAILED and said[-1].reason == "OSError: No space left"


def test_a_child_over_the_bound_is_killed_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filing, "WRITE_TIMEOUT_S", 0.3)
    said = run_behind(monkeypatch, "import time; time.sleep(60)", timeout_s=20)
    assert said[-1].report is Report.PERSIST_FAILED and "timed out" in said[-1].reason


def test_the_keepers_reports_are_untrusted() -> None:
    persisted = parse_report(b'{"ev": "persisted", "step": 8, "took_s": 1.5}')
    assert persisted == WriteReport(Report.PERSISTED, 8, took_s=1.5)
    assert persisted.fields() == {"step": 8, "took_s": 1.5}
    failed = parse_report(b'{"ev": "persist_failed", "step": 8, "reason": "' + b"r" * 900 + b'", "x": 1}')
    assert failed.fields() == {"step": 8, "reason": "r" * 300}
    assert "took_s" not in parse_report(b'{"ev": "persisting", "step": 1, "took_s": true}').fields()
    for bad in (
        b'{"ev": "persisted", "step": -1}',
        b'{"ev": "persisted", "step": "8"}',
        b'{"ev": "exec", "step": 1}',
        b"[]",
        b"[" * 5000,
        b"x" * 2000,
    ):
        with pytest.raises(ValueError):
            parse_report(bad)

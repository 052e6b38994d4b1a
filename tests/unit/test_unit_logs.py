"""elasticd.jobs.logs.read_new: cursor-based reading of a job's per-rank logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elasticd.jobs.logs import Chunk, log_files, read_new

JOB = "train-1"
A0R0 = "attempt_0/rank_0.log"
A0R1 = "attempt_0/rank_1.log"
A1R0 = "attempt_1/rank_0.log"


def write(log_dir: Path, name: str, data: str, append: bool = False) -> None:
    path = log_dir / JOB / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w") as f:
        f.write(data)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    write(tmp_path, A0R0, "a0r0 line1\na0r0 line2\n")
    write(tmp_path, A0R1, "a0r1 line1\n")
    write(tmp_path, A1R0, "a1r0 line1\n")
    return tmp_path


def test_order_is_attempt_then_rank(log_dir: Path) -> None:
    chunks, cursor = read_new(log_dir, JOB, {})
    assert chunks == [
        Chunk(0, 0, "a0r0 line1\na0r0 line2\n"),
        Chunk(0, 1, "a0r1 line1\n"),
        Chunk(1, 0, "a1r0 line1\n"),
    ]
    assert cursor == {A0R0: 22, A0R1: 11, A1R0: 11}


def test_numeric_order_not_lexical(tmp_path: Path) -> None:
    for attempt, rank in [(10, 0), (2, 10), (2, 9)]:
        write(tmp_path, f"attempt_{attempt}/rank_{rank}.log", f"{attempt}/{rank}\n")
    assert log_files(tmp_path, JOB) == [(2, 9), (2, 10), (10, 0)]
    chunks, _ = read_new(tmp_path, JOB, {})
    assert [(c.attempt, c.rank) for c in chunks] == [(2, 9), (2, 10), (10, 0)]


def test_other_files_are_ignored(log_dir: Path) -> None:
    write(log_dir, "attempt_0/error_0.json", "{}\n")
    write(log_dir, "attempt_x/rank_0.log", "x\n")
    write(log_dir, "attempt_0/rank_a.log", "x\n")
    write(log_dir, "rank_0.log", "x\n")
    assert log_files(log_dir, JOB) == [(0, 0), (0, 1), (1, 0)]


def test_unknown_job_has_no_logs(tmp_path: Path) -> None:
    assert read_new(tmp_path, "nope", {"x": 1}) == ([], {"x": 1})


def test_cursor_advances_and_nothing_is_read_twice(log_dir: Path) -> None:
    _, cursor = read_new(log_dir, JOB, {})
    assert read_new(log_dir, JOB, cursor) == ([], cursor)
    write(log_dir, A0R1, "a0r1 line2\n", append=True)
    chunks, cursor2 = read_new(log_dir, JOB, cursor)
    assert chunks == [Chunk(0, 1, "a0r1 line2\n")]
    assert cursor2 == cursor | {A0R1: 22}


def test_input_cursor_is_not_mutated(log_dir: Path) -> None:
    cursor: dict[str, int] = {A0R0: 11}
    _, out = read_new(log_dir, JOB, cursor)
    assert cursor == {A0R0: 11}
    assert out[A0R0] == 22


def test_resume_from_a_cursor(log_dir: Path) -> None:
    chunks, _ = read_new(log_dir, JOB, {A0R0: 11, A0R1: 11})
    assert chunks == [Chunk(0, 0, "a0r0 line2\n"), Chunk(1, 0, "a1r0 line1\n")]


def test_partial_last_line_is_withheld(tmp_path: Path) -> None:
    write(tmp_path, A0R0, "done\npart")
    chunks, cursor = read_new(tmp_path, JOB, {})
    assert chunks == [Chunk(0, 0, "done\n")]
    assert cursor == {A0R0: 5}

    write(tmp_path, A0R0, "ial\n", append=True)
    chunks, cursor = read_new(tmp_path, JOB, cursor)
    assert chunks == [Chunk(0, 0, "partial\n")]
    assert cursor == {A0R0: 13}


def test_only_a_partial_line_gives_nothing(tmp_path: Path) -> None:
    write(tmp_path, A0R0, "no newline yet")
    assert read_new(tmp_path, JOB, {}) == ([], {})


def test_whole_returns_the_partial_line(tmp_path: Path) -> None:
    write(tmp_path, A0R0, "done\npart")
    chunks, cursor = read_new(tmp_path, JOB, {}, whole=True)
    assert chunks == [Chunk(0, 0, "done\npart")]
    assert cursor == {A0R0: 9}


@pytest.mark.parametrize(("rank", "expected"), [(0, [(0, 0), (1, 0)]), (1, [(0, 1)]), (7, [])])
def test_rank_filter(log_dir: Path, rank: int, expected: list[tuple[int, int]]) -> None:
    chunks, cursor = read_new(log_dir, JOB, {}, rank=rank)
    assert [(c.attempt, c.rank) for c in chunks] == expected
    assert set(cursor) == {f"attempt_{a}/rank_{r}.log" for a, r in expected}


def test_max_bytes_budget_spans_files(log_dir: Path) -> None:
    # a0r0 is 22 bytes, a0r1 and a1r0 11 each
    chunks, cursor = read_new(log_dir, JOB, {}, max_bytes=33)
    assert [(c.attempt, c.rank) for c in chunks] == [(0, 0), (0, 1)]
    assert cursor == {A0R0: 22, A0R1: 11}

    chunks, cursor = read_new(log_dir, JOB, cursor, max_bytes=33)
    assert chunks == [Chunk(1, 0, "a1r0 line1\n")]
    assert cursor == {A0R0: 22, A0R1: 11, A1R0: 11}


def test_max_bytes_limits_a_single_read(log_dir: Path) -> None:
    chunks, cursor = read_new(log_dir, JOB, {}, max_bytes=11)
    assert chunks == [Chunk(0, 0, "a0r0 line1\n")]
    assert cursor == {A0R0: 11}
    total = sum(len(c.text) for c in chunks)
    assert total <= 11


def test_zero_budget_reads_nothing(log_dir: Path) -> None:
    assert read_new(log_dir, JOB, {}, max_bytes=0) == ([], {})


def test_a_line_longer_than_the_budget_still_makes_progress(tmp_path: Path) -> None:
    write(tmp_path, A0R0, "x" * 100 + "\n")
    text = ""
    cursor: dict[str, int] = {}
    for _ in range(10):
        chunks, cursor = read_new(tmp_path, JOB, cursor, max_bytes=40)
        text += "".join(c.text for c in chunks)
    assert text == "x" * 100 + "\n"


def test_undecodable_bytes_are_replaced(tmp_path: Path) -> None:
    path = tmp_path / JOB / A0R0
    path.parent.mkdir(parents=True)
    path.write_bytes(b"ok \xff\xfe\n")
    chunks, _ = read_new(tmp_path, JOB, {})
    assert chunks == [Chunk(0, 0, "ok \ufffd\ufffd\n")]


def test_budget_never_cuts_a_line_when_a_whole_line_fits(tmp_path: Path) -> None:
    write(tmp_path, A0R0, "aaaa\nbbbb\n")
    chunks, cursor = read_new(tmp_path, JOB, {}, max_bytes=7)
    assert chunks == [Chunk(0, 0, "aaaa\n")]
    assert cursor == {A0R0: 5}


# -- nothing outside the tree is ever read (the daemon reads as root for whoever asks) -----------


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret" / "key"
    path.parent.mkdir(mode=0o700)
    path.write_text("root only\n")
    path.chmod(0o600)
    return path


def texts(log_dir: Path, job: str = JOB) -> str:
    return "".join(c.text for c in read_new(log_dir, job, {}, whole=True)[0])


def test_a_symlinked_log_is_skipped(log_dir: Path, secret: Path) -> None:
    os.symlink(secret, log_dir / JOB / "attempt_1" / "rank_5.log")
    assert (1, 5) in log_files(log_dir, JOB)  # listed, but never followed
    assert "root only" not in texts(log_dir)
    assert "a1r0 line1" in texts(log_dir)


@pytest.mark.parametrize("where", ["attempt_7", "job"])
def test_a_symlinked_directory_is_skipped(tmp_path: Path, secret: Path, where: str) -> None:
    (secret.parent / "rank_0.log").write_text("root only\n")
    if where == "job":
        os.symlink(secret.parent, tmp_path / JOB)
    else:
        (tmp_path / JOB).mkdir()
        os.symlink(secret.parent, tmp_path / JOB / where)
    assert log_files(tmp_path, JOB) == []
    assert texts(tmp_path) == ""


def test_a_fifo_is_skipped_without_blocking(log_dir: Path) -> None:
    os.mkfifo(log_dir / JOB / "attempt_1" / "rank_3.log")
    assert texts(log_dir).endswith("a1r0 line1\n")


@pytest.mark.parametrize("job", ["..", ".", "a/b", "", "../" + JOB])
def test_job_names_cannot_leave_the_tree(log_dir: Path, job: str) -> None:
    assert log_files(log_dir / JOB, job) == []
    assert read_new(log_dir, job, {}) == ([], {})


def test_a_writable_attempt_dir_is_not_read(log_dir: Path) -> None:
    (log_dir / JOB / "attempt_1").chmod(0o777)
    assert log_files(log_dir, JOB) == [(0, 0), (0, 1)]

"""elasticd.jobs.logs: cursor-based reading of a job's per-rank logs (whole lines, partial reads, tails)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from elasticd.jobs import logs
from elasticd.jobs.logs import Chunk, attempt_starts, log_files, read_logs, tail_start

JOB = "train-1"
A0R0 = "attempt_0/rank_0.log"
A0R1 = "attempt_0/rank_1.log"
A1R0 = "attempt_1/rank_0.log"


def write(log_dir: Path, name: str, data: str, append: bool = False) -> None:
    path = log_dir / JOB / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w") as f:
        f.write(data)


def read_new(
    log_dir: Path, job_id: str, cursor: dict[str, int], **how: Any
) -> tuple[list[Chunk], dict[str, int]]:
    """``read_logs`` as a following client uses it: the chunks and the cursor to poll with next."""
    read = read_logs(log_dir, job_id, cursor, **how)
    return read.chunks, read.cursor


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


# -- tail, attempts, partial reads ---------------------------------------------------------------------
def lines(n: int, tag: str) -> str:
    return "".join(f"{tag} {i}\n" for i in range(n))


@pytest.mark.parametrize(
    ("data", "asked", "expected"),
    [
        ("a\nb\nc\n", 2, ("b\nc\n", 2)),
        ("a\nb\nc", 2, ("b\nc", 2)),  # an unfinished last line is one
        ("a\nb\nc\n", 3, ("a\nb\nc\n", 3)),
        ("a\nb\nc\n", 9, ("a\nb\nc\n", 3)),  # fewer than asked: the whole file
        ("a\nb\nc\n", 0, ("", 0)),
        ("\n\n", 1, ("\n", 1)),
        ("", 4, ("", 0)),
    ],
)
def test_tail_start(tmp_path: Path, data: str, asked: int, expected: tuple[str, int]) -> None:
    write(tmp_path, A0R0, data)
    offset, found = tail_start(tmp_path, (JOB, "attempt_0", "rank_0.log"), asked)
    assert (data.encode()[offset:].decode(), found) == expected


def test_tail_start_reads_back_block_by_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "TAIL_BLOCK", 7)
    write(tmp_path, A0R0, lines(50, "line"))
    offset, found = tail_start(tmp_path, (JOB, "attempt_0", "rank_0.log"), 12)
    assert found == 12 and (tmp_path / JOB / A0R0).read_bytes()[offset:].decode() == "".join(
        f"line {i}\n" for i in range(38, 50)
    )


def test_tail_is_per_rank_over_attempts(tmp_path: Path) -> None:
    write(tmp_path, A0R0, lines(5, "a0r0"))
    write(tmp_path, A0R1, lines(5, "a0r1"))
    write(tmp_path, A1R0, lines(2, "a1r0"))  # rank 0's last 3 lines: one of attempt 0, two of 1
    write(tmp_path, "attempt_2/rank_1.log", lines(4, "a2r1"))  # rank 1: all in attempt 2
    read = read_logs(tmp_path, JOB, {}, tail=3)
    assert [(c.attempt, c.rank, c.text) for c in read.chunks] == [
        (0, 0, "a0r0 4\n"),
        (1, 0, "a1r0 0\na1r0 1\n"),
        (2, 1, "a2r1 1\na2r1 2\na2r1 3\n"),
    ]
    # Every chosen log is in the cursor (attempt 0 of rank 1 at its end): no later read shows it.
    assert read.cursor[A0R1] == len(lines(5, "a0r1"))
    assert read_logs(tmp_path, JOB, read.cursor).chunks == []
    write(tmp_path, A1R0, "more\n", append=True)
    assert [c.text for c in read_logs(tmp_path, JOB, read.cursor, tail=1).chunks] == ["more\n"]


def test_tail_applies_to_logs_the_cursor_does_not_name(tmp_path: Path) -> None:
    write(tmp_path, A0R0, lines(3, "old"))
    cursor = read_logs(tmp_path, JOB, {}).cursor
    write(tmp_path, A1R0, lines(3, "new"))  # a new attempt while following: shown whole
    assert [c.text for c in read_logs(tmp_path, JOB, cursor).chunks] == [lines(3, "new")]


def test_attempts_and_rank_filter(log_dir: Path) -> None:
    read = read_logs(log_dir, JOB, {}, attempts={0})
    assert [(c.attempt, c.rank) for c in read.chunks] == [(0, 0), (0, 1)]
    read = read_logs(log_dir, JOB, {}, attempts={1}, rank=1)
    assert read.chunks == [] and read.cursor == {}


def test_more_says_the_budget_ran_out(log_dir: Path) -> None:
    first = read_logs(log_dir, JOB, {}, max_bytes=30)
    assert first.more
    rest = read_logs(log_dir, JOB, first.cursor)
    assert not rest.more and [c.attempt for c in rest.chunks] == [0, 1]


def test_partial_reads_send_unfinished_lines_but_no_cut_character(tmp_path: Path) -> None:
    write(tmp_path, A0R0, "done\n\r 10%|#")
    read = read_logs(tmp_path, JOB, {}, partial=True)
    assert [c.text for c in read.chunks] == ["done\n\r 10%|#"]
    bar = "\r 20%|█".encode()
    path = tmp_path / JOB / A0R0
    with open(path, "ab") as f:
        f.write(bar[:-1])  # "█" is 3 bytes: 2 of them are there
    again = read_logs(tmp_path, JOB, read.cursor, partial=True)
    assert [c.text for c in again.chunks] == ["\r 20%|"]
    with open(path, "ab") as f:
        f.write(bar[-1:])
    assert [c.text for c in read_logs(tmp_path, JOB, again.cursor, partial=True).chunks] == ["█"]


@pytest.mark.parametrize(
    ("data", "kept"),
    [(b"abc", 3), ("é".encode(), 2), ("é".encode()[:1], 0), ("a€".encode()[:-1], 1), ("a𝄞".encode(), 5),
     ("a𝄞".encode()[:-1], 1), (b"\x80\x80", 2), (b"", 0)],
)  # fmt: skip
def test_complete_chars(data: bytes, kept: int) -> None:
    assert logs._complete_chars(data) == kept


def test_attempt_starts_are_their_directories_mtimes(log_dir: Path) -> None:
    os.utime(log_dir / JOB / "attempt_0", (1000.0, 1000.0))
    os.utime(log_dir / JOB / "attempt_1", (2000.0, 2000.0))
    (log_dir / JOB / "attempt_x").mkdir()
    os.symlink(log_dir / JOB / "attempt_1", log_dir / JOB / "attempt_7")
    assert attempt_starts(log_dir, JOB) == {0: 1000.0, 1: 2000.0}

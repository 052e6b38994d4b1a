"""The progress line protocol and its splitter: strict, bounded, never trusting the worker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from elasticd.progress.protocol import MAX_LINE, LineSplitter, Phase, PhaseReport, StepReport, parse_line


def test_valid_lines() -> None:
    assert parse_line(b"step 12") == StepReport(12)
    assert parse_line(b"step 0") == StepReport(0)
    assert parse_line(b"step") == StepReport(None)
    assert parse_line(b"phase checkpoint") == PhaseReport(Phase.CHECKPOINT)
    assert parse_line(b"phase step") == PhaseReport(Phase.STEP)


def test_junk_is_refused() -> None:
    for line in [
        b"", b"step ", b"step  1", b"step -1", b"step 01", b"step 1.5", b"STEP 1", b"step 1 ",
        b" step 1", b"step 1\r", b"step 1" + b"0" * 18, b"phase startup", b"phase", b"\xff\xfe",
        b"step \xd9\xa3",  # an Arabic-Indic digit: not an ASCII digit
    ]:  # fmt: skip
        assert parse_line(line) is None, line


def test_splitter_joins_pieces_and_counts_junk() -> None:
    s = LineSplitter()
    assert s.feed(b"ste") == []
    assert s.feed(b"p 3\nstep 4\nbogus\nph") == [StepReport(3), StepReport(4)]
    assert s.feed(b"ase checkpoint\n") == [PhaseReport(Phase.CHECKPOINT)]
    assert s.junk == 1


def test_an_endless_line_is_cut_and_skipped_to_its_newline() -> None:
    s = LineSplitter()
    assert s.feed(b"x" * (MAX_LINE * 3)) == []
    assert s.feed(b"step 1" * 100) == []  # still the same endless line
    assert s.feed(b"\nstep 2\n") == [StepReport(2)]
    assert s.junk == 1


@given(st.lists(st.binary(max_size=400), max_size=30))
def test_any_bytes_never_raise_and_the_buffer_stays_bounded(chunks: list[bytes]) -> None:
    s = LineSplitter()
    for chunk in chunks:
        for report in s.feed(chunk):
            assert isinstance(report, StepReport | PhaseReport)
        assert len(s._partial) < MAX_LINE


@given(st.lists(st.integers(0, 10**18 - 1), max_size=20), st.integers(1, 7))
def test_valid_reports_survive_any_chunking(steps: list[int], cut: int) -> None:
    data = b"".join(f"step {n}\n".encode() for n in steps)
    s = LineSplitter()
    got = []
    for i in range(0, len(data), cut):
        got += s.feed(data[i : i + cut])
    assert got == [StepReport(n) for n in steps] and s.junk == 0

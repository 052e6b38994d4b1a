"""elasticd.jobs.ranktext: ranks' output on one terminal, ``[rankK]: `` at line starts only, and
progress bars (``\\r`` updates) passed through as one line."""

from __future__ import annotations

import pytest

from elasticd.jobs.ranktext import NO_TIME, RankOutput, clock, rank_prefixed


def render(*writes: tuple[int, str], timestamps: bool = False, at: float | None = None) -> str:
    parts: list[str] = []
    out = RankOutput(parts.append, timestamps)
    for rank, text in writes:
        out.write(rank, text, at)
    out.close()
    return "".join(parts)


def test_whole_lines_are_prefixed_once() -> None:
    assert render((0, "a\nb\n"), (1, "c\n")) == "[rank0]: a\n[rank0]: b\n[rank1]: c\n"


def test_a_progress_bar_stays_one_line_with_its_prefix_redrawn() -> None:
    bar = "\r  0%|     |\r 50%|##   |\r100%|#####|\n"
    assert render((0, bar)) == "[rank0]:   0%|     |\r[rank0]:  50%|##   |\r[rank0]: 100%|#####|\n"


def test_pieces_of_a_line_that_arrive_apart_are_not_broken() -> None:
    pieces = [(0, "start\n"), (0, "\r 10%|#"), (0, "\r 20%|##"), (0, ""), (0, "\r"), (0, " 30%|###\n")]
    assert render(*pieces) == "[rank0]: start\n[rank0]:  10%|#\r[rank0]:  20%|##\r[rank0]:  30%|###\n"
    assert render((0, "hel"), (0, "lo\n")) == "[rank0]: hello\n"


def test_another_ranks_text_ends_an_unfinished_line_which_goes_on_prefixed() -> None:
    shown = render((0, "hel"), (1, "x\n"), (0, "lo\n"), (1, "\r 5%"), (0, "\r 7%"), (1, "\n"))
    assert shown == "[rank0]: hel\n[rank1]: x\n[rank0]: lo\n[rank1]:  5%\n[rank0]:  7%\n"


def test_torchs_own_prefix_is_kept_at_a_line_start_only() -> None:
    assert render((1, "[rank1]: Traceback\n")) == "[rank1]: Traceback\n"
    assert render((1, "x [rank1]: y\n")) == "[rank1]: x [rank1]: y\n"
    assert render((1, "[rank0]: other\n")) == "[rank1]: [rank0]: other\n"
    assert render((1, "a"), (1, "[rank1]: b\n")) == "[rank1]: a[rank1]: b\n"  # mid-line: text


def test_windows_line_ends_and_empty_lines() -> None:
    assert render((0, "a\r\n\nb")) == "[rank0]: a\r\n[rank0]: \n[rank0]: b\n"


def test_timestamps_at_each_line_start_and_after_a_return() -> None:
    at = 1700000000.25
    stamp = clock(at)
    assert stamp[-4:] == ".250" and len(stamp) == len(NO_TIME)
    assert render((0, "a\n\r1%\r2%\n"), timestamps=True, at=at) == (
        f"{stamp} [rank0]: a\n{stamp} [rank0]: 1%\r{stamp} [rank0]: 2%\n"
    )
    assert render((0, "old\n"), timestamps=True) == f"{NO_TIME} [rank0]: old\n"


@pytest.mark.parametrize(
    ("rank", "text", "shown"),
    [
        (1, "a\rb\n", "[rank1]: a\r[rank1]: b\n"),
        (1, "\rb", "[rank1]: b\n"),
        (2, "", ""),
    ],
)
def test_rank_prefixed(rank: int, text: str, shown: str) -> None:
    assert rank_prefixed(rank, text) == shown

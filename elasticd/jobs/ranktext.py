"""Several ranks' output on one terminal (or file), each line after ``[rankK]: ``.

Text comes in pieces: whole lines, or on a terminal whatever a rank wrote so far, such as the
``\\r`` updates of a progress bar (tqdm), which must reach the terminal as they are written and
stay one line. So the prefix goes at the start of a line only, and again after a ``\\r`` (the bar
then redraws its line from the start, over the old prefix); when another rank's text comes while
a line is unfinished, that line is ended on the terminal first and continued, prefixed again, when
its rank writes more. Lines that a worker already starts with its own ``[rankK]:`` (torch does,
after ``init_process_group``) are not prefixed twice.

Used by the CLI (``elasticctl.follow``); it lives here with the rest of the log format.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

_PIECES = re.compile(r"(\r|\n)")
NO_TIME = "--:--:--.---"  # ``-t``: a line that was there before we started reading has no known time


def clock(at: float) -> str:
    """``HH:MM:SS.mmm`` in local time."""
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


class RankOutput:
    """Writes ranks' text through ``write``, prefixed; ``timestamps``: each line also starts with the
    time it was read (``at``), or ``NO_TIME`` when that is not known."""

    def __init__(self, write: Callable[[str], object], timestamps: bool = False) -> None:
        self._write = write
        self._timestamps = timestamps
        self._owner: int | None = None  # the rank whose unfinished line the terminal is on
        self._redraw = False  # after a ``\r``: the owner's next text starts with its prefix again
        self._open: set[int] = set()  # ranks whose own current line has begun (not at its start)

    def _start(self, rank: int, piece: str, at: float | None) -> None:
        stamp = "" if not self._timestamps else (clock(at) if at is not None else NO_TIME) + " "
        ours = f"[rank{rank}]:"
        theirs = rank not in self._open and piece.startswith(ours)
        self._write(stamp + ("" if theirs else ours + " "))

    def write(self, rank: int, text: str, at: float | None = None) -> None:
        for piece in _PIECES.split(text):
            if not piece:
                continue
            if self._owner not in (None, rank):  # end the other rank's line on the terminal
                self._write("\n")
                self._owner = None
            if piece == "\n":
                if self._owner == rank:
                    self._write("\n")
                elif rank not in self._open:  # an empty line
                    self._start(rank, "", at)
                    self._write("\n")
                self._owner, self._redraw = None, False
                self._open.discard(rank)
            elif piece == "\r":
                if self._owner == rank:
                    self._write("\r")
                    self._redraw = True
                self._open.add(rank)
            else:
                if self._owner is None or self._redraw:
                    self._start(rank, piece, at)
                    self._redraw = False
                self._write(piece)
                self._owner = rank
                self._open.add(rank)

    def close(self) -> None:
        """End an unfinished line (output always ends with a newline)."""
        if self._owner is not None:
            self._write("\n")
            self._owner, self._redraw = None, False


def rank_prefixed(rank: int, text: str) -> str:
    """A rank's output as ``logs`` shows it: each line after ``[rankK]: ``, unless it has that
    prefix already (``[rank1]: [rank1]: Traceback`` says nothing more)."""
    parts: list[str] = []
    out = RankOutput(parts.append)
    out.write(rank, text)
    out.close()
    return "".join(parts)

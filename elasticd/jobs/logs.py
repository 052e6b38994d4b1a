"""Reading a job's append-only logs: ``<log_dir>/<job>/attempt_<n>/rank_<k>.log``.

Reads are cursor-based (file -> byte offset) and return whole lines only, so a following client
polls with the cursor it got back and never sees a line twice or cut in half. A client that shows
progress bars as they move asks for ``partial`` reads instead: everything written so far, cut only
where a character would be (``elasticd.jobs.ranktext`` then keeps each rank's lines apart).

Workers write straight to their files, so a line has no time of its own; an attempt has one: when
this node created its directory (the daemon makes every file of an attempt when it starts it, and
nothing else can write there), which is the directory's mtime (``attempt_starts``).

Everything goes through ``jobs.logread`` (directory fds, no symlinks followed, regular files only):
the daemon reads as root on behalf of whoever asks, so a path must never lead outside the tree.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from elasticd.jobs import logread

_ATTEMPT = re.compile(r"^attempt_(\d+)$")
_RANK = re.compile(r"^rank_(\d+)\.log$")
MAX_CHUNK = 256 * 1024
TAIL_BLOCK = 64 * 1024
MAX_TAIL_SCAN = 16 * 1024 * 1024  # ``tail`` looks back at most this far in one file


@dataclass(frozen=True)
class Chunk:
    attempt: int
    rank: int
    text: str


@dataclass(frozen=True)
class Read:
    chunks: list[Chunk]
    cursor: dict[str, int]
    more: bool  # the byte budget ran out: there may be more to read at once


def log_files(log_dir: Path, job_id: str) -> list[tuple[int, int]]:
    """(attempt, rank) of every log the job has, in numeric order; unsafe entries are left out."""
    found = []
    for name in logread.list_dir(log_dir, (job_id,)):
        if a := _ATTEMPT.match(name):
            for file in logread.list_dir(log_dir, (job_id, name)):
                if r := _RANK.match(file):
                    found.append((int(a.group(1)), int(r.group(1))))
    return sorted(found)


def attempt_starts(log_dir: Path, job_id: str) -> dict[int, float]:
    """When each attempt of the job that has logs here started on this node (see the module doc)."""
    times = logread.dir_times(log_dir, (job_id,))
    return {int(a.group(1)): t for name, t in times.items() if (a := _ATTEMPT.match(name))}


def _name(attempt: int, rank: int) -> str:
    return f"attempt_{attempt}/rank_{rank}.log"


def _parts(job_id: str, attempt: int, rank: int) -> tuple[str, str, str]:
    return (job_id, f"attempt_{attempt}", f"rank_{rank}.log")


def _complete_chars(data: bytes) -> int:
    """How much of ``data`` to send without cutting a UTF-8 character at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for its lead
            continue
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return len(data) if back >= need else len(data) - back
    return len(data)


def _cut(data: bytes, at_eof: bool, ended: bool, partial: bool) -> bytes:
    """What of ``data`` to send now; the rest comes with the next read. Whole lines (a partial last
    line waits), or with ``partial`` everything up to the last whole character. Exceptions: the job
    ended and this is the end of the file (all of it), or one line is longer than the whole budget
    (send it, or stall)."""
    if at_eof and ended:
        return data
    if not partial:
        cut = data.rfind(b"\n") + 1
        if cut or at_eof:
            return data[:cut]
    return data[: _complete_chars(data)]


def tail_start(log_dir: Path, parts: tuple[str, ...], lines: int) -> tuple[int, int]:
    """Where the last ``lines`` lines of a log start, and how many lines that is (fewer than asked:
    the whole file). An unfinished last line counts as one. Looks back at most MAX_TAIL_SCAN bytes."""
    data, start = logread.read_end(log_dir, parts, TAIL_BLOCK if lines > 0 else 0)
    size = start + len(data)
    if lines <= 0 or size == 0:
        return size, 0
    cut = len(data) - 1 if data[-1:] == b"\n" else len(data)  # a final newline starts no line
    found = 0
    while True:
        i = data.rfind(b"\n", 0, cut)
        if i >= 0:
            found += 1
            if found == lines:
                return start + i + 1, lines
            cut = i
            continue
        if start == 0:
            return 0, found + 1
        if size - start >= MAX_TAIL_SCAN:
            return start, lines
        earlier = max(0, start - TAIL_BLOCK)
        data = logread.read_range(log_dir, parts, earlier, start - earlier) or b""
        if len(data) != start - earlier:  # changed under us (a log is only appended to): stop here
            return start, lines
        start, cut = earlier, len(data)


def tail_offsets(
    log_dir: Path, job_id: str, files: Collection[tuple[int, int]], lines: int
) -> dict[str, int]:
    """Cursor offsets that show each rank's last ``lines`` lines over the given attempts: from its
    latest attempt back, as many earlier attempts as that takes (the rest start at their end)."""
    by_rank: dict[int, list[int]] = {}
    for attempt, rank in files:
        by_rank.setdefault(rank, []).append(attempt)
    offsets = {}
    for rank, attempts in by_rank.items():
        left = lines
        for attempt in sorted(attempts, reverse=True):
            offsets[_name(attempt, rank)], found = tail_start(log_dir, _parts(job_id, attempt, rank), left)
            left -= found
    return offsets


def read_logs(
    log_dir: Path,
    job_id: str,
    cursor: dict[str, int],
    *,
    files: list[tuple[int, int]] | None = None,
    rank: int | None = None,
    attempts: Collection[int] | None = None,
    tail: int | None = None,
    whole: bool = False,
    partial: bool = False,
    max_bytes: int = MAX_CHUNK,
) -> Read:
    """What the job's logs (``files``, else all of them; only ``rank``'s and those of ``attempts``
    if given) hold past ``cursor``, at most ``max_bytes``. ``tail``: logs the cursor does not name
    start at their rank's last lines (and are named in the cursor returned). ``whole``: the job
    ended, so unfinished last lines are sent too."""
    chosen = [
        (a, r)
        for a, r in (log_files(log_dir, job_id) if files is None else files)
        if (rank is None or r == rank) and (attempts is None or a in attempts)
    ]
    out = dict(cursor)
    if tail is not None:
        out |= tail_offsets(log_dir, job_id, [f for f in chosen if _name(*f) not in cursor], tail)
    chunks: list[Chunk] = []
    budget, more = max_bytes, False
    for attempt, r in chosen:
        if budget <= 0:
            more = True
            break
        name = _name(attempt, r)
        offset = max(0, out.get(name, 0))
        data = logread.read_range(log_dir, _parts(job_id, attempt, r), offset, budget)
        if data is None:
            continue
        at_eof = len(data) < budget
        more = more or not at_eof
        data = _cut(data, at_eof, whole, partial)
        if data:
            out[name] = offset + len(data)
            budget -= len(data)
            chunks.append(Chunk(attempt, r, data.decode(errors="replace")))
    return Read(chunks, out, more)

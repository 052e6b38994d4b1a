"""Reading a job's append-only logs: ``<log_dir>/<job>/attempt_<n>/rank_<k>.log``.

Reads are cursor-based (file -> byte offset) and return whole lines only, so a following client
polls with the cursor it got back and never sees a line twice or cut in half.

Everything goes through ``jobs.logdir`` (directory fds, no symlinks followed, regular files only):
the daemon reads as root on behalf of whoever asks, so a path must never lead outside the tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from elasticd.jobs import logdir

_ATTEMPT = re.compile(r"^attempt_(\d+)$")
_RANK = re.compile(r"^rank_(\d+)\.log$")
MAX_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Chunk:
    attempt: int
    rank: int
    text: str


def rank_prefixed(rank: int, text: str) -> str:
    """A rank's output as ``logs`` and ``--follow`` show it: each line after ``[rankK]: ``, unless
    it has that prefix already (torch's ``init_process_group`` makes a worker print its tracebacks
    with the very same prefix, and ``[rank1]: [rank1]: Traceback`` says nothing more)."""
    ours = f"[rank{rank}]:"
    return "".join((line if line.startswith(ours) else f"{ours} {line}") + "\n" for line in text.splitlines())


def log_files(log_dir: Path, job_id: str) -> list[tuple[int, int]]:
    """(attempt, rank) of every log the job has, in numeric order; unsafe entries are left out."""
    found = []
    for name in logdir.list_dir(log_dir, (job_id,)):
        if a := _ATTEMPT.match(name):
            for file in logdir.list_dir(log_dir, (job_id, name)):
                if r := _RANK.match(file):
                    found.append((int(a.group(1)), int(r.group(1))))
    return sorted(found)


def _whole_lines(data: bytes, at_eof: bool, ended: bool) -> bytes:
    """Cut a partial last line, which the next read returns whole. Exceptions: the job ended and
    this is the end of the file, or one line is longer than the whole budget (send it, or stall)."""
    if at_eof and ended:
        return data
    cut = data.rfind(b"\n") + 1
    return data[:cut] if cut or at_eof else data


def read_new(
    log_dir: Path,
    job_id: str,
    cursor: dict[str, int],
    rank: int | None = None,
    max_bytes: int = MAX_CHUNK,
    whole: bool = False,
) -> tuple[list[Chunk], dict[str, int]]:
    chunks: list[Chunk] = []
    out = dict(cursor)
    budget = max_bytes
    for attempt, r in log_files(log_dir, job_id):
        if (rank is not None and r != rank) or budget <= 0:
            continue
        name = f"attempt_{attempt}/rank_{r}.log"
        offset = max(0, out.get(name, 0))
        data = logdir.read_range(log_dir, (job_id, f"attempt_{attempt}", f"rank_{r}.log"), offset, budget)
        if data is None:
            continue
        data = _whole_lines(data, at_eof=len(data) < budget, ended=whole)
        if data:
            out[name] = offset + len(data)
            budget -= len(data)
            chunks.append(Chunk(attempt, r, data.decode(errors="replace")))
    return chunks, out

"""Writing a rank's stacks next to its log: ``<log_dir>/<job>/attempt_<n>/rank_<k>.stacks.txt``.

The attempt directory is root's and the file is handed to the job's user, as its log is: created
through ``jobs.logdir`` (``openat`` from the root without following links, ``O_EXCL``, then
``fchown``), so a link the job planted under that name is never followed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from elasticd.jobs import logdir

MAX_STACKS_FILE = 1 << 20


def stacks_name(rank: int) -> str:
    return f"rank_{rank}.stacks.txt"


def write_stacks(
    log_dir: Path, job_id: str, attempt: int, rank: int, text: str, owner: logdir.Owner, node: str
) -> Path:
    """Write (replace) rank ``rank``'s stacks file; raises ``SetupFailure`` or ``OSError``."""
    parts = (job_id, f"attempt_{attempt}")
    path = Path(log_dir).joinpath(*parts, stacks_name(rank))
    dir_fd = logdir.open_dir(log_dir, parts, create=False, node=node)
    if dir_fd is None:
        raise FileNotFoundError(f"{path.parent} is gone")
    try:
        fd = logdir.create_file(dir_fd, path.name, path, owner, node, truncate=True)
    finally:
        os.close(dir_fd)
    try:
        data = text.encode(errors="replace")[:MAX_STACKS_FILE]
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return path

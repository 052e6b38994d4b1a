"""A failed worker's report: its root cause among the ranks that failed, with its log's tail and
the message torch's ``@record`` left.

Everything here is read through ``jobs.logread`` from the job's log directory, which the workers
(the submitter) could have changed: never opened by path as root.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from elasticd.jobs import logread
from elasticd.jobs.rootcause import Exit, by_first_failure, exception_of, parse_error_file
from elasticd.terms.state import FailedRank, WorkerFailure
from elasticd.workers.group import Worker, wall_clock

TAIL_BYTES = 4096
TAIL_LINES = 30


def _in_tree(path: Path) -> tuple[Path, tuple[str, ...]]:
    """``<log_dir>/<job>/attempt_<n>/<file>`` split into the log root and the names below it."""
    return path.parents[2], path.parts[-3:]


def read_tail(path: Path) -> str:
    """The last lines of a rank's log (``path`` as in ``Launch.log_path``), read safely."""
    root, parts = _in_tree(path)
    lines = logread.read_tail(root, parts, TAIL_BYTES).decode(errors="replace").splitlines()
    return "\n".join(lines[-TAIL_LINES:])


def read_error_file(path: Path) -> tuple[str, float | None]:
    """The message and timestamp torch's ``@record`` wrote to TORCHELASTIC_ERROR_FILE, if any
    (the daemon pre-creates the file empty, so empty means no message)."""
    root, parts = _in_tree(path)
    try:
        data = json.loads(logread.read_small(root, parts))
    except ValueError:
        return "", None
    return parse_error_file(data)


def describe_failure(
    node: str, attempt: int, failed: Sequence[Worker], started_at: float | None = None
) -> WorkerFailure:
    """The root cause among ``failed`` (workers that exited non-zero, at least one): the first to
    fail by time (see ``jobs.rootcause``), with the others as ``also_failed``."""
    errors = {w.launch.rank: read_error_file(w.launch.error_file) for w in failed}
    workers = {w.launch.rank: w for w in failed}
    exits = [
        Exit(
            rank=w.launch.rank,
            local_rank=w.launch.local_rank,
            returncode=w.exited.result(),
            exited_at=wall_clock() if w.exited_at is None else w.exited_at,
            error_at=errors[w.launch.rank][1],
        )
        for w in failed
    ]
    root, *others = by_first_failure(exits)
    launch = workers[root.rank].launch
    also = tuple(
        FailedRank.from_exit(
            rank=e.rank,
            local_rank=e.local_rank,
            returncode=e.returncode,
            message=errors[e.rank][0],
            failed_at=e.failed_at,
        )
        for e in others
    )
    tail = read_tail(launch.log_path)
    return WorkerFailure.from_exit(
        oom=launch.limits is not None and launch.limits.oom_killed(),
        node=node,
        attempt=attempt,
        rank=root.rank,
        local_rank=root.local_rank,
        returncode=root.returncode,
        message=errors[root.rank][0],
        tail=tail,
        failed_at=root.failed_at,
        also_failed=also,
        exception=exception_of(errors[root.rank][0], tail),
        exited_at=root.exited_at,
        ran_s=None if started_at is None else max(0.0, root.exited_at - started_at),
    )

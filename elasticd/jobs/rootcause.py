"""Which failed worker of a round is the root cause: the first to fail, by time. Pure: no I/O.

Within a node, ``by_first_failure`` orders the exits; across nodes, ``earlier`` tells whether a
node's own root cause precedes the one another node recorded for the round (the record is then
amended); across rounds, ``same_way`` tells a failure that repeats itself with no progress, and
``from_outside`` one that never does: the job's own code did not bring it on.

torchrun blames the failure with the smallest error-file timestamp; a worker without one (no
``@record``, a signal, ``os._exit``) is timed by when its exit was seen. The lowest rank is not
the root cause: after rank 1 crashes, rank 0 typically fails too, with gloo's "Connection closed
by peer" or NCCL's timeout, and blaming it hides the real error.

torch writes the timestamp in whole seconds, so failures are compared at that resolution first
and by when their exits were seen within a second.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from elasticd.terms.state import MAX_ALSO_FAILED, FailedRank, FailureKind, WorkerFailure, one_line


@dataclass(frozen=True)
class Exit:
    """One worker's exit, as the daemon saw it."""

    rank: int
    local_rank: int
    returncode: int
    exited_at: float  # when the exit was seen (seconds since the epoch)
    error_at: float | None = None  # the error file's timestamp, if the worker wrote one

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def failed_at(self) -> float:
        """The best estimate of when it failed: its own word, else when it was seen to exit."""
        return self.error_at if self.error_at is not None else self.exited_at


def order_key(e: Exit) -> tuple[float, float, int]:
    """Sort key, first failure first: the whole second it failed in (an error file's timestamp
    cannot be later than the exit: a clock step or a bogus value is bounded by it), then when the
    exit was seen, then the rank (only for exits seen at the very same instant)."""
    second = math.floor(e.exited_at)
    if e.error_at is not None:
        second = min(second, math.floor(e.error_at))
    return (second, e.exited_at, e.rank)


def by_first_failure(exits: Iterable[Exit]) -> list[Exit]:
    """The failed exits, root cause first."""
    return sorted((e for e in exits if e.failed), key=order_key)


def _timestamp(value: Any) -> float | None:
    """torch writes ``str(int(time.time()))``; accept numbers too, refuse anything else."""
    if isinstance(value, bool):
        return None
    try:
        ts = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return ts if math.isfinite(ts) and ts > 0 else None


def parse_error_file(data: Any) -> tuple[str, float | None]:
    """The message (its last line) and timestamp of a TORCHELASTIC_ERROR_FILE's JSON.

    torch's ``@record`` writes ``{"message": {"message": "Type: text", "extraInfo":
    {"py_callstack": "...", "timestamp": "<seconds>"}}}``; torchelastic also reads the older
    ``{"message": "text", "timestamp": <seconds>}``. Anything else gives ``("", None)``.
    """
    if not isinstance(data, dict):
        return "", None
    message = data.get("message", "")
    ts: Any = data.get("timestamp")
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        ts = extra.get("timestamp") if isinstance(extra, dict) else None
        message = message.get("message", "")
    text = str(message).strip() if message is not None else ""
    return (text.splitlines()[-1].strip() if text else ""), _timestamp(ts)


# -- the exception a failure names -----------------------------------------------------------------
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)(?::\s?(.*))?$")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_EXCEPTION_NAMES = ("Error", "Exception", "Interrupt", "Exit", "Failure", "Warning", "Timeout")


def _exception_line(line: str) -> tuple[str, str] | None:
    match = _EXCEPTION_LINE.match(line.strip())
    if match is None:
        return None
    name = match.group(1)
    if not name.split(".")[-1].endswith(_EXCEPTION_NAMES) and match.group(2) is None:
        return None
    return name, (match.group(2) or "").strip()


def exception_of(message: str, tail: str) -> str:
    """The exception type a failed rank died of, or "" if it names none.

    torch's ``@record`` writes ``"Type: text"`` as the error file's message; without it the last
    Python traceback in the rank's output ends with that line. (A traceback's frames are indented;
    its exception line is the first line after them that is not.)"""
    found = _exception_line(message.strip().splitlines()[-1]) if message.strip() else None
    if found is not None:
        return found[0]
    lines = [_RANK_PREFIX.sub("", line) for line in tail.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        return ""
    for line in lines[starts[-1] + 1 :]:
        if not line or line[0].isspace():
            continue
        hit = _exception_line(line)
        return hit[0] if hit is not None else ""
    return ""


# -- across nodes, and across rounds --------------------------------------------------------------
def _key(failure: WorkerFailure) -> tuple[float, float]:
    failed = failure.failed_at if failure.failed_at is not None else math.inf
    seen = failure.exited_at if failure.exited_at is not None else failed
    first = min(failed, seen)
    return (math.floor(first) if math.isfinite(first) else math.inf, seen)


def earlier(mine: WorkerFailure, theirs: WorkerFailure) -> bool:
    """``mine`` (this node's root cause of a round) failed before ``theirs`` (the one recorded for
    the same round by another node): the record should name ``mine``. Compared like failures of
    one node (``order_key``); equal keys keep the record as it is. Nodes' clocks are assumed to be
    synchronised (NTP): a skew larger than the gap between two failures can still name the later."""
    return mine.attempt == theirs.attempt and mine.node != theirs.node and _key(mine) < _key(theirs)


def with_also_failed(root: WorkerFailure, other: WorkerFailure) -> WorkerFailure:
    """``root`` naming ``other`` (another node's root cause, and its list) among the also-failed."""
    them = FailedRank(
        rank=other.rank,
        local_rank=other.local_rank,
        exit_code=other.exit_code,
        signal=other.signal,
        message=one_line(other.message),
        failed_at=other.failed_at,
        node=other.node,
    )
    listed = [them, *(replace(f, node=f.node or other.node) for f in other.also_failed), *root.also_failed]
    listed.sort(key=lambda f: f.failed_at if f.failed_at is not None else math.inf)
    more = root.also_failed_more + other.also_failed_more + max(0, len(listed) - MAX_ALSO_FAILED)
    return replace(root, also_failed=tuple(listed[:MAX_ALSO_FAILED]), also_failed_more=more)


PROGRESS_WITHOUT_STEPS_S = 300.0  # a script that reports no steps made progress if it ran this long

# Signals a process gets for what it did itself: a fault, ``abort()`` (torch's and NCCL's fatal
# errors), a resource limit it ran into, a write to a closed pipe, an alarm it set. Any other
# signal (SIGKILL, SIGTERM, SIGINT, SIGHUP, ...) was sent from outside: an operator, a scheduler,
# a node's own troubles. Where it did not come from the OOM killer (``FailureKind.OOM``), nothing
# says the job will meet it again, so it is never taken for a job that cannot progress.
OWN_SIGNALS = frozenset(
    {
        "SIGSEGV",
        "SIGBUS",
        "SIGFPE",
        "SIGILL",
        "SIGABRT",
        "SIGTRAP",
        "SIGSYS",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGPIPE",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
    }
)
_NOT_THE_JOBS = frozenset({FailureKind.NODE_LOST, FailureKind.GPU, FailureKind.INFRASTRUCTURE})


def from_outside(failure: WorkerFailure) -> bool:
    """``failure`` came from outside the job's own code: a signal no rank brings on itself, a lost
    node, a GPU gone bad, the node's own setup. Such a failure never counts as a repeat."""
    if failure.kind in _NOT_THE_JOBS:
        return True
    return failure.kind is FailureKind.SIGNAL and failure.signal not in OWN_SIGNALS


def same_way(previous: WorkerFailure, new: WorkerFailure) -> bool:
    """``new`` repeats ``previous`` with no progress in between: neither came from outside the job
    (``from_outside``), they are the same kind of failure with the same exception (or exit code /
    signal), and the furthest step did not advance (for a script that reports no steps: the
    attempt failed within ``PROGRESS_WITHOUT_STEPS_S`` of its workers' start)."""
    if from_outside(previous) or from_outside(new):
        return False
    same = (previous.kind, previous.exception, previous.exit_code, previous.signal) == (
        new.kind,
        new.exception,
        new.exit_code,
        new.signal,
    )
    if not same:
        return False
    if new.step is not None:
        return previous.step is not None and new.step <= previous.step
    return new.ran_s is not None and new.ran_s < PROGRESS_WITHOUT_STEPS_S

"""Job and attempt states, why a round was opened, and what a failure looks like (a worker's, a GPU's)."""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    """Lifecycle of a job on this node.

    PENDING    -> RUNNING     when the slots it needs are free
    PENDING    -> KILLED      on ``kill``
    PENDING    -> FAILED      the daemon shut down before it could start
    RUNNING    -> RESTARTING  a worker failed and restarts are left
    RUNNING    -> SUCCEEDED   every worker exited 0
    RUNNING    -> FAILED      a worker failed with no restarts left, or the node stopped
    RUNNING    -> KILLED      on ``kill``
    RESTARTING -> RUNNING     the new attempt's workers are started
    RESTARTING -> FAILED      the new attempt could not be started
    RESTARTING -> KILLED      on ``kill``
    SUCCEEDED, FAILED and KILLED are terminal.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)


_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.KILLED, JobState.FAILED}),
    JobState.RUNNING: frozenset({JobState.RESTARTING, JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED}),
    JobState.RESTARTING: frozenset({JobState.RUNNING, JobState.FAILED, JobState.KILLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.KILLED: frozenset(),
}


class EndReason(StrEnum):
    """Why a job ended: the stable ``code`` of ``jobs/<job>/final``, for scripts and dashboards.

    The ones marked "setup" are not the job's fault: they end the job at once with their own
    reason instead of spending the restart budget in a loop that cannot succeed.
    """

    SUCCEEDED = "succeeded"
    KILLED = "killed"
    WORKER_FAILED = "worker_failed"  # a worker failed and no restart was left
    OOM = "oom"  # a worker was killed by the OOM killer (its memory limit, or the host's)
    NODES_LOST = "nodes_lost"  # members were lost and no restart was left
    JOIN_TIMEOUT = "join_timeout"  # MIN nodes did not join in time
    ENTRY_UNAVAILABLE = "entry_unavailable"  # setup: script, cwd or executable missing or not accessible
    INTERPRETER_UNAVAILABLE = "interpreter_unavailable"  # setup: the job's python is missing or not runnable
    LOG_DISK_FULL = "log_disk_full"  # setup: no space left for the job's logs
    LOG_DIR_UNSAFE = "log_dir_unsafe"  # setup: a log directory is not root's alone (tampering)
    INVALID_RECORD = "invalid_record"  # a key of the job in etcd did not parse or validate
    ROOT_NOT_ALLOWED = "root_not_allowed"  # the spec asks for uid 0 and allow_root_jobs is off
    SPAWN_FAILED = "spawn_failed"  # setup: the worker process could not be created
    REPEATED_FAILURE = "repeated_failure"  # failed the same way N times in a row with no progress
    QUOTA_EXCEEDED = "quota_exceeded"  # a spec written around the daemon, over its user's job limit
    TOO_LARGE = "too_large"  # a spec written around the daemon, over the spec size limit

    @property
    def setup(self) -> bool:
        return self in _SETUP


_SETUP = frozenset(
    {
        EndReason.ENTRY_UNAVAILABLE,
        EndReason.INTERPRETER_UNAVAILABLE,
        EndReason.LOG_DISK_FULL,
        EndReason.LOG_DIR_UNSAFE,
        EndReason.ROOT_NOT_ALLOWED,
        EndReason.SPAWN_FAILED,
    }
)


class SetupFailure(Exception):
    """This node could not start a job's workers for a reason that is not the job's own."""

    def __init__(self, reason: EndReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def can_transition(old: JobState, new: JobState) -> bool:
    return new in _ALLOWED[old]


class IllegalTransition(ValueError):
    """A write would move a job between two states its lifecycle (``JobState``) does not connect."""


def check_transition(job_id: str, old: JobState, new: JobState) -> None:
    """Refuse a change of a job's state that ``JobState``'s lifecycle does not have, before it is
    written: a decider that asks for one has a bug, and the record would tell a history no job can
    have (a job that never ran SUCCEEDED, an ended job ended again)."""
    if not can_transition(old, new):
        raise IllegalTransition(f"job {job_id} is {old.value}: it cannot become {new.value}")


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class RoundReason(StrEnum):
    """Why a round was opened. Only failures spend the job-wide restart budget."""

    START = "start"  # the job was submitted
    WORKER_FAILED = "worker_failed"  # a worker exited non-zero or by a signal (spends)
    MEMBER_LOST = "member_lost"  # a member's lease expired or its daemon died (spends)
    SCALE_UP = "scale_up"  # a node is waiting to join a running job
    MEMBER_LEFT = "member_left"  # a member left on purpose (drain, daemon stop)
    GPU_FAILED = "gpu_failed"  # a member left because a GPU it held went unhealthy (not the job's fault)

    @property
    def spends_budget(self) -> bool:
        return self in (RoundReason.WORKER_FAILED, RoundReason.MEMBER_LOST)


class GpuStatus(StrEnum):
    """A GPU in a node's record (``state``): in the pool, or out of it until an operator returns it
    (``undrain --gpu``). A node record holds the value as a plain string, so that a record of a
    daemon that knows more statuses still reads."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class Fault(StrEnum):
    """What kind of reading took a GPU out of the pool (``gpu.health`` judges): a bounded label
    for the metric and the event."""

    XID = "xid"
    ECC = "ecc"
    ROW_REMAP = "row_remap"
    PAGE_RETIREMENT = "page_retirement"
    RECOVERY_ACTION = "recovery_action"
    NVLINK = "nvlink"
    LOST = "lost"


class FailureKind(StrEnum):
    """What kind of failure a round ended with, for people and dashboards (``status``, events).

    A worker's failure is USER_CODE (it exited non-zero: an exception, ``sys.exit``), OOM (the
    OOM killer), SIGNAL (killed by another signal) or HANG (no progress for the hang timeout).
    A round can also end because a member was lost (NODE_LOST), because a GPU a member held went
    unhealthy (GPU: the member left without it, no restart spent) or because the node could not
    run the job at all (INFRASTRUCTURE: setup failures, a full log disk, an invalid record).
    """

    USER_CODE = "user_code"
    OOM = "oom"
    SIGNAL = "signal"
    HANG = "hang"
    NODE_LOST = "node_lost"
    GPU = "gpu"
    INFRASTRUCTURE = "infrastructure"


def kind_of_exit(returncode: int, oom: bool) -> FailureKind:
    if oom:
        return FailureKind.OOM
    return FailureKind.SIGNAL if returncode < 0 else FailureKind.USER_CODE


MAX_ALSO_FAILED = 8  # other failed ranks a failure lists; the rest are only counted
MAX_MESSAGE = 300  # an "also failed" rank's message, one line
MAX_EXCEPTION = 200


def _signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return str(-returncode)


def exit_text(exit_code: int | None, sig: str | None, message: str = "") -> str:
    """``exit code 1``, ``signal SIGKILL``, followed by ``: message`` only when the message says
    more than the exit itself (a failure without an error file carries its exit as its message)."""
    text = " ".join(message.split())
    if exit_code is None and not sig:  # it did not exit (it hung): the message is all there is
        return text or "no exit"
    how = f"signal {sig}" if sig else f"exit code {exit_code}"
    same = {"", how, f"exit code {exit_code}", f"killed by {sig}", f"killed by signal {sig}"}
    return how if text in same else f"{how}: {text}"


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass(frozen=True)
class FailedRank:
    """Another rank of the same node that failed in the same round, after the root cause."""

    rank: int
    local_rank: int
    exit_code: int | None  # None when killed by a signal
    signal: str | None
    message: str = ""  # one line: the error file's message, else the exit
    failed_at: float | None = None  # seconds since the epoch (see WorkerFailure.failed_at)
    node: str = ""  # set when the rank ran on another node than the root cause

    @classmethod
    def from_exit(
        cls, *, rank: int, local_rank: int, returncode: int, message: str, failed_at: float | None = None
    ) -> FailedRank:
        return cls(
            rank=rank,
            local_rank=local_rank,
            exit_code=returncode if returncode >= 0 else None,
            signal=_signal_name(returncode),
            message=one_line(message or describe_exit(returncode)),
            failed_at=failed_at,
        )

    def describe(self) -> str:
        return f"rank {self.rank} on {self.node}" if self.node else f"rank {self.rank}"


@dataclass(frozen=True)
class WorkerFailure:
    """The root cause of a failed attempt on a node: the worker that failed first, by the time in
    its error file (torch's ``@record``), else by when its exit was seen. Like torchelastic's
    ``ProcessFailure``; the round's other failed ranks (this node's, and other nodes' once the
    root cause is settled across nodes, see ``jobs.rootcause``) are in ``also_failed``.

    Fields added after the first release have defaults: records of older daemons still decode.
    """

    node: str
    attempt: int
    rank: int
    local_rank: int
    exit_code: int | None  # None when killed by a signal
    signal: str | None
    message: str  # from TORCHELASTIC_ERROR_FILE when the script used @record, else the exit
    output_tail: str  # last lines the rank wrote (stdout and stderr, interleaved as on a terminal)
    oom: bool = False  # killed by the OOM killer (known where the worker had its own cgroup)
    failed_at: float | None = None  # the error file's timestamp (whole seconds), else the exit's
    also_failed: tuple[FailedRank, ...] = ()  # this node's other failed ranks, first failed first
    also_failed_more: int = 0  # further failed ranks, beyond MAX_ALSO_FAILED, only counted
    kind: FailureKind = FailureKind.USER_CODE
    frame: str = ""  # a hung rank's innermost frame of its main thread, "train.py:42 in step"
    exception: str = ""  # the exception's type (``ZeroDivisionError``), when the output names one
    exited_at: float | None = None  # when the exit was seen (orders failures within a second)
    step: int | None = None  # the furthest training step this node's ranks reported, if any
    ran_s: float | None = None  # how long the attempt's workers ran before this failure

    def __post_init__(self) -> None:
        if len(self.exception) > MAX_EXCEPTION:
            raise ValueError(f"exception must be at most {MAX_EXCEPTION} characters")

    @classmethod
    def from_exit(
        cls,
        *,
        node: str,
        attempt: int,
        rank: int,
        local_rank: int,
        returncode: int,
        message: str,
        tail: str,
        oom: bool = False,
        failed_at: float | None = None,
        also_failed: tuple[FailedRank, ...] = (),
        exception: str = "",
        exited_at: float | None = None,
        ran_s: float | None = None,
    ) -> WorkerFailure:
        return cls(
            node=node,
            attempt=attempt,
            rank=rank,
            local_rank=local_rank,
            exit_code=returncode if returncode >= 0 else None,
            signal=_signal_name(returncode),
            message=message or ("killed by the OOM killer" if oom else describe_exit(returncode)),
            output_tail=tail,
            oom=oom,
            failed_at=failed_at,
            also_failed=also_failed[:MAX_ALSO_FAILED],
            also_failed_more=max(0, len(also_failed) - MAX_ALSO_FAILED),
            kind=kind_of_exit(returncode, oom),
            exception=exception[:MAX_EXCEPTION],
            exited_at=exited_at,
            ran_s=ran_s,
        )

    def summary(self) -> str:
        what = exit_text(self.exit_code, self.signal, self.message)
        text = f"rank {self.rank} (local {self.local_rank} on {self.node}) failed with {what}"
        if self.kind is FailureKind.HANG:
            detail = self.message.removeprefix(f"rank {self.rank} ")
            text = f"rank {self.rank} (local {self.local_rank} on {self.node}) {detail}"
        others = [f.describe() for f in self.also_failed]
        if self.also_failed_more:
            others.append(f"{self.also_failed_more} more")
        return f"{text}; also failed: {', '.join(others)}" if others else text

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["also_failed"] = [asdict(f) for f in self.also_failed]
        return out

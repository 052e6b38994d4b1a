"""Job and attempt states, and what a failure looks like."""

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


def can_transition(old: JobState, new: JobState) -> bool:
    return new in _ALLOWED[old]


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass(frozen=True)
class WorkerFailure:
    """The first failing worker of an attempt, like torchelastic's ``ProcessFailure``."""

    node: str
    attempt: int
    rank: int
    local_rank: int
    exit_code: int | None  # None when killed by a signal
    signal: str | None
    message: str  # from TORCHELASTIC_ERROR_FILE when the script used @record, else the exit
    output_tail: str  # last lines the rank wrote (stdout and stderr, interleaved as on a terminal)

    @classmethod
    def from_exit(
        cls, *, node: str, attempt: int, rank: int, local_rank: int, returncode: int, message: str, tail: str
    ) -> WorkerFailure:
        sig = None
        if returncode < 0:
            try:
                sig = signal.Signals(-returncode).name
            except ValueError:
                sig = str(-returncode)
        return cls(
            node=node,
            attempt=attempt,
            rank=rank,
            local_rank=local_rank,
            exit_code=returncode if returncode >= 0 else None,
            signal=sig,
            message=message or describe_exit(returncode),
            output_tail=tail,
        )

    def summary(self) -> str:
        what = f"signal {self.signal}" if self.signal else f"exit code {self.exit_code}"
        return f"rank {self.rank} (local {self.local_rank} on {self.node}) failed with {what}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

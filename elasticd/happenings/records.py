"""The records of what happened that something other than the log line uses: one frozen
dataclass per kind of happening, its enums as enums.

Each record also knows its log line: ``EVENT`` (the structlog ``noun.verb`` name), ``LEVEL`` and
``log_fields`` (the key=value pairs, in order). ``Happening`` is the union of them all, so a
``match`` over it with ``assert_never`` makes mypy find a subscriber that forgot a record.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, ClassVar, Literal

from elasticd.terms.state import EndReason, FailureKind, Fault, RoundReason

Level = Literal["info", "warning", "error"]


@dataclass(frozen=True)
class Record:
    """Base of every record: the log line is its fields in declaration order, enums as their
    values and tuples as lists (what ``log.info(EVENT, **fields)`` would write)."""

    EVENT: ClassVar[str]
    LEVEL: ClassVar[Level] = "info"

    def log_fields(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def _present(pairs: dict[str, Any], *optional: str) -> dict[str, Any]:
    """``pairs`` less the ``optional`` keys whose value is None (keys the line leaves out then)."""
    return {k: v for k, v in pairs.items() if not (k in optional and v is None)}


# -- jobs -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSubmitted(Record):
    EVENT = "job.submitted"
    job: str
    user: str
    argv: tuple[str, ...]
    nnodes: str  # the spec's MIN[:MAX], as the user wrote it


@dataclass(frozen=True)
class JobJoining(Record):
    """This node takes part in a job."""

    EVENT = "job.joining"
    job: str
    node: str
    devices: str  # CUDA_VISIBLE_DEVICES of its slots ("" on a CPU host)


@dataclass(frozen=True)
class JobLeft(Record):
    """This node stopped taking part in a job."""

    EVENT = "job.left"
    job: str
    node: str


@dataclass(frozen=True)
class JobSucceeded(Record):
    EVENT = "job.succeeded"
    job: str
    code: EndReason
    reason: str
    round: int
    cause: FailureKind | None = None  # the final failure's, when one is recorded
    root_cause: str | None = None

    def log_fields(self) -> dict[str, Any]:
        return _present(super().log_fields(), "cause", "root_cause")


@dataclass(frozen=True)
class JobFailed(Record):
    """The job ended FAILED: by its agent (``round``, and the root cause when known), over a
    quota, or for an invalid record (``key``, when the janitor found it)."""

    EVENT = "job.failed"
    LEVEL = "warning"
    job: str
    code: EndReason
    reason: str | None = None
    round: int | None = None
    cause: FailureKind | None = None
    root_cause: str | None = None
    key: str | None = None

    def log_fields(self) -> dict[str, Any]:
        return _present(super().log_fields(), "reason", "round", "cause", "root_cause", "key")


@dataclass(frozen=True)
class JobSetupFailed(Record):
    """This node could not run the job at all (its ending, not a worker's failure)."""

    EVENT = "job.setup_failed"
    LEVEL = "error"
    job: str
    node: str
    code: EndReason
    why: str


@dataclass(frozen=True)
class JobKilled(Record):
    EVENT = "job.killed"
    job: str
    by: str


@dataclass(frozen=True)
class JobRemoved(Record):
    """The job's records were deleted by ``rm``."""

    EVENT = "job.removed"
    job: str
    logs: bool  # its log directory was removed too


@dataclass(frozen=True)
class JobExpired(Record):
    """The janitor deleted an ended job's records: past retention (``ended_at``) or to relieve
    a full etcd (``why``)."""

    EVENT = "job.expired"
    job: str
    ended_at: float | None = None
    why: str | None = None

    def log_fields(self) -> dict[str, Any]:
        return _present(super().log_fields(), "ended_at", "why")


@dataclass(frozen=True)
class JobOrphaned(Record):
    """Every member of the job's round was lost: the janitor opened a new round."""

    EVENT = "job.orphaned"
    LEVEL = "warning"
    job: str
    round: int
    action: str = "restart"


# -- rounds and workers -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundComplete(Record):
    """A round closed (ranks assigned) by this node, its leader."""

    EVENT = "round.complete"
    job: str
    round: int
    world_size: int
    members: tuple[str, ...]
    why: str
    reason: RoundReason | None  # why the round was opened (None: not known)
    rendezvous_s: float | None  # from its opening to its close


@dataclass(frozen=True)
class RoundBumped(Record):
    """This node opened a new round (a restart)."""

    EVENT = "round.bumped"
    job: str
    round: int
    reason: RoundReason
    spend: bool
    restarts: int
    detail: str


@dataclass(frozen=True)
class WorkerFailed(Record):
    """This node's workers failed (its own failure)."""

    EVENT = "worker.failed"
    LEVEL = "warning"
    job: str
    node: str
    round: int
    cause: FailureKind
    summary: str


@dataclass(frozen=True)
class WorkerHung(Record):
    """A rank on this node made no progress for the hang timeout."""

    EVENT = "worker.hung"
    LEVEL = "warning"
    job: str
    attempt: int
    rank: int
    frame: str
    silent_s: float


@dataclass(frozen=True)
class StragglerFound(Record):
    """A rank's slowness score stayed low: the others wait for it (``progress.slowness``)."""

    EVENT = "straggler.found"
    LEVEL = "warning"
    job: str
    round: int
    rank: int
    score: float


@dataclass(frozen=True)
class StragglerCleared(Record):
    """A rank stopped being a straggler: its score recovered (``score``), or it is no longer
    scored (None: its round ended, or it left)."""

    EVENT = "straggler.cleared"
    job: str
    round: int
    rank: int
    score: float | None


@dataclass(frozen=True)
class RootCauseAmended(Record):
    """This node's failure replaced the root cause recorded for the job."""

    EVENT = "root_cause.amended"
    job: str
    node: str
    record: str  # the record's type name


# -- nodes ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeDrained(Record):
    EVENT = "node.drain"
    node: str
    job: str | None  # drained from this job only (None: from every job)
    grace_s: float | None
    by: str
    jobs: tuple[str, ...]  # the jobs affected
    forced: bool


@dataclass(frozen=True)
class NodeUndrained(Record):
    EVENT = "node.undrain"
    node: str
    job: str | None
    by: str = ""  # who gave the node back ("": an operator's undrain)


@dataclass(frozen=True)
class GpuUnhealthy(Record):
    """A GPU left the allocatable pool (``elasticd.gpu.health``); ``job`` held it then."""

    EVENT = "gpu.unhealthy"
    LEVEL = "warning"
    node: str
    uuid: str
    fault: Fault
    reason: str
    job: str | None


@dataclass(frozen=True)
class GpuReturned(Record):
    """An operator returned a GPU to the pool (``undrain --gpu``)."""

    EVENT = "gpu.returned"
    node: str
    uuid: str
    by: str


@dataclass(frozen=True)
class DaemonReady(Record):
    EVENT = "daemon.ready"
    node: str
    socket: str
    etcd: tuple[str, ...]
    devices: str  # "gpu" or "cpu"
    slots: int


@dataclass(frozen=True)
class DaemonStopping(Record):
    EVENT = "daemon.stopping"
    reason: str


@dataclass(frozen=True)
class LeaseLost(Record):
    EVENT = "lease.lost"
    LEVEL = "warning"
    node: str
    lease: int | None
    why: str


Happening = (
    JobSubmitted | JobJoining | JobLeft | JobSucceeded | JobFailed | JobSetupFailed | JobKilled
    | JobRemoved | JobExpired | JobOrphaned | RoundComplete | RoundBumped | WorkerFailed | WorkerHung
    | StragglerFound | StragglerCleared | RootCauseAmended | NodeDrained | NodeUndrained | DaemonReady
    | DaemonStopping | LeaseLost
    | GpuUnhealthy | GpuReturned
)  # fmt: skip

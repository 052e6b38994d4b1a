"""The control protocol's schema, the one source for ``elasticctl`` and the daemon.

Every command's arguments are a frozen dataclass with their defaults: the daemon decodes a
request into it (``elasticd.control.params.parse_args``), the CLI builds its requests from it
(``request``) and takes its option defaults from it (``default``). Every reply is a ``TypedDict``:
the daemon builds it, the CLI reads it, mypy checks both against the same keys, and
``elasticd.decode`` can check a reply at run time. The job states, which of them are terminal, and
the machine-readable fields a client needs (``JobView.waits_for``, ``JobView.code``, the error
``code``) are here too, so no client ever has to read a message's text to decide what to do.
Every time in a reply is seconds since the epoch (a float) in a field named ``*_at`` (all listed in
``TIME_FIELDS``; ``elasticctl status --json`` shows them in ISO 8601); durations are ``*_s`` seconds.

This module imports nothing heavy (no zmq, etcd client or psutil): a client can use it alone.

No ``from __future__ import annotations`` here, on purpose: Python 3.11 computes a TypedDict's
``__required_keys__`` wrongly when its annotations are strings, and tests read those.
"""

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NotRequired, TypedDict

from elasticd.errors import ErrorCode
from elasticd.events.schema import EventsArgs, EventsReply, EventView, SkippedEventView
from elasticd.jobs.spec import DEFAULT_JOIN_TIMEOUT_S, DEFAULT_LAST_CALL_S, EntryKind
from elasticd.jobs.state import EndReason, JobState

__all__ = [
    "COMMANDS",
    "TERMINAL_STATES",
    "TIME_FIELDS",
    "CallerView",
    "CommandSchema",
    "DrainArgs",
    "DrainReply",
    "EndReason",
    "EntryKind",
    "ErrorCode",
    "ErrorReply",
    "EventView",
    "EventsArgs",
    "EventsReply",
    "FailedRankView",
    "FailureView",
    "GpuView",
    "InvalidRecordView",
    "InventoryView",
    "JobReply",
    "JobState",
    "JobView",
    "KillArgs",
    "LogChunk",
    "LogsArgs",
    "LogsReply",
    "MemberEndState",
    "MemberView",
    "NoArgs",
    "NodeView",
    "NodesReply",
    "PingReply",
    "RmArgs",
    "RmReply",
    "RoundView",
    "SkippedEventView",
    "StatusArgs",
    "StatusReply",
    "SubmitArgs",
    "UndrainArgs",
    "UndrainReply",
    "WaitsFor",
    "default",
    "is_terminal",
    "request",
]

# -- job states ---------------------------------------------------------------------------------
# ``JobState`` (its transitions are in its docstring) and ``EndReason`` (a final job's ``code``)
# live in ``elasticd.jobs.state``; which states are terminal is decided there, once.
TERMINAL_STATES: frozenset[JobState] = frozenset(s for s in JobState if s.terminal)


def is_terminal(state: str | None) -> bool:
    """Whether a reply's ``state`` is one a job never leaves."""
    return state is not None and state in TERMINAL_STATES


class WaitsFor(StrEnum):
    """What a job that is not running waits for (``JobView.waits_for``; None when it waits for
    nothing a user can act on: it is running, ended, or its round is about to close)."""

    CAPACITY = "capacity"  # an allowed node has too few free slots (``short_of_capacity`` names them)
    NODES = "nodes"  # fewer than its minimum of nodes have joined the current round


class MemberEndState(StrEnum):
    """How a member's part in the job's last round ended: ``MemberView.state`` once the job has
    ended (while it runs, that is the member's agent state, or GONE when it publishes none)."""

    SUCCEEDED = "SUCCEEDED"  # its workers all exited 0 (its ``done`` marker)
    FAILED = "FAILED"  # its workers failed: the job's root cause is there, or it reported a failure
    KILLED = "KILLED"  # the job was killed: its workers were stopped
    STOPPED = "STOPPED"  # the job ended otherwise (another member failed, ...): its workers were stopped
    LOST = "LOST"  # no status from it: its daemon was gone at the end (or has restarted since)


# Every field of a reply that holds a time (seconds since the epoch), in any reply type.
TIME_FIELDS = frozenset(
    {
        "submitted_at",
        "started_at",
        "ended_at",
        "updated_at",
        "failed_at",
        "exited_at",
        "opened_at",
        "closed_at",
        "attempt_started_at",
        "last_step_at",
        "happened_at",
    }
)


# -- arguments ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NoArgs:
    pass


@dataclass(frozen=True)
class SubmitArgs:
    entry_kind: str  # an EntryKind value (checked by submit: a bad one is invalid_spec)
    entry: str
    cwd: str
    args: list[str] = field(default_factory=list)
    python: str = ""
    env: dict[str, str] = field(default_factory=dict)
    nnodes: str = "1"  # N or MIN:MAX
    nproc_per_node: int = 1
    max_restarts: int = 3
    name: str | None = None
    stop_grace_s: float | None = None  # None: the daemon's own setting
    nodes: list[str] = field(default_factory=list)
    last_call_s: float = DEFAULT_LAST_CALL_S
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    memory_limit_bytes: int | None = None
    cpu_limit: float | None = None
    nofile: int | None = None
    hang_timeout: str | None = None  # SECONDS or "auto"; None: no hang detection
    max_same_failures: int = 3  # end the job after failing the same way this often; 0: never
    warm: bool = True  # fork workers from a per-job zygote that imported torch once
    preload: list[str] = field(default_factory=list)  # modules the zygote imports besides torch
    job_id: str | None = None  # a job id of the submitter's choosing (torchrun's --rdzv-id)


@dataclass(frozen=True)
class RmArgs:
    job: str  # a job that has ended: its records and this node's logs of it are deleted


@dataclass(frozen=True)
class StatusArgs:
    job: str | None = None  # None: every job (the filters below apply to that list only)
    states: list[JobState] = field(default_factory=list)  # only jobs in one of these states ([]: any)
    user: str | None = None  # only this user's jobs


@dataclass(frozen=True)
class KillArgs:
    job: str


@dataclass(frozen=True)
class LogsArgs:
    job: str
    rank: int | None = None  # only this global rank
    cursor: dict[str, int] = field(default_factory=dict)  # from the previous reply
    attempt: int | None = None  # only this attempt (None: every one)
    since: float | None = None  # only attempts that started (here) at or after this time, epoch seconds
    tail: int | None = None  # logs the cursor does not name start at their rank's last N lines
    partial: bool = False  # send unfinished lines too (a progress bar's ``\r`` updates), not whole lines only

    def __post_init__(self) -> None:
        for name in ("rank", "attempt", "tail"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"argument {name!r} must be >= 0, got {value}")


@dataclass(frozen=True)
class DrainArgs:
    node: str
    job: str | None = None  # None: every job of the node
    grace_s: float | None = None
    force: bool = False


@dataclass(frozen=True)
class UndrainArgs:
    node: str
    job: str | None = None


def default(args: type[Any], name: str) -> Any:
    """The default of argument ``name`` of an argument dataclass (a fresh one for lists and dicts)."""
    for f in dataclasses.fields(args):
        if f.name != name:
            continue
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        raise ValueError(f"{args.__name__}.{name} is required: it has no default")
    raise ValueError(f"{args.__name__} has no argument {name!r}")


def request(args: Any) -> dict[str, Any]:
    """The ``args`` object of a request: the fields that differ from their defaults (the daemon
    fills in the rest from the same dataclass, so older daemons still read what newer CLIs send
    unless a new option is used)."""
    if not dataclasses.is_dataclass(args) or isinstance(args, type):
        raise TypeError(f"{args!r} is not an argument dataclass")
    out = {}
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required or value != default(type(args), f.name):
            out[f.name] = value
    return out


# -- replies ------------------------------------------------------------------------------------
class ErrorReply(TypedDict):
    """The ``error`` of a failed reply; clients decide on ``code`` (an ErrorCode value) only."""

    code: str
    message: str
    details: NotRequired[dict[str, Any]]


class FailedRankView(TypedDict):
    """Another rank that failed in the same round (``elasticd.jobs.state.FailedRank``)."""

    rank: int
    local_rank: int
    exit_code: int | None
    signal: str | None
    message: str  # one line
    failed_at: float | None
    node: NotRequired[str]  # set when it ran on another node than the root cause


class FailureView(TypedDict):
    """The root cause: the first worker to fail (``elasticd.jobs.state.WorkerFailure.to_json``)."""

    node: str
    attempt: int
    rank: int
    local_rank: int
    exit_code: int | None  # None when killed by a signal
    signal: str | None
    message: str
    output_tail: str
    oom: NotRequired[bool]  # this and the rest: absent in failures recorded by older daemons
    failed_at: NotRequired[float | None]  # its error file's timestamp, else when its exit was seen
    also_failed: NotRequired[list[FailedRankView]]  # the node's other failed ranks, first failed first
    also_failed_more: NotRequired[int]  # failed ranks beyond those listed
    kind: NotRequired[str]  # a FailureKind: user_code, oom, signal, hang, node_lost, infrastructure
    exception: NotRequired[str]  # the exception's type, when the output names one
    exited_at: NotRequired[float | None]
    step: NotRequired[int | None]  # the furthest step the failing node's ranks reported
    ran_s: NotRequired[float | None]  # how long the attempt ran before it failed
    frame: NotRequired[str]  # a hung rank's innermost frame, "train.py:42 in step"


class RankProgressView(TypedDict):
    """A rank's progress, as its node last published it (``elasticd.progress.tracker``)."""

    rank: int
    step: int | None  # the last step it reported; None: none yet (or it never reports)
    last_step_at: float | None  # when (its node's clock); "time since the last step" is now minus this
    steps_per_s: float | None
    step_time_s: float | None  # its median seconds per step, recently
    samples: int
    phase: str  # startup, step or checkpoint
    straggler: bool  # its step time is far above the job's median (elasticd.progress.tracker.stragglers)


class MemberView(TypedDict):
    node: str
    address: str
    group_rank: int
    ranks: list[int]  # [first, last] global rank of the node's workers
    state: str  # the node's agent state, or GONE when it publishes none; a MemberEndState once ended
    devices: str
    pids: list[int]
    progress: NotRequired[list[RankProgressView]]  # its ranks' progress in this round, when published


class InvalidRecordView(TypedDict):
    key: str
    why: str


class JobView(TypedDict):
    """One job, as ``submit``, ``status`` and ``kill`` show it (``elasticd.jobs.view.job_view``).

    Once the job has ended, ``world_size``, ``members`` and ``master`` are its last round's, and
    each member's ``state`` is a ``MemberEndState``.

    When etcd cannot be reached, ``status`` of a job this node takes part in answers with this
    node's own view instead: ``stale`` is true and only ``id``, ``state``, ``reason``, ``round``,
    ``devices``, ``pids``, ``failure`` and ``updated_at`` are given.
    """

    id: str
    state: str  # a JobState value
    reason: str  # for people: never parse it (``waits_for`` and ``code`` are for programs)
    round: int
    attempt: int
    restarts: int
    world_size: int
    members: list[MemberView]
    nodes: list[str]
    waiting_nodes: list[str]  # nodes that asked to join the running job at its next round
    node_states: dict[str, str]
    master: str  # host:port, "" before the first round closed
    devices: str  # this node's devices for the job
    pids: list[int]  # this node's live workers
    started_at: float | None  # round 0's close (else submitted_at, once that is deleted); None: never ran
    ended_at: float | None
    code: str | None  # an EndReason value once the job ended (or has an invalid record)
    waits_for: WaitsFor | None
    short_of_capacity: list[str]  # nodes allowed to take part that lack free slots now
    invalid_records: NotRequired[list[InvalidRecordView]]
    name: NotRequired[str]  # this and the rest up to ``allowed_nodes``: when the spec is readable
    user: NotRequired[str]
    max_restarts: NotRequired[int]
    nnodes: NotRequired[str]
    nproc_per_node: NotRequired[int]
    argv: NotRequired[list[str]]
    submitted_at: NotRequired[float]
    submitted_on: NotRequired[str]
    allowed_nodes: NotRequired[list[str]]
    failure: NotRequired[FailureView | None]
    cause: NotRequired[str | None]  # a FailureKind: what ended the job or opened its round; None: nothing
    error: NotRequired[str]  # FAILED jobs only
    stale: NotRequired[bool]
    updated_at: NotRequired[float]


class JobReply(TypedDict):
    """``kill``, and ``status`` of one job."""

    job: JobView


class StatusReply(TypedDict, total=False):
    """``status``: ``job`` when one was asked for, ``jobs`` (oldest first) otherwise."""

    job: JobView
    jobs: list[JobView]


class LogChunk(TypedDict):
    attempt: int
    rank: int
    text: str  # whole lines, unless the job ended or ``partial`` was asked for


class RoundView(TypedDict):
    """The job's current round: why it was opened, and when it opened and closed."""

    round: int
    reason: str  # why it was opened: start, worker_failed, member_lost, scale_up or member_left
    detail: str  # for people: what happened (a failure's summary, the nodes that left or wait)
    spends_restart: bool  # a failure: it spent one of the job's restarts
    opened_at: float
    closed_at: float | None  # when its ranks were assigned; None while it is open


class LogsReply(TypedDict):
    chunks: list[LogChunk]
    cursor: dict[str, int]  # pass it back to get what follows
    state: str | None  # the job's JobState value
    node: str | None  # the node that answered: the logs are the ones it holds
    more: NotRequired[bool]  # this and the rest: absent from older daemons. More is there to read now
    job: NotRequired[JobView]  # the job, as ``status`` shows it
    round_info: NotRequired[RoundView | None]  # None when the job's round record cannot be read
    attempt_started_at: NotRequired[dict[str, float]]  # attempts with logs here, and when each started


class GpuView(TypedDict):
    index: int
    uuid: str
    name: str
    memory_mib: int


class InventoryView(TypedDict):
    kind: str
    slots: int
    gpus: list[GpuView]


class NodeView(TypedDict):
    """A live node (``elasticd.node.registry.NodeRecord.to_json``)."""

    node: str
    slots: int
    host: str
    version: str
    address: str
    inventory: InventoryView
    free_slots: int
    free_devices: str
    jobs: list[str]
    draining: bool


class NodesReply(TypedDict):
    nodes: list[NodeView]


class RmReply(TypedDict):
    job: str
    logs_removed: bool  # this node held logs of the job (other nodes drop theirs on their own)


class DrainReply(TypedDict):
    node: str
    job: str | None
    jobs: list[str]  # running jobs the node leaves
    forced: bool  # some job went below its minimum (``force``)


class UndrainReply(TypedDict):
    node: str
    job: str | None


class CallerView(TypedDict):
    uid: int
    gid: int
    user: str


class PingReply(TypedDict):
    node: str
    version: str
    pid: int
    uptime_s: float
    etcd: list[str]
    embedded_etcd: bool
    you: CallerView


# -- the commands -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CommandSchema:
    """What a command takes and what it answers (a TypedDict); its handler and who may call it
    are the daemon's business (``elasticd.control.commands``)."""

    args: type[Any]
    reply: type[Any]


COMMANDS: dict[str, CommandSchema] = {
    "ping": CommandSchema(NoArgs, PingReply),
    "submit": CommandSchema(SubmitArgs, JobView),
    "status": CommandSchema(StatusArgs, StatusReply),
    "kill": CommandSchema(KillArgs, JobReply),
    "logs": CommandSchema(LogsArgs, LogsReply),
    "nodes": CommandSchema(NoArgs, NodesReply),
    "drain": CommandSchema(DrainArgs, DrainReply),
    "undrain": CommandSchema(UndrainArgs, UndrainReply),
    "rm": CommandSchema(RmArgs, RmReply),
    "events": CommandSchema(EventsArgs, EventsReply),  # schema in elasticd.events.schema
}

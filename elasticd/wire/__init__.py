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

This package imports nothing heavy (no zmq, etcd client or psutil): a client can use it alone.

Modules: ``states`` (job states as replies carry them), ``args`` (every command's arguments),
``replies`` (every reply), and here the table of commands; every name is importable from here.
"""

from dataclasses import dataclass
from typing import Any

from elasticd.errors import ErrorCode
from elasticd.history.schema import EventsArgs, EventsReply, EventView, SkippedEventView
from elasticd.terms.options import EntryKind
from elasticd.terms.state import EndReason, JobState
from elasticd.wire.args import (
    CheckArgs,
    DrainArgs,
    KillArgs,
    LogsArgs,
    NoArgs,
    RmArgs,
    StatusArgs,
    SubmitArgs,
    UndrainArgs,
    default,
    request,
)
from elasticd.wire.replies import (
    ROW_REASON_CHARS,
    CallerView,
    CheckFigures,
    CheckReply,
    CheckRow,
    DrainReply,
    ErrorReply,
    EtcdSpaceView,
    FailedRankView,
    FailureView,
    GoodputView,
    GpuView,
    InvalidRecordView,
    InventoryView,
    JobReply,
    JobRow,
    JobView,
    LogChunk,
    LogsReply,
    MemberView,
    NodesReply,
    NodeView,
    PingReply,
    QueueRow,
    QueueView,
    RankProgressView,
    Returned,
    RmReply,
    RoundView,
    StatusReply,
    UndrainReply,
)
from elasticd.wire.states import TERMINAL_STATES, TIME_FIELDS, MemberEndState, WaitsFor, is_terminal

__all__ = [
    "COMMANDS",
    "ROW_REASON_CHARS",
    "TERMINAL_STATES",
    "TIME_FIELDS",
    "CallerView",
    "CheckArgs",
    "CheckFigures",
    "CheckReply",
    "CheckRow",
    "CommandSchema",
    "DrainArgs",
    "DrainReply",
    "EndReason",
    "EntryKind",
    "ErrorCode",
    "ErrorReply",
    "EtcdSpaceView",
    "EventView",
    "EventsArgs",
    "EventsReply",
    "FailedRankView",
    "FailureView",
    "GoodputView",
    "GpuView",
    "InvalidRecordView",
    "InventoryView",
    "JobReply",
    "JobRow",
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
    "QueueRow",
    "QueueView",
    "RankProgressView",
    "Returned",
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
    "events": CommandSchema(EventsArgs, EventsReply),  # schema in elasticd.history.schema
    "check": CommandSchema(CheckArgs, CheckReply),
}

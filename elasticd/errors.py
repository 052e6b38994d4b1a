"""Every error the daemon can report, and its stable code: the one place that maps them.

Clients and scripts match on ``ErrorCode`` values (strings), never on messages. Third-party
failures are wrapped into these types at the boundary (``raise EtcdUnavailable(...) from exc``);
anything else that escapes a command becomes ``INTERNAL`` and its traceback goes to the log only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Stable, documented error codes carried in control replies."""

    BAD_REQUEST = "bad_request"  # not JSON, not an object, missing envelope fields
    UNSUPPORTED_VERSION = "unsupported_version"  # envelope "v" we do not speak
    TOO_LARGE = "too_large"  # message over the size cap
    UNKNOWN_COMMAND = "unknown_command"
    INVALID_ARGS = "invalid_args"  # arguments of the wrong type, missing or unknown
    INVALID_SPEC = "invalid_spec"  # a job spec that can never run
    SCRIPT_NOT_FOUND = "script_not_found"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"  # more GPUs/slots than the host has
    JOB_NOT_FOUND = "job_not_found"
    NODE_NOT_FOUND = "node_not_found"
    RANK_NOT_FOUND = "rank_not_found"  # ``logs --rank``: the job has no such rank, and never will
    ATTEMPT_NOT_FOUND = "attempt_not_found"  # ``logs --attempt``: the job has not come to it
    PERMISSION_DENIED = "permission_denied"
    CONFLICT = "conflict"  # the job is in a state where the request makes no sense
    QUOTA_EXCEEDED = "quota_exceeded"  # over a per-user limit (jobs held, submits a minute); names it
    ETCD_FULL = "etcd_full"  # etcd's database is near its quota, or alarmed: new work is refused
    SNAPSHOT_SPACE = "snapshot_space"  # /dev/shm is smaller than the node's memory snapshot bound
    ETCD_UNAVAILABLE = "etcd_unavailable"
    INTERNAL = "internal"


class ElasticdError(Exception):
    """Base of every error that has a stable code."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.details:
            wire["details"] = self.details
        return wire


class BadRequest(ElasticdError):
    code = ErrorCode.BAD_REQUEST


class UnsupportedVersion(ElasticdError):
    code = ErrorCode.UNSUPPORTED_VERSION


class TooLarge(ElasticdError):
    code = ErrorCode.TOO_LARGE


class UnknownCommand(ElasticdError):
    code = ErrorCode.UNKNOWN_COMMAND


class InvalidArgs(ElasticdError):
    code = ErrorCode.INVALID_ARGS


class InvalidSpec(ElasticdError):
    code = ErrorCode.INVALID_SPEC


class ScriptNotFound(ElasticdError):
    code = ErrorCode.SCRIPT_NOT_FOUND


class InsufficientCapacity(ElasticdError):
    code = ErrorCode.INSUFFICIENT_CAPACITY


class JobNotFound(ElasticdError):
    code = ErrorCode.JOB_NOT_FOUND


class NodeNotFound(ElasticdError):
    code = ErrorCode.NODE_NOT_FOUND


class RankNotFound(ElasticdError):
    code = ErrorCode.RANK_NOT_FOUND


class AttemptNotFound(ElasticdError):
    code = ErrorCode.ATTEMPT_NOT_FOUND


class PermissionDenied(ElasticdError):
    code = ErrorCode.PERMISSION_DENIED


class Conflict(ElasticdError):
    code = ErrorCode.CONFLICT


class EtcdUnavailable(ElasticdError):
    code = ErrorCode.ETCD_UNAVAILABLE


class QuotaExceeded(ElasticdError):
    """Details name the limit (``limit``, ``used``) and the setting that sets it (``setting``)."""

    code = ErrorCode.QUOTA_EXCEEDED


class SnapshotSpace(ElasticdError):
    """Details name the node's ``/dev/shm`` size (``shm_bytes``), the bound and its setting."""

    code = ErrorCode.SNAPSHOT_SPACE


class EtcdFull(ElasticdError):
    code = ErrorCode.ETCD_FULL


class EtcdNoSpace(EtcdFull, EtcdUnavailable):
    """etcd refused a write because its database reached its quota (the NOSPACE alarm). An
    ``EtcdUnavailable`` to the daemon (what cannot be written now is retried, as in an outage;
    reads, deletes and lease keep-alives still work), and ``etcd_full`` to a client."""


class ConfigError(Exception):
    """A configuration that the daemon cannot start with (reported at startup, never on the wire)."""


def to_wire(exc: BaseException) -> dict[str, Any]:
    """Map any exception to the error object of a control reply."""
    if isinstance(exc, ElasticdError):
        return exc.to_wire()
    return {"code": ErrorCode.INTERNAL.value, "message": "internal error; see the daemon log"}

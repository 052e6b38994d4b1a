"""Which happenings are cluster events, and what each one says: pure, unit-tested.

The daemon's typed records (``elasticd.happenings``) are the source; ``describe`` picks the few
that make the cluster's history (rare ones: submits, joins, rounds, failures, drains, hangs),
names their kind, writes their one-line message and keeps their useful fields. Everything else
(keep-alives, scans, per-step progress) is only logged and never reaches etcd.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, assert_never

from elasticd.happenings import records as r
from elasticd.history.model import MAX_FIELDS, ClusterEvent, clip, one_line
from elasticd.terms.ids import valid_job_id, valid_node_id


class EventKind(StrEnum):
    SUBMITTED = "submitted"  # a job was submitted (on the node that took it)
    JOINED = "joined"  # a node took part in a job
    ROUND = "round"  # a round closed: ranks assigned, workers start
    RESTART = "restart"  # a new round was opened: a failure, a lost or leaving node, a scale-up
    WORKER_FAILED = "worker_failed"  # a node's workers failed (its own root cause)
    HANG = "hang"  # a rank stopped making progress
    STRAGGLER = "straggler"  # a rank became, or stopped being, the one the others wait for
    ROOT_CAUSE = "root_cause"  # an earlier failure elsewhere was found to be the root cause
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the job ended FAILED, with its root cause
    KILLED = "killed"
    LEFT = "left"  # a node stopped taking part in a job
    DRAIN = "drain"
    UNDRAIN = "undrain"
    REMOVED = "removed"  # the job's records were deleted (rm, or past retention)
    NODE_UP = "node_up"
    NODE_DOWN = "node_down"
    LEASE_LOST = "lease_lost"
    GPU_UNHEALTHY = "gpu_unhealthy"  # a GPU left the pool
    GPU_RETURNED = "gpu_returned"  # an operator returned it


@dataclass(frozen=True)
class Said:
    """What a record says in the history, before its job and node are checked."""

    kind: EventKind
    message: str
    fields: dict[str, Any]
    job: str | None = None
    node: str | None = None  # the node it names (None: see own_node)
    own_node: bool = True  # with no node named, it happened on the node that published it


def _s(value: object, default: str = "?") -> str:
    return default if value is None else str(value)


def _v(value: StrEnum | None) -> str | None:
    return None if value is None else value.value


def _failed(h: r.JobFailed) -> str:
    text = f"job failed ({h.code.value}): {_s(h.reason, '')}".rstrip(": ")
    cause = h.root_cause
    return f"{text}; root cause: {cause}" if cause and cause not in text else text


def _present(**fields: Any) -> dict[str, Any]:
    """The fields whose record leaves them out of its line when None (they are absent then)."""
    return {name: value for name, value in fields.items() if value is not None}


JobEnd = r.JobSucceeded | r.JobFailed | r.JobSetupFailed | r.JobKilled | r.JobRemoved | r.JobExpired
RoundEvent = (
    r.RoundComplete | r.RoundBumped | r.JobOrphaned | r.WorkerFailed | r.WorkerHung | r.RootCauseAmended
    | r.StragglerFound | r.StragglerCleared
)  # fmt: skip
NodeEvent = (
    r.JobSubmitted | r.JobJoining | r.JobLeft | r.NodeDrained | r.NodeUndrained | r.DaemonReady
    | r.DaemonStopping | r.LeaseLost | r.GpuUnhealthy | r.GpuReturned
)  # fmt: skip


def describe(h: r.Happening) -> Said | None:
    """What ``h`` says in the cluster's history; None for records that are only logged (none yet).

    Each group's ``match`` ends in ``assert_never``: mypy fails on a record without a case."""
    match h:
        case r.JobSucceeded() | r.JobFailed() | r.JobSetupFailed() | r.JobKilled() | r.JobRemoved():
            return _job_end(h)
        case r.JobExpired():
            return _job_end(h)
        case r.RoundComplete() | r.RoundBumped() | r.JobOrphaned() | r.WorkerFailed() | r.WorkerHung():
            return _round(h)
        case r.RootCauseAmended() | r.StragglerFound() | r.StragglerCleared():
            return _round(h)
        case r.JobSubmitted() | r.JobJoining() | r.JobLeft() | r.NodeDrained() | r.NodeUndrained():
            return _node(h)
        case r.DaemonReady() | r.DaemonStopping() | r.LeaseLost():
            return _node(h)
        case r.GpuUnhealthy() | r.GpuReturned():
            return _node(h)
        case _:
            assert_never(h)


def _job_end(h: JobEnd) -> Said:
    match h:
        case r.JobSucceeded():
            return Said(EventKind.SUCCEEDED, "job succeeded", {"round": h.round, "code": h.code.value}, h.job)
        case r.JobFailed():
            fields = {
                **_present(round=h.round),
                "code": h.code.value,
                **_present(reason=h.reason, cause=_v(h.cause), root_cause=h.root_cause, key=h.key),
            }
            return Said(EventKind.FAILED, _failed(h), fields, h.job, own_node=False)
        case r.JobSetupFailed():
            fields = {"code": h.code.value, "why": h.why}
            return Said(EventKind.FAILED, f"job failed ({h.code.value}): {h.why}", fields, h.job, h.node)
        case r.JobKilled():
            return Said(EventKind.KILLED, f"killed by {h.by}", {"by": h.by}, h.job)
        case r.JobRemoved():
            return Said(EventKind.REMOVED, "records removed (rm)", {}, h.job)
        case r.JobExpired():
            return Said(EventKind.REMOVED, "records removed (past retention)", {}, h.job, own_node=False)
        case _:
            assert_never(h)


def _round(h: RoundEvent) -> Said:
    match h:
        case r.RoundComplete():
            message = (
                f"round {h.round} closed: world size {h.world_size}, members {clip(h.members)} ({h.why})"
            )
            fields = {"round": h.round, "world_size": h.world_size, "members": h.members,
                      "reason": _v(h.reason), "rendezvous_s": h.rendezvous_s, "why": h.why}  # fmt: skip
            return Said(EventKind.ROUND, message, fields, h.job)
        case r.RoundBumped():
            message = f"round {h.round} opened ({h.reason.value}): {h.detail}"
            fields = {"round": h.round, "reason": h.reason.value, "spend": h.spend, "restarts": h.restarts,
                      "detail": h.detail}  # fmt: skip
            return Said(EventKind.RESTART, message, fields, h.job)
        case r.JobOrphaned():
            message = f"round {h.round}'s every node was lost: the job restarts"
            return Said(
                EventKind.RESTART, message, {"round": h.round, "action": h.action}, h.job, own_node=False
            )
        case r.WorkerFailed():
            fields = {"cause": h.cause.value, "round": h.round, "summary": h.summary}
            return Said(EventKind.WORKER_FAILED, h.summary, fields, h.job, h.node)
        case r.WorkerHung():
            message = f"rank {h.rank} made no progress for {h.silent_s}s at {h.frame}"
            fields = {"attempt": h.attempt, "rank": h.rank, "frame": h.frame, "silent_s": h.silent_s}
            return Said(EventKind.HANG, message, fields, h.job)
        case r.StragglerFound():
            message = (
                f"rank {h.rank} is a straggler: slowness score {h.score:.2f} (1.0: as fast as the fastest)"
            )
            fields = {"round": h.round, "rank": h.rank, "straggler": True, "score": h.score}
            return Said(EventKind.STRAGGLER, message, fields, h.job)
        case r.StragglerCleared():
            why = f"slowness score {h.score:.2f}" if h.score is not None else "no longer scored"
            message = f"rank {h.rank} is no longer a straggler ({why})"
            fields = {"round": h.round, "rank": h.rank, "straggler": False, "score": h.score}
            return Said(EventKind.STRAGGLER, message, fields, h.job)
        case r.RootCauseAmended():
            message = f"root cause moved to this node's failure ({h.record})"
            return Said(EventKind.ROOT_CAUSE, message, {"record": h.record}, h.job, h.node)
        case _:
            assert_never(h)


def _node(h: NodeEvent) -> Said:
    match h:
        case r.JobSubmitted():
            fields: dict[str, Any] = {"user": h.user, "nnodes": h.nnodes}
            return Said(EventKind.SUBMITTED, f"submitted by {h.user}, nodes {h.nnodes}", fields, h.job)
        case r.JobJoining():
            return Said(EventKind.JOINED, "joined the job", {"devices": h.devices}, h.job, h.node)
        case r.JobLeft():
            return Said(EventKind.LEFT, "left the job", {}, h.job, h.node)
        case r.NodeDrained():
            message = f"drained by {h.by}" + (f" from job {h.job}" if h.job else "")
            fields = {"by": h.by, "grace_s": h.grace_s, "forced": h.forced, "jobs": h.jobs}
            return Said(EventKind.DRAIN, message, fields, h.job, h.node, own_node=False)
        case r.NodeUndrained():
            message = f"undrained by {h.by}" if h.by else "undrained"
            return Said(EventKind.UNDRAIN, message, _present(by=h.by or None), h.job, h.node, own_node=False)
        case r.DaemonReady():
            fields = {"slots": h.slots, "devices": h.devices}
            return Said(EventKind.NODE_UP, "elasticd started", fields, node=h.node)
        case r.DaemonStopping():
            return Said(EventKind.NODE_DOWN, f"elasticd stopping ({h.reason})", {"reason": h.reason})
        case r.LeaseLost():
            return Said(EventKind.LEASE_LOST, f"node lease lost: {h.why}", {"why": h.why}, node=h.node)
        case r.GpuUnhealthy():
            fields = {"uuid": h.uuid, "fault": h.fault.value, "reason": h.reason}
            return Said(EventKind.GPU_UNHEALTHY, f"GPU {h.uuid} unhealthy: {h.reason}", fields, h.job, h.node)
        case r.GpuReturned():
            fields = {"uuid": h.uuid, "by": h.by}
            return Said(
                EventKind.GPU_RETURNED,
                f"GPU {h.uuid} returned by {h.by}",
                fields,
                None,
                h.node,
                own_node=False,
            )
        case _:
            assert_never(h)


def select(h: r.Happening, node: str, now: float) -> ClusterEvent | None:
    """The cluster event ``h`` makes (``node``: the daemon that published it), or None.

    Never raises on odd values: a record is not worth a crash (an event whose job or node is not
    a valid id is not recorded)."""
    try:
        said = describe(h)
    except Exception:  # a value of an unexpected type: not worth a crash
        return None
    if said is None:
        return None
    where = said.node if said.node is not None else (node if said.own_node else None)
    if (said.job is not None and not valid_job_id(said.job)) or (
        where is not None and not valid_node_id(where)
    ):
        return None
    kept = {name: clip(value) for name, value in said.fields.items()}
    return ClusterEvent(
        now, said.kind.value, said.job, where, one_line(said.message), dict(list(kept.items())[:MAX_FIELDS])
    )

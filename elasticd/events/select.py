"""Which daemon log events are cluster events, and what each one says: pure, unit-tested.

The daemon's structlog events are the source (``elasticd.log.subscribe``); this table picks the
few that make the cluster's history (rare ones: submits, joins, rounds, failures, drains, hangs),
names their kind, writes their one-line message and keeps their useful fields. Everything else
(keep-alives, scans, per-step progress) never reaches etcd.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from elasticd.events.model import MAX_FIELDS, ClusterEvent, clip, one_line
from elasticd.terms.ids import valid_job_id, valid_node_id


class EventKind(StrEnum):
    SUBMITTED = "submitted"  # a job was submitted (on the node that took it)
    JOINED = "joined"  # a node took part in a job
    ROUND = "round"  # a round closed: ranks assigned, workers start
    RESTART = "restart"  # a new round was opened: a failure, a lost or leaving node, a scale-up
    WORKER_FAILED = "worker_failed"  # a node's workers failed (its own root cause)
    HANG = "hang"  # a rank stopped making progress
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


Say = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class Rule:
    kind: EventKind
    say: Say  # the message
    keep: tuple[str, ...] = ()  # fields copied (when present)
    own_node: bool = True  # the event happened on the node that logged it (unless it names one)


def _get(f: Mapping[str, Any], name: str, default: str = "?") -> str:
    value = f.get(name)
    return default if value is None else str(value)


def _failed(f: Mapping[str, Any]) -> str:
    text = f"job failed ({_get(f, 'code')}): {_get(f, 'reason', '')}".rstrip(": ")
    cause = f.get("root_cause")
    return f"{text}; root cause: {cause}" if cause and cause not in text else text


RULES: dict[str, Rule] = {
    "job.submitted": Rule(
        EventKind.SUBMITTED,
        lambda f: f"submitted by {_get(f, 'user')}, nodes {_get(f, 'nnodes')}",
        ("user", "nnodes"),
    ),
    "job.joining": Rule(EventKind.JOINED, lambda f: "joined the job", ("devices",)),
    "round.complete": Rule(
        EventKind.ROUND,
        lambda f: (
            f"round {_get(f, 'round')} closed: world size {_get(f, 'world_size')}, "
            f"members {clip(f.get('members'))} ({_get(f, 'why', '')})"
        ),
        ("round", "world_size", "members", "reason", "rendezvous_s", "why"),
    ),
    "round.bumped": Rule(
        EventKind.RESTART,
        lambda f: f"round {_get(f, 'round')} opened ({_get(f, 'reason')}): {_get(f, 'detail', '')}",
        ("round", "reason", "spend", "restarts", "detail", "cause"),
    ),
    "job.orphaned": Rule(
        EventKind.RESTART,
        lambda f: f"round {_get(f, 'round')}'s every node was lost: the job restarts",
        ("round", "action"),
        own_node=False,
    ),
    "worker.failed": Rule(
        EventKind.WORKER_FAILED, lambda f: _get(f, "summary"), ("cause", "round", "summary")
    ),
    "worker.hung": Rule(
        EventKind.HANG,
        lambda f: f"rank {_get(f, 'rank')} made no progress for {_get(f, 'silent_s')}s at {_get(f, 'frame')}",
        ("attempt", "rank", "frame", "silent_s"),
    ),
    "root_cause.amended": Rule(
        EventKind.ROOT_CAUSE,
        lambda f: f"root cause moved to this node's failure ({_get(f, 'record')})",
        ("record",),
    ),
    "job.succeeded": Rule(EventKind.SUCCEEDED, lambda f: "job succeeded", ("round", "code")),
    "job.failed": Rule(
        EventKind.FAILED, _failed, ("round", "code", "reason", "cause", "root_cause", "key"), own_node=False
    ),
    "job.killed": Rule(EventKind.KILLED, lambda f: f"killed by {_get(f, 'by')}", ("by",)),
    "job.setup_failed": Rule(
        EventKind.FAILED, lambda f: f"job failed ({_get(f, 'code')}): {_get(f, 'why', '')}", ("code", "why")
    ),
    "job.left": Rule(EventKind.LEFT, lambda f: "left the job"),
    "node.drain": Rule(
        EventKind.DRAIN,
        lambda f: f"drained by {_get(f, 'by')}" + (f" from job {f['job']}" if f.get("job") else ""),
        ("by", "grace_s", "forced", "jobs"),
        own_node=False,
    ),
    "node.undrain": Rule(EventKind.UNDRAIN, lambda f: "undrained", (), own_node=False),
    "job.removed": Rule(EventKind.REMOVED, lambda f: "records removed (rm)"),
    "job.expired": Rule(EventKind.REMOVED, lambda f: "records removed (past retention)", (), own_node=False),
    "daemon.ready": Rule(EventKind.NODE_UP, lambda f: "elasticd started", ("slots", "devices")),
    "daemon.stopping": Rule(
        EventKind.NODE_DOWN, lambda f: f"elasticd stopping ({_get(f, 'reason')})", ("reason",)
    ),
    "lease.lost": Rule(EventKind.LEASE_LOST, lambda f: f"node lease lost: {_get(f, 'why')}", ("why",)),
}


def select(event: str, fields: Mapping[str, Any], node: str, now: float) -> ClusterEvent | None:
    """The cluster event a log event makes (``node``: the daemon that logged it), or None.

    Never raises on odd fields: a log line is not worth a crash (a field that does not fit is
    dropped; an event whose job or node is not a valid id is not recorded)."""
    rule = RULES.get(event)
    if rule is None:
        return None
    job = fields.get("job")
    named = fields.get("node")
    where = named if named is not None else (node if rule.own_node else None)
    if (job is not None and not (isinstance(job, str) and valid_job_id(job))) or (
        where is not None and not (isinstance(where, str) and valid_node_id(where))
    ):
        return None
    kept = {name: clip(fields[name]) for name in rule.keep if name in fields}
    try:
        message = one_line(rule.say(fields))
    except Exception:  # a field of an unexpected type: the event still counts, with its name
        message = event
    return ClusterEvent(now, rule.kind.value, job, where, message, dict(list(kept.items())[:MAX_FIELDS]))

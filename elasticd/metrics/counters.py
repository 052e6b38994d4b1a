"""The metrics that count events: a subscriber of the daemon's event bus (``elasticd.log``).

Nothing in the control logic counts anything: it logs what happened (``round.bumped``,
``round.complete``, ``job.failed``, ...) and this subscriber turns the events into counters and
histograms, in the daemon's own registry (never the process-wide default one, so daemons that
share a process do not share metrics).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

# Rendezvous and recovery take from well under a second (a local restart) to minutes (waiting for
# nodes, a drain's grace).
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
RECOVERY_REASONS = frozenset({"worker_failed", "member_lost"})


def _label(value: Any, known: frozenset[str] | None = None) -> str:
    """A label value from a log field: bounded, and from a known set when one is given."""
    text = str(value) if value is not None else ""
    if known is not None:
        return text if text in known else "other"
    return text[:40]


REASONS = frozenset({"start", "worker_failed", "member_lost", "scale_up", "member_left"})
END_STATES = frozenset({"SUCCEEDED", "FAILED", "KILLED"})
FAILURE_KINDS = frozenset({"user_code", "oom", "signal", "hang", "node_lost", "infrastructure"})


class EventMetrics:
    """Counters and histograms fed by ``observe`` (thread-safe, as prometheus_client's are)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.restarts = Counter(
            "elasticd_restarts",
            "New rounds opened by this node, by reason (worker_failed and member_lost spend a restart)",
            ["reason"],
            registry=registry,
        )
        self.rendezvous = Histogram(
            "elasticd_rendezvous_duration_seconds",
            "From a round's opening to its close (ranks assigned), for rounds this node led",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.recovery = Histogram(
            "elasticd_recovery_duration_seconds",
            "From a failure's new round opening to its close, for rounds opened by a failure or a "
            "lost node that this node led (the previous workers were stopped by then)",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.jobs_ended = Counter(
            "elasticd_jobs_ended", "Jobs this node ended, by final state", ["state"], registry=registry
        )
        self.worker_failures = Counter(
            "elasticd_worker_failures",
            "This node's worker groups that failed, by cause",
            ["cause"],
            registry=registry,
        )
        self.hangs = Counter("elasticd_hangs", "Hung ranks found on this node", registry=registry)
        self.submits = Counter("elasticd_jobs_submitted", "Jobs submitted to this node", registry=registry)
        self.drains = Counter("elasticd_drains", "Drains requested through this node", registry=registry)
        self.lease_lost = Counter("elasticd_lease_lost", "Times this node lost its lease", registry=registry)

    def observe(self, event: str, fields: Mapping[str, Any]) -> None:
        match event:
            case "round.bumped":
                self.restarts.labels(_label(fields.get("reason"), REASONS)).inc()
            case "job.orphaned":
                self.restarts.labels("member_lost").inc()
            case "round.complete":
                self._round_closed(fields)
            case "job.succeeded":
                self.jobs_ended.labels("SUCCEEDED").inc()
            case "job.failed" | "job.setup_failed":
                self.jobs_ended.labels("FAILED").inc()
            case "job.killed":
                self.jobs_ended.labels("KILLED").inc()
            case "worker.failed":
                self.worker_failures.labels(_label(fields.get("cause"), FAILURE_KINDS)).inc()
            case "worker.hung":
                self.hangs.inc()
            case "job.submitted":
                self.submits.inc()
            case "node.drain":
                self.drains.inc()
            case "lease.lost":
                self.lease_lost.inc()

    def _round_closed(self, fields: Mapping[str, Any]) -> None:
        took = fields.get("rendezvous_s")
        if not isinstance(took, int | float) or isinstance(took, bool) or not 0 <= took < 1e7:
            return
        self.rendezvous.observe(took)
        if fields.get("reason") in RECOVERY_REASONS:
            self.recovery.observe(took)

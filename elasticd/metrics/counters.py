"""The metrics that count what happened: a subscriber of the daemon's typed bus
(``elasticd.happenings``).

Nothing in the control logic counts anything: it publishes what happened (``RoundBumped``,
``RoundComplete``, ``JobFailed``, ...) and this subscriber turns the records into counters and
histograms, in the daemon's own registry (never the process-wide default one, so daemons that
share a process do not share metrics).
"""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Histogram

from elasticd.happenings import records as r
from elasticd.jobs.room import lent_for
from elasticd.terms.state import FailureKind, Fault, JobState, RoundReason

# Rendezvous and recovery take from well under a second (a local restart) to minutes (waiting for
# nodes, a drain's grace).
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
RECOVERY_REASONS = frozenset({RoundReason.WORKER_FAILED, RoundReason.MEMBER_LOST})
REASONS = frozenset(RoundReason)
FAILURE_KINDS = frozenset(FailureKind)
GPU_FAULTS = frozenset(Fault)


def _label(value: StrEnum, known: frozenset[StrEnum]) -> str:
    """A label value: one of ``known`` (the label's set stays bounded whatever a record holds)."""
    return value.value if value in known else "other"


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
        self.stragglers = Counter(
            "elasticd_stragglers",
            "Ranks named stragglers by the jobs this node judges (group rank 0's node)",
            registry=registry,
        )
        self.submits = Counter("elasticd_jobs_submitted", "Jobs submitted to this node", registry=registry)
        self.drains = Counter("elasticd_drains", "Drains requested through this node", registry=registry)
        self.shrinks = Counter(
            "elasticd_shrinks",
            "Nodes this node (as the janitor) drained out of elastic jobs to make room for a waiting "
            "job of a higher priority",
            registry=registry,
        )
        self.growths = Counter(
            "elasticd_growths",
            "Nodes this node (as the janitor) gave back to the elastic jobs that lent them, once the "
            "job they were lent to ended",
            registry=registry,
        )
        self.gpu_unhealthy = Counter(
            "elasticd_gpu_unhealthy",
            "GPUs of this node that left the pool, by fault",
            ["fault"],
            registry=registry,
        )
        self.lease_lost = Counter("elasticd_lease_lost", "Times this node lost its lease", registry=registry)

    def observe(self, h: r.Happening) -> None:
        match h:
            case r.RoundBumped():
                self.restarts.labels(_label(h.reason, REASONS)).inc()
            case r.JobOrphaned():
                self.restarts.labels(RoundReason.MEMBER_LOST.value).inc()
            case r.RoundComplete():
                self._round_closed(h)
            case r.JobSucceeded() | r.JobFailed() | r.JobSetupFailed() | r.JobKilled():
                self._job_ended(h)
            case r.WorkerFailed():
                self.worker_failures.labels(_label(h.cause, FAILURE_KINDS)).inc()
            case r.WorkerHung():
                self.hangs.inc()
            case r.StragglerFound():
                self.stragglers.inc()
            case r.JobSubmitted():
                self.submits.inc()
            case r.NodeDrained() | r.NodeUndrained():
                self._drain(h)
            case r.LeaseLost():
                self.lease_lost.inc()
            case r.GpuUnhealthy():
                self.gpu_unhealthy.labels(_label(h.fault, GPU_FAULTS)).inc()

    def _drain(self, h: r.NodeDrained | r.NodeUndrained) -> None:
        """A drain, and whether it lent a node to a waiting job (``jobs.room``) or gave one back."""
        lent = lent_for(h.by) is not None
        match h:
            case r.NodeDrained():
                self.drains.inc()
                if lent:
                    self.shrinks.inc()
            case r.NodeUndrained() if lent:
                self.growths.inc()

    def _job_ended(self, h: r.JobSucceeded | r.JobFailed | r.JobSetupFailed | r.JobKilled) -> None:
        match h:
            case r.JobSucceeded():
                self.jobs_ended.labels(JobState.SUCCEEDED.value).inc()
            case r.JobFailed() | r.JobSetupFailed():
                self.jobs_ended.labels(JobState.FAILED.value).inc()
            case r.JobKilled():
                self.jobs_ended.labels(JobState.KILLED.value).inc()

    def _round_closed(self, h: r.RoundComplete) -> None:
        took = h.rendezvous_s
        if not isinstance(took, int | float) or isinstance(took, bool) or not 0 <= took < 1e7:
            return
        self.rendezvous.observe(took)
        if h.reason in RECOVERY_REASONS:
            self.recovery.observe(took)

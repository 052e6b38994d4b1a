"""The typed records of what happened: every one has a subscriber that uses it (the metrics or the
cluster's event history) or is deliberately log-only, and each one's log line is the line its
call site wrote with ``log.<level>(event, **fields)`` (name, level, keys in order, values)."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest
import structlog
from prometheus_client import CollectorRegistry

from elasticd import log
from elasticd.happenings import bus
from elasticd.happenings import records as r
from elasticd.history.select import select
from elasticd.metrics.counters import EventMetrics
from elasticd.terms.state import EndReason, FailureKind, Fault, RoundReason

LOG_ONLY: frozenset[type[r.Record]] = frozenset()  # records kept for their log line alone

# One record of each type, and the call that wrote its line before it was a record.
SAMPLES: list[tuple[r.Happening, str, str, dict[str, Any]]] = [
    (r.JobSubmitted("j", "ann", ("python", "t.py"), "1:2"), "info", "job.submitted",
     {"job": "j", "user": "ann", "argv": ["python", "t.py"], "nnodes": "1:2"}),
    (r.JobJoining("j", "n1", "0,1"), "info", "job.joining", {"job": "j", "node": "n1", "devices": "0,1"}),
    (r.JobLeft("j", "n1"), "info", "job.left", {"job": "j", "node": "n1"}),
    (r.JobSucceeded("j", EndReason.SUCCEEDED, "done", 2), "info", "job.succeeded",
     {"job": "j", "code": "succeeded", "reason": "done", "round": 2}),
    (r.JobFailed("j", EndReason.WORKER_FAILED, "no restarts left", 2, FailureKind.OOM, "rank 0: oom"),
     "warning", "job.failed",
     {"job": "j", "code": "worker_failed", "reason": "no restarts left", "round": 2, "cause": "oom",
      "root_cause": "rank 0: oom"}),
    (r.JobFailed("j", EndReason.INVALID_RECORD, key="jobs/j/round"), "warning", "job.failed",
     {"job": "j", "code": "invalid_record", "key": "jobs/j/round"}),
    (r.JobSetupFailed("j", "n1", EndReason.ENTRY_UNAVAILABLE, "no such script"), "error", "job.setup_failed",
     {"job": "j", "node": "n1", "code": "entry_unavailable", "why": "no such script"}),
    (r.JobKilled("j", "ann"), "info", "job.killed", {"job": "j", "by": "ann"}),
    (r.JobRemoved("j", True), "info", "job.removed", {"job": "j", "logs": True}),
    (r.JobExpired("j", ended_at=1.5), "info", "job.expired", {"job": "j", "ended_at": 1.5}),
    (r.JobExpired("j", why="etcd_full"), "info", "job.expired", {"job": "j", "why": "etcd_full"}),
    (r.JobOrphaned("j", 3), "warning", "job.orphaned", {"job": "j", "round": 3, "action": "restart"}),
    (r.RoundComplete("j", 1, 2, ("n1", "n2"), "all joined", RoundReason.WORKER_FAILED, 0.25), "info",
     "round.complete",
     {"job": "j", "round": 1, "world_size": 2, "members": ["n1", "n2"], "why": "all joined",
      "reason": "worker_failed", "rendezvous_s": 0.25}),
    (r.RoundComplete("j", 0, 1, ("n1",), "full", None, None), "info", "round.complete",
     {"job": "j", "round": 0, "world_size": 1, "members": ["n1"], "why": "full", "reason": None,
      "rendezvous_s": None}),
    (r.RoundBumped("j", 2, RoundReason.MEMBER_LOST, True, 1, "n2 lost"), "info", "round.bumped",
     {"job": "j", "round": 2, "reason": "member_lost", "spend": True, "restarts": 1, "detail": "n2 lost"}),
    (r.WorkerFailed("j", "n1", 1, FailureKind.SIGNAL, "rank 0 killed by SIGKILL"), "warning",
     "worker.failed",
     {"job": "j", "node": "n1", "round": 1, "cause": "signal", "summary": "rank 0 killed by SIGKILL"}),
    (r.WorkerHung("j", 0, 3, "t.py:9 in f", 12.0), "warning", "worker.hung",
     {"job": "j", "attempt": 0, "rank": 3, "frame": "t.py:9 in f", "silent_s": 12.0}),
    (r.StragglerFound("j", 2, 1, 0.5), "warning", "straggler.found",
     {"job": "j", "round": 2, "rank": 1, "score": 0.5}),
    (r.StragglerCleared("j", 2, 1, None), "info", "straggler.cleared",
     {"job": "j", "round": 2, "rank": 1, "score": None}),
    (r.RootCauseAmended("j", "n1", "WorkerFailure"), "info", "root_cause.amended",
     {"job": "j", "node": "n1", "record": "WorkerFailure"}),
    (r.NodeDrained("n2", None, 5.0, "root", ("a", "b"), True), "info", "node.drain",
     {"node": "n2", "job": None, "grace_s": 5.0, "by": "root", "jobs": ["a", "b"], "forced": True}),
    (r.NodeUndrained("n2", "a"), "info", "node.undrain", {"node": "n2", "job": "a", "by": ""}),
    (r.DaemonReady("n1", "/run/elasticd.sock", ("http://127.0.0.1:2379",), "gpu", 8), "info",
     "daemon.ready",
     {"node": "n1", "socket": "/run/elasticd.sock", "etcd": ["http://127.0.0.1:2379"], "devices": "gpu",
      "slots": 8}),
    (r.DaemonStopping("SIGTERM"), "info", "daemon.stopping", {"reason": "SIGTERM"}),
    (r.LeaseLost("n1", 42, "expired"), "warning", "lease.lost",
     {"node": "n1", "lease": 42, "why": "expired"}),
    (r.GpuUnhealthy("n1", "GPU-1", Fault.XID, "Xid 79", "a"), "warning", "gpu.unhealthy",
     {"node": "n1", "uuid": "GPU-1", "fault": "xid", "reason": "Xid 79", "job": "a"}),
    (r.GpuReturned("n1", "GPU-1", "root"), "info", "gpu.returned",
     {"node": "n1", "uuid": "GPU-1", "by": "root"}),
]  # fmt: skip


def test_every_record_type_has_a_sample() -> None:
    assert {type(h) for h, *_ in SAMPLES} == set(get_args(r.Happening))


def _counted(h: r.Happening) -> bool:
    registry = CollectorRegistry()
    EventMetrics(registry).observe(h)
    return any(s.value for m in registry.collect() for s in m.samples if not s.name.endswith("_created"))


@pytest.mark.parametrize("h", [h for h, *_ in SAMPLES], ids=lambda h: type(h).__name__)
def test_every_record_is_counted_recorded_or_deliberately_log_only(h: r.Happening) -> None:
    recorded = select(h, "n1", 1_700_000_000.0) is not None
    assert recorded or _counted(h) or type(h) in LOG_ONLY


def _lines(err: str) -> list[dict[str, Any]]:
    out = []
    for line in err.splitlines():
        fields = json.loads(line)
        fields.pop("timestamp")
        out.append(fields)
    return out


@pytest.mark.parametrize(("h", "level", "event", "fields"), SAMPLES, ids=lambda v: type(v).__name__)
def test_a_records_log_line_is_the_line_its_call_site_wrote(
    h: r.Happening,
    level: str,
    event: str,
    fields: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bus, "_log", log.get("elasticd.happenings"))  # not one cached for another stderr
    log.configure("json", "info")
    try:
        getattr(log.get("before"), level)(event, **fields)
        bus.publish(h)
    finally:
        structlog.reset_defaults()
    before, now = _lines(capsys.readouterr().err)
    assert list(now.items()) == list(before.items())  # the same keys, in the same order
    assert (event, level) == (h.EVENT, h.LEVEL)

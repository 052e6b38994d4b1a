"""What ``status`` shows for a job, derived from its etcd snapshot (no stored, duplicated state)."""

from __future__ import annotations

from typing import Any, cast

from elasticd.decode import DecodeError, decode
from elasticd.jobs.state import EndReason, JobState, WorkerFailure
from elasticd.rendezvous.snapshot import JobSnapshot
from elasticd.wire import FailureView, JobView, MemberView, WaitsFor


def job_state(snap: JobSnapshot) -> JobState:
    """A job with an invalid record shows as FAILED at once, before its final record is written
    (and even when it cannot be: a bad ``final`` itself, a bad job id)."""
    if snap.final is not None:
        return snap.final.state
    if snap.invalid:
        return JobState.FAILED
    if snap.result is not None:
        return JobState.RUNNING
    return JobState.PENDING if snap.current == 0 else JobState.RESTARTING


def _reason(snap: JobSnapshot, state: JobState) -> str:
    if snap.final is not None:
        return snap.final.reason
    if snap.invalid:
        return snap.invalid[0].describe()
    spec = snap.spec
    if state is JobState.RUNNING:
        return f"round {snap.current}"
    need = spec.nnodes.min if spec else 1
    parts = [snap.round.detail] if snap.round is not None and snap.round.detail else []
    parts += list(snap.pending.values())
    parts.append(f"{len(snap.current_joins)} of {need} node(s) joined round {snap.current}")
    return "; ".join(parts)


def waits_for(snap: JobSnapshot, state: JobState) -> WaitsFor | None:
    """What a job that is not running waits for, from its keys (never from a note's text): an
    allowed node that lacks free slots leaves a ``pending/<node>`` key; without one, a round with
    fewer joins than the job's minimum waits for nodes."""
    if state not in (JobState.PENDING, JobState.RESTARTING):
        return None
    if snap.pending:
        return WaitsFor.CAPACITY
    need = snap.spec.nnodes.min if snap.spec else 1
    return WaitsFor.NODES if len(snap.current_joins) < need else None


def _summary(failure: dict[str, Any]) -> str:
    try:
        return decode(WorkerFailure, failure).summary()
    except DecodeError:
        return "failed"


def _code(snap: JobSnapshot) -> str | None:
    if snap.final is not None:
        return snap.final.code.value
    return EndReason.INVALID_RECORD.value if snap.invalid else None


def job_view(snap: JobSnapshot, local_node: str) -> dict[str, Any]:
    """The ``JobView`` of ``elasticd.wire`` (as a plain dict: callers pass it on as JSON)."""
    return dict(_view(snap, local_node))


def _view(snap: JobSnapshot, local_node: str) -> JobView:
    spec = snap.spec
    state = job_state(snap)
    result = snap.result
    members: list[MemberView] = []
    if result is not None:
        for m in result.members:
            status = snap.node_status.get(m.node)
            members.append(
                {
                    "node": m.node,
                    "address": m.address,
                    "group_rank": m.group_rank,
                    "ranks": [m.rank_offset, m.rank_offset + m.local_world_size - 1],
                    "state": status.state if status else "GONE",
                    "devices": status.devices if status else "",
                    "pids": list(status.pids) if status else [],
                }
            )
    failure = (snap.final.failure if snap.final else None) or (snap.round.failure if snap.round else None)
    local = snap.node_status.get(local_node)
    waiting = waits_for(snap, state)
    view: JobView = {
        "id": snap.job_id,
        "state": state.value,
        "reason": _reason(snap, state),
        "round": snap.current,
        "attempt": snap.current,
        "restarts": snap.restarts,
        "world_size": result.world_size if result is not None and not state.terminal else 0,
        "members": members,
        "nodes": [m["node"] for m in members],
        "waiting_nodes": sorted(snap.waiting),
        "node_states": {n: s.state for n, s in snap.node_status.items()},
        "master": f"{result.master_addr}:{result.master_port}" if result is not None else "",
        "devices": local.devices if local else "",
        "pids": list(local.pids) if local and not state.terminal else [],
        "ended_at": snap.final.ended_at if snap.final else None,
        "code": _code(snap),
        "waits_for": waiting,
        "short_of_capacity": sorted(snap.pending) if waiting is WaitsFor.CAPACITY else [],
    }
    if snap.invalid:
        view["invalid_records"] = [{"key": k.key, "why": k.why} for k in snap.invalid]
    if spec is not None:
        view |= {
            "name": spec.name,
            "user": spec.user,
            "max_restarts": spec.max_restarts,
            "nnodes": str(spec.nnodes),
            "nproc_per_node": spec.nproc_per_node,
            "argv": spec.argv,
            "submitted_at": spec.submitted_at,
            "submitted_on": spec.submitted_on,
            "allowed_nodes": list(spec.nodes),
        }
    if failure:
        view["failure"] = cast(FailureView, failure)  # checked as a WorkerFailure when read
    if state is JobState.FAILED:
        view["error"] = view["reason"] or (_summary(failure) if failure else "failed")
    return view

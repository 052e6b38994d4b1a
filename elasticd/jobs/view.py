"""What ``status`` shows for a job, derived from its etcd snapshot (no stored, duplicated state).

An ended job keeps what its records still say after the end: the last round's result (old rounds
are deleted only before the previous one), its ``done`` markers, the nodes' statuses (while their
daemons live) and the failure of the final record. Its world is the last round's, and each member's
state says how its part ended (``MemberEndState``), not the ``STOPPING`` its agent last published.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, cast

from elasticd.decode import DecodeError, decode
from elasticd.jobs.room import lent_for
from elasticd.progress.goodput import Cause, combine
from elasticd.progress.slowness import scores
from elasticd.progress.tracker import RankProgress
from elasticd.rendezvous.model import RoundHead, RoundResult
from elasticd.rendezvous.snapshot import JobSnapshot
from elasticd.terms.head import JobHead
from elasticd.terms.state import EndReason, FailureKind, JobState, RoundReason, WorkerFailure
from elasticd.wire import (
    ROW_REASON_CHARS,
    FailureView,
    GoodputView,
    JobView,
    MemberEndState,
    MemberView,
    RankProgressView,
    WaitsFor,
)


def job_state(snap: JobSnapshot) -> JobState:
    """A job with an invalid record shows as FAILED at once, before its final record is written
    (and even when it cannot be: a bad ``final`` itself, a bad job id)."""
    if snap.final is not None:
        return snap.final.state
    if snap.invalid:
        return JobState.FAILED
    if snap.closed is not None:
        return JobState.RUNNING
    return JobState.PENDING if snap.current == 0 else JobState.RESTARTING


def _reason(snap: JobSnapshot, state: JobState) -> str:
    if snap.final is not None:
        return snap.final.reason
    if snap.invalid:
        return snap.invalid[0].describe()
    head = snap.head
    if state is JobState.RUNNING:  # with why a node outside waits (not in the round: not joined)
        outside = [snap.pending[node] for node in _short(snap)]
        return "; ".join([f"round {snap.current}", *_lent(snap), *outside])
    need = head.nnodes.min if head else 1
    parts = [snap.round.detail] if snap.round is not None and snap.round.detail else []
    parts += list(snap.pending.values())
    if snap.joins_read:
        parts.append(f"{len(snap.current_joins)} of {need} node(s) joined round {snap.current}")
    else:  # the read of every job counts no join (``status <job>`` does)
        parts.append(f"round {snap.current} needs {need} node(s)")
    return "; ".join(parts)


def _lent(snap: JobSnapshot) -> list[str]:
    """Why a running job holds fewer nodes than it could: the nodes it lent (``jobs.room``)."""
    lent: dict[str, list[str]] = {}
    for node, record in sorted(snap.drains.items()):
        if (for_job := lent_for(record.by)) is not None:
            lent.setdefault(for_job, []).append(node)
    return [f"shrunk for {job} (lent {', '.join(nodes)})" for job, nodes in sorted(lent.items())]


def waits_for(snap: JobSnapshot, state: JobState) -> WaitsFor | None:
    """What a job that is not running waits for, from its keys (never from a note's text): an
    allowed node that lacks free slots leaves a ``pending/<node>`` key and does not join (a joined
    node's note says why the round waits for others); without one, a round with fewer joins than
    the job's minimum waits for nodes."""
    if state not in (JobState.PENDING, JobState.RESTARTING):
        return None
    if _short(snap):
        return WaitsFor.CAPACITY
    need = snap.head.nnodes.min if snap.head else 1
    if not snap.joins_read:  # (the read of every job: an open round waits on its nodes)
        return WaitsFor.NODES
    return WaitsFor.NODES if len(snap.current_joins) < need else None


def _short(snap: JobSnapshot) -> list[str]:
    """The nodes with a pending note that have not joined the current round (every node with
    one, in a read that carries no join)."""
    joined = {j.node for j in snap.current_joins}
    return sorted(n for n in snap.pending if n not in joined)


def _summary(failure: dict[str, Any]) -> str:
    try:
        return decode(WorkerFailure, failure).summary()
    except DecodeError:
        return "failed"


def _code(snap: JobSnapshot) -> str | None:
    if snap.final is not None:
        return snap.final.code.value
    return EndReason.INVALID_RECORD.value if snap.invalid else None


_NOT_THE_JOBS = frozenset({EndReason.INVALID_RECORD, EndReason.JOIN_TIMEOUT})


def cause_of(snap: JobSnapshot) -> FailureKind | None:
    """The kind of failure that ended the job, or opened its current round (None: none did)."""
    final = snap.final
    if final is not None:
        if final.code in (EndReason.SUCCEEDED, EndReason.KILLED):
            return None
        if final.code.setup or final.code in _NOT_THE_JOBS:
            return FailureKind.INFRASTRUCTURE
        if final.code is EndReason.NODES_LOST:
            return FailureKind.NODE_LOST
    elif snap.invalid:
        return FailureKind.INFRASTRUCTURE
    failure = _failure(snap)
    if failure is not None:
        return FailureKind(failure.get("kind") or FailureKind.USER_CODE)  # validated when read
    if snap.round is not None and snap.round.reason is RoundReason.MEMBER_LOST:
        return FailureKind.NODE_LOST
    if snap.round is not None and snap.round.reason is RoundReason.GPU_FAILED:
        return FailureKind.GPU
    return None


def selected(snap: JobSnapshot, states: Collection[JobState], user: str | None) -> bool:
    """Whether ``status``'s filters keep the job: one of ``states`` (any when empty), ``user``'s
    (any when None; a job whose spec is unreadable has no user)."""
    if states and job_state(snap) not in states:
        return False
    return user is None or (snap.head is not None and snap.head.user == user)


def started_at(snap: JobSnapshot) -> float | None:
    """When the job's workers first started: round 0's close; once that record is deleted (when
    round 2 closes), its submission time stands in. None for a job no round of which closed."""
    first = snap.head_of(0)
    if first is not None and first.closed_at > 0:
        return first.closed_at
    if not snap.heads and not snap.results and snap.current == 0:
        return None
    return snap.head.submitted_at if snap.head is not None else None


def last_head(snap: JobSnapshot, state: JobState) -> RoundHead | None:
    """The round a view shows: the current one while the job lives, the last that closed once it
    ended. Its head (size, world, master) is in every read; its members only in a read of them
    (``last_result``)."""
    if not state.terminal:
        return snap.closed
    rounds = {*snap.heads, *snap.results}
    return snap.head_of(max(rounds)) if rounds else None


def last_result(snap: JobSnapshot, state: JobState) -> RoundResult | None:
    """The round a view shows, whole: None when the read did not carry its members (the read of
    every job carries none: ``manager/jobsread.py``; ``status <job>`` reads them)."""
    head = last_head(snap, state)
    return snap.results.get(head.round) if head is not None else None


def end_state(snap: JobSnapshot, state: JobState, result: RoundResult, node: str) -> MemberEndState:
    """How ``node``'s part in ``result``, the last round of the ended job, ended."""
    if node in snap.done.get(result.round, set()):
        return MemberEndState.SUCCEEDED
    status = snap.node_status.get(node)
    failures = [_failure(snap), status.failure if status else None]
    if any(f and f.get("node") == node and f.get("attempt") == result.round for f in failures):
        return MemberEndState.FAILED  # the job's root cause, or this node's own failure, in that round
    if status is None:
        return MemberEndState.LOST
    if status.round == result.round and status.state == JobState.FAILED.value:
        return MemberEndState.FAILED  # its workers failed, before it could describe the failure
    return MemberEndState.KILLED if state is JobState.KILLED else MemberEndState.STOPPED


def _failure(snap: JobSnapshot) -> dict[str, Any] | None:
    """The job's failure: the final record's, else the one that opened the current round."""
    return (snap.final.failure if snap.final else None) or (snap.round.failure if snap.round else None)


def progress_of(snap: JobSnapshot, result: RoundResult) -> dict[str, list[RankProgressView]]:
    """Each member's ranks' progress in ``result``'s round (a status of another round says nothing
    about this one), each rank scored job-wide (against every node's ranks), and flagged when the
    round's judge (group rank 0's node) names it a straggler."""
    ranks: dict[str, list[RankProgress]] = {}
    for m in result.members:
        status = snap.node_status.get(m.node)
        if status is not None and status.round == result.round and status.progress:
            ranks[m.node] = list(status.progress)
    judge = snap.node_status.get(result.members[0].node)
    slow = set(judge.stragglers) if judge is not None and judge.round == result.round else set()
    score = scores({p.rank: e for ps in ranks.values() for p in ps if (e := p.evidence) is not None})
    out: dict[str, list[RankProgressView]] = {}
    for node, ps in ranks.items():
        out[node] = [
            cast(RankProgressView, p.to_json() | {"score": score.get(p.rank), "straggler": p.rank in slow})
            for p in ps
        ]
    return out


def job_view(snap: JobSnapshot, local_node: str) -> dict[str, Any]:
    """The ``JobView`` of ``elasticd.wire`` (as a plain dict: callers pass it on as JSON)."""
    return dict(_view(snap, local_node))


_ROW_FIELDS = ("id", "state", "user", "nodes", "size", "world_size", "restarts", "max_restarts", "started_at",
               "ended_at")  # fmt: skip


def job_row(view: dict[str, Any]) -> dict[str, Any]:
    """The ``JobRow`` of a ``JobView`` (without its queue place, which ``status`` adds)."""
    row = {k: view[k] for k in _ROW_FIELDS if view.get(k) or k in ("id", "state")}
    if reason := (view.get("error") or view.get("reason") or "")[:ROW_REASON_CHARS]:
        row["reason"] = reason
    return row


def _members(snap: JobSnapshot, state: JobState, result: RoundResult) -> list[MemberView]:
    """The members of ``result``'s round: their ranks, state, devices, pids and progress."""
    members: list[MemberView] = []
    progress = progress_of(snap, result)
    for m in result.members:
        status = snap.node_status.get(m.node)
        live = status.state if status else "GONE"
        members.append(
            {
                "node": m.node,
                "address": m.address,
                "group_rank": m.group_rank,
                "ranks": [m.rank_offset, m.rank_offset + m.local_world_size - 1],
                "state": end_state(snap, state, result, m.node).value if state.terminal else live,
                "devices": status.devices if status else "",
                "pids": list(status.pids) if status else [],
            }
        )
        if m.node in progress:
            members[-1]["progress"] = progress[m.node]
    return members


def _add_head(view: JobView, head: JobHead) -> None:
    """What the submission said: the job's name, owner, sizes, command line and placement."""
    view |= {
        "name": head.name,
        "user": head.user,
        "max_restarts": head.max_restarts,
        "nnodes": str(head.nnodes),
        "nproc_per_node": head.nproc_per_node,
        "argv": list(head.argv),
        "submitted_at": head.submitted_at,
        "submitted_on": head.submitted_on,
        "allowed_nodes": list(head.nodes),
    }


def goodput_of(snap: JobSnapshot) -> GoodputView | None:
    """The job's goodput from every node's report that has one (a node that has left keeps its
    report while its daemon lives, so a drained node's part stays counted). Every node of a job
    runs the same number of ranks, so each weighs alike; the shares scale to the wall time from
    the submission to the end (or the newest report)."""
    reports = [s for s in snap.node_status.values() if s.goodput is not None]
    if not reports or snap.head is None:
        return None
    end = snap.final.ended_at if snap.final is not None and snap.final.ended_at else 0.0
    wall_s = max(0.0, (end or max(s.updated_at for s in reports)) - snap.head.submitted_at)
    tally = combine([(s.goodput, 1) for s in reports if s.goodput is not None], wall_s)
    return {"ratio": tally.ratio, "wall_s": wall_s, "by_cause_s": {c.value: tally.of(c) for c in Cause}}


def _view(snap: JobSnapshot, local_node: str) -> JobView:
    head = snap.head
    state = job_state(snap)
    shown, result = last_head(snap, state), last_result(snap, state)
    members = _members(snap, state, result) if result is not None else []
    failure = _failure(snap)
    cause = cause_of(snap)
    local = snap.node_status.get(local_node)
    waiting = waits_for(snap, state)
    view: JobView = {
        "id": snap.job_id,
        "state": state.value,
        "reason": _reason(snap, state),
        "round": snap.current,
        "attempt": snap.current,
        "restarts": snap.restarts,
        "world_size": shown.world_size if shown is not None else 0,
        "size": shown.size if shown is not None else 0,
        "members": members,
        "nodes": [m["node"] for m in members],
        "waiting_nodes": sorted(snap.waiting),
        "node_states": {n: s.state for n, s in snap.node_status.items()},
        "master": f"{shown.master_addr}:{shown.master_port}" if shown is not None else "",
        "devices": local.devices if local else "",
        "pids": list(local.pids) if local and not state.terminal else [],
        "started_at": started_at(snap),
        "ended_at": (snap.final.ended_at or None) if snap.final else None,  # 0: an old record, unknown
        "code": _code(snap),
        "cause": cause.value if cause is not None else None,
        "waits_for": waiting,
        "short_of_capacity": _short(snap) if waiting is WaitsFor.CAPACITY else [],
    }
    if snap.invalid:
        view["invalid_records"] = [{"key": k.key, "why": k.why} for k in snap.invalid]
    if head is not None:
        _add_head(view, head)
    if failure:
        view["failure"] = cast(FailureView, failure)  # checked as a WorkerFailure when read
    if (goodput := goodput_of(snap)) is not None:
        view["goodput"] = goodput
    if state is JobState.FAILED:
        view["error"] = view["reason"] or (_summary(failure) if failure else "failed")
    return view

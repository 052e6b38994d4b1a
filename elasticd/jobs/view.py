"""What ``status`` shows for a job, derived from a read of its keys (``rendezvous.jobread``; no
stored, duplicated state).

An ended job keeps what its records still say after the end: the last round's result (old rounds
are deleted only before the previous one), its ``done`` markers, the nodes' statuses (while their
daemons live) and the failure of the final record. Its world is the last round's, and each member's
state says how its part ended (``MemberEndState``), not the ``STOPPING`` its agent last published.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, cast

from elasticd.decode import DecodeError, decode
from elasticd.jobs.agentstore import store_address
from elasticd.jobs.room import lent_for
from elasticd.progress.goodput import Cause, combine
from elasticd.progress.slowness import scores
from elasticd.progress.tracker import RankProgress
from elasticd.rendezvous.jobread import JobRead, JoinsRead, RostersRead
from elasticd.rendezvous.model import RoundHead, RoundResult
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


def job_state(read: JobRead) -> JobState:
    """A job with an invalid record shows as FAILED at once, before its final record is written
    (and even when it cannot be: a bad ``final`` itself, a bad job id)."""
    if read.final is not None:
        return read.final.state
    if read.invalid:
        return JobState.FAILED
    if read.closed is not None:
        return JobState.RUNNING
    return JobState.PENDING if read.current == 0 else JobState.RESTARTING


def _reason(read: JobRead, state: JobState) -> str:
    if read.final is not None:
        return read.final.reason
    if read.invalid:
        return read.invalid[0].describe()
    head = read.head
    if state is JobState.RUNNING:  # with why a node outside waits (not in the round: not joined)
        outside = [read.pending[node] for node in _short(read)]
        return "; ".join([f"round {read.current}", *_lent(read), *outside])
    need = head.nnodes.min if head else 1
    parts = [read.round.detail] if read.round is not None and read.round.detail else []
    parts += list(read.pending.values())
    if isinstance(read, JoinsRead):
        parts.append(f"{len(read.current_joins)} of {need} node(s) joined round {read.current}")
    else:  # the read of every job counts no join (``status <job>`` does)
        parts.append(f"round {read.current} needs {need} node(s)")
    return "; ".join(parts)


def _lent(read: JobRead) -> list[str]:
    """Why a running job holds fewer nodes than it could: the nodes it lent (``jobs.room``)."""
    lent: dict[str, list[str]] = {}
    for node, record in sorted(read.drains.items()):
        if (for_job := lent_for(record.by)) is not None:
            lent.setdefault(for_job, []).append(node)
    return [f"shrunk for {job} (lent {', '.join(nodes)})" for job, nodes in sorted(lent.items())]


def waits_for(read: JobRead, state: JobState) -> WaitsFor | None:
    """What a job that is not running waits for, from its keys (never from a note's text): an
    allowed node that lacks free slots leaves a ``pending/<node>`` key and does not join (a joined
    node's note says why the round waits for others); without one, a round with fewer joins than
    the job's minimum waits for nodes."""
    if state not in (JobState.PENDING, JobState.RESTARTING):
        return None
    if _short(read):
        return WaitsFor.CAPACITY
    need = read.head.nnodes.min if read.head else 1
    if not isinstance(read, JoinsRead):  # (the read of every job: an open round waits on its nodes)
        return WaitsFor.NODES
    return WaitsFor.NODES if len(read.current_joins) < need else None


def _short(read: JobRead) -> list[str]:
    """The nodes with a pending note that have not joined the current round (every node with
    one, in a read that carries no join)."""
    joined = {j.node for j in read.current_joins} if isinstance(read, JoinsRead) else set()
    return sorted(n for n in read.pending if n not in joined)


def _summary(failure: dict[str, Any]) -> str:
    try:
        return decode(WorkerFailure, failure).summary()
    except DecodeError:
        return "failed"


def _code(read: JobRead) -> str | None:
    if read.final is not None:
        return read.final.code.value
    return EndReason.INVALID_RECORD.value if read.invalid else None


_NOT_THE_JOBS = frozenset({EndReason.INVALID_RECORD, EndReason.JOIN_TIMEOUT})


def cause_of(read: JobRead) -> FailureKind | None:
    """The kind of failure that ended the job, or opened its current round (None: none did)."""
    final = read.final
    if final is not None:
        if final.code in (EndReason.SUCCEEDED, EndReason.KILLED):
            return None
        if final.code.setup or final.code in _NOT_THE_JOBS:
            return FailureKind.INFRASTRUCTURE
        if final.code is EndReason.NODES_LOST:
            return FailureKind.NODE_LOST
    elif read.invalid:
        return FailureKind.INFRASTRUCTURE
    failure = _failure(read)
    if failure is not None:
        return FailureKind(failure.get("kind") or FailureKind.USER_CODE)  # validated when read
    if read.round is not None and read.round.reason is RoundReason.MEMBER_LOST:
        return FailureKind.NODE_LOST
    if read.round is not None and read.round.reason is RoundReason.GPU_FAILED:
        return FailureKind.GPU
    return None


def selected(read: JobRead, states: Collection[JobState], user: str | None) -> bool:
    """Whether ``status``'s filters keep the job: one of ``states`` (any when empty), ``user``'s
    (any when None; a job whose spec is unreadable has no user)."""
    if states and job_state(read) not in states:
        return False
    return user is None or (read.head is not None and read.head.user == user)


def started_at(read: JobRead) -> float | None:
    """When the job's workers first started: round 0's close; once that record is deleted (when
    round 2 closes), its submission time stands in. None for a job no round of which closed."""
    first = read.head_of(0)
    if first is not None and first.closed_at > 0:
        return first.closed_at
    if not read.rounds() and read.current == 0:
        return None
    return read.head.submitted_at if read.head is not None else None


def last_head(read: JobRead, state: JobState) -> RoundHead | None:
    """The round a view shows: the current one while the job lives, the last that closed once it
    ended. Its head (size, world, master) is in every read; its members only in a read of them
    (``last_result``)."""
    if not state.terminal:
        return read.closed
    rounds = read.rounds()
    return read.head_of(max(rounds)) if rounds else None


def last_result(read: JobRead, state: JobState, members: RoundResult | None = None) -> RoundResult | None:
    """The round a view shows, whole: ``members`` when they are that round's (``status <job>``
    reads them), or from a read of the rosters; None when neither carries them (the read of every
    job carries none: ``manager/clustercopy.py``)."""
    head = last_head(read, state)
    if head is None:
        return None
    if members is not None and members.round == head.round:
        return members
    return read.results.get(head.round) if isinstance(read, RostersRead) else None


def end_state(read: JobRead, state: JobState, result: RoundResult, node: str) -> MemberEndState:
    """How ``node``'s part in ``result``, the last round of the ended job, ended."""
    if isinstance(read, JoinsRead) and node in read.done_in(result.round):
        return MemberEndState.SUCCEEDED
    status = read.node_status.get(node)
    failures = [_failure(read), status.failure if status else None]
    if any(f and f.get("node") == node and f.get("attempt") == result.round for f in failures):
        return MemberEndState.FAILED  # the job's root cause, or this node's own failure, in that round
    if status is None:
        return MemberEndState.LOST
    if status.round == result.round and status.state == JobState.FAILED.value:
        return MemberEndState.FAILED  # its workers failed, before it could describe the failure
    return MemberEndState.KILLED if state is JobState.KILLED else MemberEndState.STOPPED


def _failure(read: JobRead) -> dict[str, Any] | None:
    """The job's failure: the final record's, else the one that opened the current round."""
    return (read.final.failure if read.final else None) or (read.round.failure if read.round else None)


def progress_of(read: JobRead, result: RoundResult) -> dict[str, list[RankProgressView]]:
    """Each member's ranks' progress in ``result``'s round (a status of another round says nothing
    about this one), each rank scored job-wide (against every node's ranks) and flagged as the
    round's judge (group rank 0's node) published, over windows that end together on every node."""
    ranks: dict[str, list[RankProgress]] = {}
    for m in result.members:
        status = read.node_status.get(m.node)
        if status is not None and status.round == result.round and status.progress:
            ranks[m.node] = list(status.progress)
    judge = read.node_status.get(result.members[0].node)
    judged = judge is not None and judge.round == result.round
    slow = set(judge.stragglers) if judge is not None and judged else set()
    score = {s.rank: s.score for s in judge.scores} if judge is not None and judged else {}
    if not score:  # not judged yet, or a round too large for its report: from the reports as they are
        score = scores({p.rank: e for ps in ranks.values() for p in ps if (e := p.evidence) is not None})
    out: dict[str, list[RankProgressView]] = {}
    for node, ps in ranks.items():
        out[node] = [
            cast(RankProgressView, p.to_json() | {"score": score.get(p.rank), "straggler": p.rank in slow})
            for p in ps
        ]
    return out


def job_view(read: JobRead, local_node: str, members: RoundResult | None = None) -> dict[str, Any]:
    """The ``JobView`` of ``elasticd.wire`` (as a plain dict: callers pass it on as JSON);
    ``members``: the round it shows, whole, where it was read (``last_result``)."""
    return dict(_view(read, local_node, members))


_ROW_FIELDS = ("id", "state", "user", "nodes", "size", "world_size", "restarts", "max_restarts", "started_at",
               "ended_at")  # fmt: skip


def job_row(view: dict[str, Any]) -> dict[str, Any]:
    """The ``JobRow`` of a ``JobView`` (without its queue place, which ``status`` adds)."""
    row = {k: view[k] for k in _ROW_FIELDS if view.get(k) or k in ("id", "state")}
    if reason := (view.get("error") or view.get("reason") or "")[:ROW_REASON_CHARS]:
        row["reason"] = reason
    return row


def _members(read: JobRead, state: JobState, result: RoundResult) -> list[MemberView]:
    """The members of ``result``'s round: their ranks, state, devices, pids and progress."""
    members: list[MemberView] = []
    progress = progress_of(read, result)
    for m in result.members:
        status = read.node_status.get(m.node)
        live = status.state if status else "GONE"
        members.append(
            {
                "node": m.node,
                "address": m.address,
                "group_rank": m.group_rank,
                "ranks": [m.rank_offset, m.rank_offset + m.local_world_size - 1],
                "state": end_state(read, state, result, m.node).value if state.terminal else live,
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


def goodput_of(read: JobRead) -> GoodputView | None:
    """The job's goodput from every node's report that has one (a node that has left keeps its
    report while its daemon lives, so a drained node's part stays counted). Every node of a job
    runs the same number of ranks, so each weighs alike; the shares scale to the wall time from
    the submission to the end (or the newest report)."""
    reports = [s for s in read.node_status.values() if s.goodput is not None]
    if not reports or read.head is None:
        return None
    end = read.final.ended_at if read.final is not None and read.final.ended_at else 0.0
    wall_s = max(0.0, (end or max(s.updated_at for s in reports)) - read.head.submitted_at)
    tally = combine([(s.goodput, 1) for s in reports if s.goodput is not None], wall_s)
    return {"ratio": tally.ratio, "wall_s": wall_s, "by_cause_s": {c.value: tally.of(c) for c in Cause}}


def _master(head: JobHead | None, shown: RoundHead | None) -> str:
    """``MASTER_ADDR:MASTER_PORT`` as the ranks of the round shown were told: loopback for a job of
    one node at most, whose store listens there (``agentstore.store_address``)."""
    if shown is None:
        return ""
    addr = shown.master_addr if head is None else store_address(shown.master_addr, head.nnodes.max)
    return f"{addr}:{shown.master_port}"


def _view(read: JobRead, local_node: str, whole: RoundResult | None) -> JobView:
    head = read.head
    state = job_state(read)
    shown, result = last_head(read, state), last_result(read, state, whole)
    members = _members(read, state, result) if result is not None else []
    failure = _failure(read)
    cause = cause_of(read)
    local = read.node_status.get(local_node)
    waiting = waits_for(read, state)
    view: JobView = {
        "id": read.job_id,
        "state": state.value,
        "reason": _reason(read, state),
        "round": read.current,
        "attempt": read.current,
        "restarts": read.restarts,
        "world_size": shown.world_size if shown is not None else 0,
        "size": shown.size if shown is not None else 0,
        "members": members,
        "nodes": [m["node"] for m in members],
        "waiting_nodes": sorted(read.waiting),
        "node_states": {n: s.state for n, s in read.node_status.items()},
        "master": _master(head, shown),
        "devices": local.devices if local else "",
        "pids": list(local.pids) if local and not state.terminal else [],
        "started_at": started_at(read),
        "ended_at": (read.final.ended_at or None) if read.final else None,  # 0: an old record, unknown
        "code": _code(read),
        "cause": cause.value if cause is not None else None,
        "waits_for": waiting,
        "short_of_capacity": _short(read) if waiting is WaitsFor.CAPACITY else [],
    }
    if read.invalid:
        view["invalid_records"] = [{"key": k.key, "why": k.why} for k in read.invalid]
    if head is not None:
        _add_head(view, head)
    if failure:
        view["failure"] = cast(FailureView, failure)  # checked as a WorkerFailure when read
    if (goodput := goodput_of(read)) is not None:
        view["goodput"] = goodput
    if state is JobState.FAILED:
        view["error"] = view["reason"] or (_summary(failure) if failure else "failed")
    return view

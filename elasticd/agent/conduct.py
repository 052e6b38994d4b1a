"""The executor's own decisions, pure: which writes need our lease (and what happens to one made
while we hold none), what this node shows of itself, when its progress is due, what it writes
to the store when it leaves, and the event a compare-and-swap records once it took.
``elasticd.agent.executor`` gathers the facts, asks here, and does only the I/O;
``elasticd.agent.step`` decides everything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticd.agent.actions import (
    Action,
    Amend,
    Bump,
    CheckNodes,
    ClaimLead,
    ClearWaiting,
    CloseRound,
    Exit,
    Finalize,
    Join,
    MarkDone,
    MarkLeft,
    NotePending,
    Probe,
    Publish,
    ReadGlance,
    ReadJob,
    Reassert,
    SetWaiting,
    StartWorkers,
    StopWorkers,
    Wait,
    WatchJoins,
    WatchPeers,
    Withdraw,
)
from elasticd.agent.record import AgentRecord, AgentState
from elasticd.decode import DecodeError, decode
from elasticd.happenings.records import (
    JobFailed,
    JobSucceeded,
    RootCauseAmended,
    RoundBumped,
    RoundComplete,
)
from elasticd.jobs.decider import GroupOutcome
from elasticd.terms.state import FailureKind, JobState, WorkerFailure

SHOWN_MEMBERS = 32  # the members a closed round's event and log line name (the round may have 100,000)
PROGRESS_PUBLISH_S = 5.0  # running workers' progress reaches etcd at most this often, when it changed

# The writes put under our lease (their keys go with it): status, join, waiting, pending note.
LeasedAction = Publish | Join | Reassert | SetWaiting | NotePending
# Every other action: it needs no lease, and passes the gate as it is.
Unleased = (
    ReadGlance
    | ReadJob
    | Wait
    | Exit
    | StopWorkers
    | StartWorkers
    | Withdraw
    | ClaimLead
    | ClearWaiting
    | Probe
    | CheckNodes
    | CloseRound
    | Bump
    | Amend
    | Finalize
    | MarkDone
    | MarkLeft
    | WatchPeers
    | WatchJoins
)


@dataclass(frozen=True)
class Leased:
    """A write to carry out under ``lease``, the lease this node holds as it is made."""

    action: LeasedAction
    lease: int


@dataclass(frozen=True)
class Dropped:
    """A write not carried out, and why: logged by the executor, never silent."""

    action: Action
    why: str


NO_LEASE = "no lease: the step that asked for it runs again and decides under the next lease"


def gate(action: Action, lease: int | None) -> Unleased | Leased | Dropped:
    """``action`` as the executor carries it out, given the lease it holds now (read just before).

    A write that belongs under our lease, asked for while we hold none (it was lost between the
    step and the write, or a status is published during an outage), is dropped: there is no lease
    to put it under, and a key under a lost lease would go with it anyway. Nothing is lost by it:
    ``step`` re-decides from the store and ``Local.lease`` (a join not seen is made again, a solo
    round's join and status are re-asserted under the new lease, a note not recorded is noted
    again). Every other action needs no lease and passes as it is.
    """
    if isinstance(action, LeasedAction):
        return Dropped(action, NO_LEASE) if lease is None else Leased(action, lease)
    return action


def farewell(rec: AgentRecord) -> list[Action]:
    """What an agent that has left writes on its way out (best effort: the store may be down):
    its waiting key, its pending note (under its lease, if it still holds one), its join."""
    actions: list[Action] = [ClearWaiting()]
    if rec.note is not None:
        actions.append(NotePending(None))
    if rec.joined_round >= 0:
        actions.append(Withdraw(rec.joined_round))
    return actions


def shows_exit(state: AgentState, has_workers: bool, running_pids: int) -> bool:
    """Whether this node's view must say how its workers ended (they all exited while the agent is
    still RUNNING: the step that sees it has not run yet)."""
    return has_workers and state is AgentState.RUNNING and running_pids == 0


def shown_state(state: AgentState, exited: GroupOutcome | None) -> str:
    """The state this node shows in its view: ``exited`` is how its workers ended, when
    ``shows_exit`` (else None): DONE when they all succeeded, else FAILED."""
    if exited is None:
        return state.value
    return AgentState.DONE.value if exited is GroupOutcome.SUCCEEDED else JobState.FAILED.value


@dataclass(frozen=True)
class ProgressSent:
    """When this node last checked whether its progress was due, and what it last published."""

    at: float = 0.0
    progress: tuple[dict[str, Any], ...] = ()


def progress_due(sent: ProgressSent, running: bool, lease: int | None, now: float) -> bool:
    """Whether to check our workers' progress for publication now: while they run (``running``:
    workers exist and the agent is RUNNING) under a lease, every ``PROGRESS_PUBLISH_S``. So a
    stepping job costs etcd one small put per node that often, and a change is published at most
    that long after it happened."""
    return running and lease is not None and now - sent.at >= PROGRESS_PUBLISH_S


def progress_changed(sent: ProgressSent, progress: list[dict[str, Any]]) -> bool:
    """Whether ``progress`` differs from what was last published (only a change is put)."""
    return tuple(progress) != sent.progress


def sleep_s(now: float, until: float | None, sent: ProgressSent, running: bool, poll_s: float) -> float:
    """How long a ``Wait`` sleeps at most: until ``until`` (None: no deadline), at most ``poll_s``
    (the executor's safety net), and while workers run (``running``), at most until their
    progress is next due."""
    timeout = poll_s if until is None else max(0.0, min(poll_s, until - now))
    if running:
        timeout = min(timeout, max(0.0, sent.at + PROGRESS_PUBLISH_S - now) + 0.01)
    return timeout


def took(
    action: CloseRound | Bump | Amend | Finalize, job: str, node: str, round_no: int
) -> RoundComplete | RoundBumped | RootCauseAmended | JobSucceeded | JobFailed:
    """The event a compare-and-swap records once it took (``round_no``: the round the agent runs)."""
    match action:
        case CloseRound(result, why, opened):
            return RoundComplete(
                job=job,
                round=result.round,
                world_size=result.world_size,
                members=tuple(result.nodes[:SHOWN_MEMBERS]),
                why=why,
                reason=opened.reason if opened else None,
                rendezvous_s=round(result.closed_at - opened.opened_at, 3) if opened else None,
            )
        case Bump(seen, info, spend):
            restarts = seen.restarts + int(spend)
            return RoundBumped(job, info.round, info.reason, spend, restarts, info.detail)
        case Amend(_, record):
            return RootCauseAmended(job, node, type(record).__name__)
        case Finalize(state, code, reason, failure):
            ended = JobSucceeded if state is JobState.SUCCEEDED else JobFailed
            cause, summary = _root_cause(failure)
            return ended(job, code, reason, round=round_no, cause=cause, root_cause=summary)


def _root_cause(failure: dict[str, Any] | None) -> tuple[FailureKind, str] | tuple[None, None]:
    """A final failure's cause and summary, for the record of the job's end."""
    if failure is None:
        return None, None
    try:
        found = decode(WorkerFailure, failure)
    except DecodeError:
        return None, None
    return found.kind, found.summary()

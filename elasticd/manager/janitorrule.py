"""What the janitor does about each job it sweeps (``elasticd.manager.janitor``). Pure.

The janitor gathers the facts and carries out the action; the rule decides, in two stages so that
the janitor reads only what a decision needs. ``triage`` decides from the job's read alone:
remove an expired job, fail one with a bad record, leave it be, or ask who looks after its round
(``AskMembers``: ``Members.live``) or whether anyone joined its open round (``AskJoins``: counted).
``judge_members`` and ``judge_joins`` then decide from the answer. Precedence, first that holds:
expired (removed), invalid (failed naming the key), then a job no one may look after (orphaned).

A round no live member looks after: every member done is a success; a member there with work left
looks after it; a round whose only member is gone waits for it ``solo_grace_s`` (that node's
workers are not fenced, and its daemon may come back under a new lease); else the round restarts,
spending a restart, or the job fails when none is left. An open round past its join timeout that
no node joined fails the job (with a join, the round's leader closes or fails it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.jobread import InvalidKey, JobRead, JoinsRead, Live
from elasticd.rendezvous.model import RoundHead, RoundInfo
from elasticd.terms.state import EndReason, JobState, RoundReason

# Whether a job waits in an open round, as its read says (``wait_of``): until its join
# timeout (when the round opened, and the timeout) while no node joined; True once one did (the
# janitor leaves it be); False for a job that does not wait (its round closed, or no round).
Wait = tuple[float, float] | bool


@dataclass(frozen=True)
class Policy:
    retention_s: float | None  # how long an ended job's records are kept (None: forever)
    solo_grace_s: float  # how long a round's only member may be gone before it is given up


@dataclass(frozen=True)
class Remove:
    """Delete the records and events of a job that ended longer ago than the retention."""

    ended_at: float


@dataclass(frozen=True)
class FailInvalid:
    """End the job FAILED naming a bad key: ``bad``, read while asking about its members (it is
    reported first), or None for the read's own (reported by every node already)."""

    bad: InvalidKey | None = None


@dataclass(frozen=True)
class AskMembers:
    """Read who looks after the closed round ``head`` (``Members.live``), then ``judge_members``."""

    head: RoundHead


@dataclass(frozen=True)
class AskJoins:
    """Count the open round's joins (the read of every job has none), then ``judge_joins``."""


@dataclass(frozen=True)
class Finalize:
    """Write the job's final record (a compare-and-swap: a job that moved on is left be)."""

    state: JobState
    reason: EndReason
    why: str


@dataclass(frozen=True)
class Bump:
    """Open the next round (a compare-and-swap on the one seen), spending a restart or not."""

    info: RoundInfo
    spend: bool


@dataclass(frozen=True)
class MemberBack:
    """A round's only member, counted as gone, is there again (logged)."""

    node: str


@dataclass(frozen=True)
class Nothing:
    """Someone looks after the job, or its only member is within its grace."""


NOTHING = Nothing()  # the common answer (most jobs wait or run), made once: every change sweeps every job
Triage = Remove | FailInvalid | AskMembers | AskJoins | Finalize | Nothing
Action = FailInvalid | Finalize | Bump | MemberBack | Nothing


@dataclass(frozen=True)
class Judged:
    """What to do about a closed round, and since when its only member is gone (None: not
    counted, or no longer); ``noted``: it was first seen gone now (the janitor logs it once)."""

    action: Action
    missing_since: float | None
    noted: bool = False


def wait_of(read: JobRead) -> Wait:
    """``Wait`` of the job, from its read (the read of every job carries no join: a job whose
    joins were not read waits until its timeout, when they are counted)."""
    if read.closed is not None or read.round is None or read.head is None:
        return False
    if isinstance(read, JoinsRead) and read.current_joins:
        return True
    return (read.round.opened_at, read.head.join_timeout_s)


def waits_in_time(wait: Wait, now: float) -> bool:
    """A job no round of which closed, with a join or within its join timeout: nothing to do."""
    if isinstance(wait, bool):
        return wait
    return now - wait[0] <= wait[1]


def expired(ended_at: float, now: float, policy: Policy) -> bool:
    return policy.retention_s is not None and ended_at < now - policy.retention_s


def triage(read: JobRead, wait: Wait, now: float, policy: Policy) -> Triage:
    """The decision on ``read`` alone, or the question whose answer decides (module doc)."""
    if read.final is not None:
        return Remove(read.final.ended_at) if expired(read.final.ended_at, now, policy) else NOTHING
    if read.invalid:
        return FailInvalid()
    if read.head is None or read.round is None or waits_in_time(wait, now):
        return NOTHING
    closed = read.closed
    if closed is not None:
        return AskMembers(closed)
    if now - read.round.opened_at <= read.head.join_timeout_s:
        return NOTHING
    if isinstance(read, JoinsRead):
        return judge_joins(read, bool(read.current_joins))
    return AskJoins()


def judge_joins(read: JobRead, joined: bool) -> Finalize | Nothing:
    """An open round past its join timeout: the job fails unless a node joined (then the round's
    leader closes or fails it)."""
    if joined or read.head is None:
        return NOTHING
    head = read.head
    why = f"only 0 of the {head.nnodes.min} nodes needed joined within {head.join_timeout_s:g}s"
    return Finalize(JobState.FAILED, EndReason.JOIN_TIMEOUT, why)


def judge_members(
    read: JobRead, closed: RoundHead, alive: Live, missing_since: float | None, now: float, policy: Policy
) -> Judged:
    """The closed round ``closed`` (the job's current one), given who looks after it (``alive``)
    and since when its only member is gone, as counted so far."""
    if isinstance(alive, InvalidKey):  # a bad join read: the job fails for it
        return Judged(FailInvalid(alive), missing_since)
    if isinstance(alive, str):  # a member that has work left is alive: it looks after the job
        return Judged(MemberBack(alive) if missing_since is not None else NOTHING, None)
    if len(alive) >= closed.size:  # everyone finished (done), and no one was left to say so
        return Judged(Finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, ""), missing_since)
    noted = False
    if closed.size == 1:
        noted = missing_since is None
        since = now if missing_since is None else missing_since
        if now - since < policy.solo_grace_s:
            return Judged(NOTHING, since, noted)
        missing_since = None  # given up
    return Judged(_give_up(read, now), missing_since, noted)


def _give_up(read: JobRead, now: float) -> Finalize | Bump:
    """Every member of the current round is lost: restart it, spending a restart, or fail."""
    assert read.head is not None
    why = f"every node of round {read.current} was lost"
    plan = rdzv.plan_bump(RoundReason.MEMBER_LOST, read.restarts, read.head.max_restarts, why)
    if plan.fail:
        return Finalize(JobState.FAILED, EndReason.NODES_LOST, plan.why)
    return Bump(RoundInfo(read.current + 1, RoundReason.MEMBER_LOST, now, (), plan.why), plan.spend)


def still_missing(
    missing: Mapping[tuple[str, int], float], reads: Mapping[str, JobRead]
) -> dict[tuple[str, int], float]:
    """The gone members still counted: those of a job not ended, whose round is still the one."""
    return {
        (j, r): since
        for (j, r), since in missing.items()
        if (read := reads.get(j)) is not None and read.current == r and not read.ended
    }


def next_due(
    missing: Iterable[float],
    reads: Iterable[JobRead],
    wait_of: Callable[[JobRead], Wait],
    now: float,
    policy: Policy,
) -> float | None:
    """The earliest time after ``now`` at which a decision on ``reads`` can change by time alone: a
    solo member's grace ends (``missing``: since when each is gone), a round's join timeout (a job's
    ``Wait``, asked of ``wait_of``), a record's retention. Times already past are left out: the
    sweep acted on them."""
    due = [since + policy.solo_grace_s for since in missing]
    for read in reads:
        if read.final is not None:
            if policy.retention_s is not None:
                due.append(read.final.ended_at + policy.retention_s)
        elif isinstance(wait := wait_of(read), tuple):
            due.append(wait[0] + wait[1])
    return min((t for t in due if t > now), default=None)

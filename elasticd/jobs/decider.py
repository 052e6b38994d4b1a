"""Pure decisions about a local worker group: what its exits mean, when a failure is reported,
whether a hang or an exit speaks, and when a full log disk ends the job. No I/O, no clock: the
executor (``jobs.attempt.ProcessWorkers``) gathers the facts, passes ``now``, and reads only what
the decision asks for.

Whether a failure restarts the job or ends it is a job-wide question (the restart budget is
counted per job, not per node); that rule lives in ``elasticd.rendezvous.decider.plan_bump``.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from elasticd.terms.state import SetupFailure, WorkerFailure

SETTLE_S = 1.0  # how long a failure waits for its siblings' exits before it is reported
KILLED = -signal.SIGKILL  # a worker's return code when SIGKILL ended it


class GroupOutcome(StrEnum):
    RUNNING = "running"  # nothing decided yet: others still run
    SUCCEEDED = "succeeded"  # every local worker exited 0
    FAILED = "failed"  # a worker exited non-zero or by a signal: the group is done for


@dataclass(frozen=True)
class Group:
    """This node's worker group as observed before a step (the executor owns the processes)."""

    outcome: GroupOutcome
    failure: WorkerFailure | None = None  # described once the group failed (or while it settles)
    disk_full: SetupFailure | None = None  # the log disk is full: the likely cause of a failure


def group_outcome(returncodes: Sequence[int], still_running: int) -> GroupOutcome:
    """Workers exited with ``returncodes``; ``still_running`` others remain.

    As in torchelastic, one failed worker fails the whole local group, and a worker that exits 0
    waits for the rest. Exits seen together are judged together, so a failure is never hidden
    behind a sibling's success.
    """
    if any(rc != 0 for rc in returncodes):
        return GroupOutcome.FAILED
    return GroupOutcome.SUCCEEDED if still_running == 0 else GroupOutcome.RUNNING


@dataclass(frozen=True)
class Exited:
    """One worker that has exited, as observed: its return code and when it exited (None: not
    known, e.g. seen before its exit callback ran)."""

    returncode: int
    at: float | None = None


def settle_left(exited: Sequence[Exited], still_running: int, now: float) -> float:
    """Seconds left before a failure seen while siblings still run is reported (0: now).

    A crash usually brings its siblings down within moments (a broken collective), and the report
    must name the first to fail, not the first noticed: so a failure waits ``SETTLE_S`` from the
    first failed exit, or until no sibling runs. Not when the first was killed by SIGKILL: no
    sibling sends that (the kernel's OOM killer, an operator or a scheduler does), so no sibling's
    exit can name an earlier cause, and the restart need not wait for one.
    """
    if still_running == 0:
        return 0.0
    failed = [e for e in exited if e.returncode != 0 and e.at is not None]
    if not failed:
        return 0.0
    first = min(failed, key=lambda e: e.at or 0.0)
    if first.returncode == KILLED:
        return 0.0
    return max(0.0, (first.at or 0.0) + SETTLE_S - now)


class Verdict(StrEnum):
    """What one observation of the group says.

    RUNNING    nothing decided: workers run (or some exited 0 and others run)
    SUCCEEDED  every worker exited 0
    HUNG       the hang watch named a hang, no worker has failed by exiting and one still runs
    SETTLING   a worker failed and siblings still run, within ``SETTLE_S`` of the first failure:
               reported as running, its failure known should the round move
    FAILED     a worker failed, and the settle window is over (or no sibling runs)
    """

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    HUNG = "hung"
    SETTLING = "settling"
    FAILED = "failed"

    @property
    def outcome(self) -> GroupOutcome:
        """The outcome the agent's step sees."""
        return _OUTCOME[self]


_OUTCOME = {
    Verdict.RUNNING: GroupOutcome.RUNNING,
    Verdict.SUCCEEDED: GroupOutcome.SUCCEEDED,
    Verdict.HUNG: GroupOutcome.FAILED,
    Verdict.SETTLING: GroupOutcome.RUNNING,
    Verdict.FAILED: GroupOutcome.FAILED,
}


@dataclass(frozen=True)
class Judgement:
    """A verdict, and what the executor must read to report it."""

    verdict: Verdict
    describe_hang: bool = False  # the hang watch's failure, with the attempt's progress
    describe_exits: bool = False  # the failed workers' logs and error files (``describe_failure``)
    check_disk: bool = False  # whether the log disk is full: a reported failure's likely cause


def judge(exited: Sequence[Exited], still_running: int, hung: bool, now: float, describe: bool) -> Judgement:
    """The group's verdict from its exits so far, whether a hang was named, and the time.

    A failed exit takes precedence over a hang seen in the same observation: the exits say more
    (a rank that died is the cause; its siblings stall on it). So does a success: a hang named
    once every worker has exited 0 (its stacks were looked at while the last one finished a
    slow teardown) names nothing that still runs. ``describe``: the step wants the failure
    described (it has not recorded one yet); only then is anything read.
    """
    outcome = group_outcome([e.returncode for e in exited], still_running)
    if outcome is GroupOutcome.SUCCEEDED:
        return Judgement(Verdict.SUCCEEDED)
    if outcome is not GroupOutcome.FAILED:
        if hung:
            return Judgement(Verdict.HUNG, describe_hang=describe)
        return Judgement(Verdict(outcome.value))
    if settle_left(exited, still_running, now) > 0:
        return Judgement(Verdict.SETTLING, describe_exits=describe)
    return Judgement(Verdict.FAILED, describe_exits=describe, check_disk=describe)


def report(
    verdict: Verdict, failure: WorkerFailure | None = None, disk_full: SetupFailure | None = None
) -> Group:
    """The group as the step sees it: a full log disk travels only with a reported failure (the
    step then ends the job with it, as a restart cannot help), never with a settling one, a hang
    or a running group."""
    if verdict in (Verdict.RUNNING, Verdict.SUCCEEDED):
        return Group(verdict.outcome)
    return Group(verdict.outcome, failure, disk_full if verdict is Verdict.FAILED else None)

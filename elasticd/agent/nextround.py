"""What an event does to a running job: open the next round, or end the job.

Pure: the one decision every event an agent sees comes to (a failure, a lost or leaving
member, a waiting newcomer), whoever sees it first; ``elasticd.agent.step`` returns the action,
and the executor's compare-and-swap makes it happen once (``Bump`` is guarded by ``Seen``)."""

from __future__ import annotations

from elasticd.agent import blame
from elasticd.agent.actions import Bump, Finalize
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.glance import Seen
from elasticd.rendezvous.jobread import JobRead
from elasticd.rendezvous.model import RoundInfo
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, JobState, RoundReason, WorkerFailure


def bump_or_end(
    spec: JobSpec,
    read: JobRead,
    now: float,
    reason: RoundReason,
    detail: str,
    failure: WorkerFailure | None = None,
    extra: tuple[str, ...] = (),
    grace_s: float | None = None,
) -> Bump | Finalize:
    """Open the next round for ``reason`` (once, whoever sees it first) or end the job: when
    the budget is spent, or when a failure repeats itself ``max_same_failures`` times."""
    plan = rdzv.plan_bump(reason, read.restarts, spec.max_restarts, detail)
    stored = failure.to_json() if failure is not None else None
    if plan.fail:
        code = EndReason.NODES_LOST
        if reason is RoundReason.WORKER_FAILED:
            code = EndReason.OOM if failure and failure.oom else EndReason.WORKER_FAILED
        return Finalize(JobState.FAILED, code, plan.why, stored)
    repeats = blame.repeats(read.round, failure) if failure is not None else 0
    if spec.max_same_failures and repeats >= spec.max_same_failures:
        left = spec.max_restarts - read.restarts
        why = (
            f"{detail}; failed the same way {repeats} times in a row with no progress,"
            f" so it stopped with {left} of {spec.max_restarts} restarts left"
        )
        return Finalize(JobState.FAILED, EndReason.REPEATED_FAILURE, why, stored)
    expect = rdzv.next_expect(extra)
    info = RoundInfo(read.current + 1, reason, now, expect, detail, stored, grace_s, repeats, True)
    return Bump(Seen.of(read), info, plan.spend)

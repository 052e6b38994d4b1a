"""Carries out the per-user limits on a scan: fails the jobs ``jobs.quota.over_limits`` names.

Every node runs it on every scan, so a spec written straight into etcd (around any daemon's
submit checks) is failed by whichever node sees it first: ``finalize`` is create-once in etcd,
and the others' writes change nothing (only the winner logs the failure, which the event
history records).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from elasticd.happenings.bus import publish
from elasticd.happenings.records import JobFailed
from elasticd.jobs.quota import Quotas, Verdict, over_limits
from elasticd.jobs.ticket import JobTicket
from elasticd.manager.access import Admins
from elasticd.rendezvous.jobstore import JobStore
from elasticd.terms.state import JobState


async def enforce(
    tickets: Sequence[JobTicket],
    quotas: Quotas,
    admins: Admins,
    store_of: Callable[[str], JobStore],
    verdicts: list[Verdict] | None = None,
) -> set[str]:
    """End FAILED every job over a limit of its user's; the ids of those jobs (``verdicts``: the
    ones ``over_limits`` gives for these tickets, when the caller has them already)."""
    if verdicts is None:
        verdicts = over_limits(tickets, quotas, {uid for uid in {t.uid for t in tickets} if admins(uid)})
    for v in verdicts:
        if await store_of(v.job_id).finalize(JobState.FAILED, v.code, v.reason):
            publish(JobFailed(v.job_id, v.code, v.reason))
    return {v.job_id for v in verdicts}

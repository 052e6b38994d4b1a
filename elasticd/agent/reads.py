"""The reads ``step`` asks for: a waiting node's glance, a member's own read of the job, or the
rounds whole (a leader's, a node's outside the round), none with the nodes' statuses, which no
decider reads; and the nodes alive among those the read names (``presence_asked``).

A read that finds a bad key only a read of this job covers (a join, an assignment: the janitor's
read of every job does not) ends the job FAILED naming it, as the janitor ends a job for the
others, once. The executor (``agent.executor``) hands each read over as ``step`` asked for it;
nothing is decided here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from elasticd.agent import actions as act
from elasticd.agent.record import Observed, View, presence_asked
from elasticd.agent.seams import Lease
from elasticd.decode import report_invalid
from elasticd.happenings.bus import publish
from elasticd.happenings.records import JobFailed
from elasticd.rendezvous.jobread import AgentRead, JobRead
from elasticd.rendezvous.jobstore import JobStore
from elasticd.terms.state import EndReason


async def read(
    store: JobStore,
    lease: Lease,
    node: str,
    action: act.ReadGlance | act.ReadJob,
    on_invalid: Callable[[], None] | None = None,
) -> View:
    """What ``action`` asks for, as ``node`` reads it. A read with an invalid record and no final
    one ends the job for what only it shows (``fail_unseen``), and tells ``on_invalid`` (the
    janitor, which ends it for the rest: now, not at its next poll)."""
    if isinstance(action, act.ReadGlance):
        return await store.glance(action.round, node)
    found: AgentRead
    if action.rosters:
        found = await store.read_rosters(action.counted, statuses=False)
    else:
        found = await store.read_member(node, action.counted, statuses=False)
    if found.invalid and found.final is None:
        await fail_unseen(store, found)
        if on_invalid is not None:
            on_invalid()
    return Observed(found, await lease.alive(presence_asked(found)))


async def fail_unseen(store: JobStore, read: JobRead) -> None:
    """End the job for a bad key that no janitor's read of every job shows (a join, an
    assignment: only a read of this job covers them), as the janitor ends it for the others;
    once (``fail_invalid`` writes the final record only if there is none)."""
    unseen = [k for k in read.invalid if not store.keys.read_with_every_job(k.key)]
    for bad in unseen:  # (the janitor's scan reports the others)
        report_invalid(bad.key, bad.revision, bad.why, job=read.job_id)
    if unseen and await store.fail_invalid(replace(read, invalid=tuple(unseen))):
        publish(JobFailed(read.job_id, EndReason.INVALID_RECORD, key=unseen[0].key))

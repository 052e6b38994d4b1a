"""Crash recovery: clean up after a predecessor daemon that died, before taking new work.

Its processes (in this daemon's tracking cgroups, marked with our node id, or in process groups the
state dir recorded) are killed, every job cgroup is swept, and each job it ran is told: the round it
was in cannot go on without it (the round is bumped, spending a restart), or the job fails when no
restart is left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psutil

from elasticd import log
from elasticd.agent.seams import Lease
from elasticd.errors import EtcdUnavailable
from elasticd.jobs.attempt import NodeRuntime
from elasticd.node.statedir import StateDir
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.glance import Seen
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import RoundInfo
from elasticd.terms.state import EndReason, JobState, RoundReason
from elasticd.workers.proctree import tree as proctree

_log = log.get("elasticd.jobs")


async def recover(
    rt: NodeRuntime, state: StateDir, store_of: Callable[[str], JobStore], lease_of: Callable[[str], Lease]
) -> None:
    """Kill what a dead predecessor left, and hand its jobs on."""
    leftovers = await asyncio.to_thread(proctree.marked, rt.node_id)
    records = state.jobs()
    pgids = [pg for rec in records.values() for pg in _pgids(rec) if _orphaned_group(pg)]
    if leftovers or pgids:
        _log.warning("recover.killing", pids=[p.pid for p in leftovers], pgids=pgids)
        await proctree.terminate(leftovers, pgids, grace_s=2.0)
    # No worker of ours is alive yet: every job cgroup is stale, and what is in one escaped the rest.
    swept = await asyncio.to_thread(rt.tracking.sweep)
    if swept:
        _log.warning("recover.swept", cgroups=[str(p) for p in swept])
    rt.limits.sweep(())  # after the tracking sweep: a v2 leaf is shared
    for job_id in records:
        state.drop_job(job_id)
        try:
            await _recover_job(rt.node_id, store_of(job_id), lease_of(job_id))
        except EtcdUnavailable as exc:
            _log.warning("recover.skipped", job=job_id, error=str(exc))


async def _recover_job(node: str, store: JobStore, lease: Lease) -> None:
    read = await store.read_member(node)  # whether we are a member: O(1) bytes
    if not read.found or read.ended or read.me(node) is None:
        return  # a job with a bad record is failed by the janitor
    assert read.head is not None
    why = f"elasticd on {node} restarted while the job ran"
    plan = rdzv.plan_bump(RoundReason.MEMBER_LOST, read.restarts, read.head.max_restarts, why)
    if plan.fail:
        await store.finalize(JobState.FAILED, EndReason.NODES_LOST, plan.why)
    else:
        info = RoundInfo(read.current + 1, RoundReason.MEMBER_LOST, time.time(), (), why, expect_members=True)
        await store.bump(Seen.of(read), info, plan.spend)
    _log.warning(
        "recover.job", job=store.job_id, action="failed" if plan.fail else "restart", reason=plan.why
    )


def _pgids(record: Any) -> list[int]:
    """The process groups a state-dir record names (a damaged record names none)."""
    pgids = record.get("pgids") if isinstance(record, dict) else None
    return [p for p in pgids if type(p) is int and p > 1] if isinstance(pgids, list) else []


def _orphaned_group(pgid: int) -> bool:
    """True if ``pgid`` still names the old group: its leader is gone (pids are not reused while a
    group of that id exists, so a live group without its leader is the orphaned original)."""
    return not psutil.pid_exists(pgid) and bool(proctree.group_members(pgid))

"""Cluster-wide clean-up, done by one elected node instead of by every node.

The janitor is the node that holds the ``janitor`` key, which it creates under its own lease:
when that node dies or stops, the key goes with its lease and the next node to scan takes over.
Every clean-up write is a compare-and-swap, so a brief overlap of two janitors is harmless.

It ends jobs that have an invalid record (naming the key), restarts or fails jobs that no live
member looks after, fails jobs that no node joined within the join timeout, and deletes the
records of jobs that ended longer ago than the retention (each node then drops its own logs).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from elasticd import log
from elasticd.decode import report_invalid
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.types import Compare, Put
from elasticd.jobs.spec import valid_job_id
from elasticd.jobs.state import EndReason, JobState
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.model import RoundInfo, RoundReason
from elasticd.rendezvous.snapshot import JobSnapshot
from elasticd.rendezvous.store import JobStore, Seen

_log = log.get("elasticd.janitor")


class Janitor:
    def __init__(
        self,
        kv: KV,
        keys: Keys,
        node_id: str,
        store_of: Callable[[str], JobStore],
        retention_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kv = kv
        self._retention_s = retention_s  # how long an ended job's records are kept (None: forever)
        self._clock = clock
        self._keys = keys
        self._node = node_id
        self._store_of = store_of
        self.holding = False

    async def elected(self, lease: int) -> bool:
        """Whether this node is the janitor: it holds the key, or has just created it."""
        key = self._keys.janitor()

        def claim() -> bool:
            held = self._kv.get(key)  # one read while the role is settled
            if held is not None:
                return held.lease == lease
            return self._kv.txn([Compare(key, "create", 0)], [Put(key, {"node": self._node}, lease)])

        holding = await asyncio.to_thread(claim)
        if holding != self.holding:
            _log.info("janitor.elected" if holding else "janitor.other", node=self._node)
            self.holding = holding
        return holding

    async def sweep(self, snaps: dict[str, JobSnapshot]) -> None:
        for snap in snaps.values():
            if snap.final is not None and self._expired(snap.final.ended_at):
                await asyncio.to_thread(self._kv.delete_prefix, self._keys.job(snap.job_id))
                _log.info("job.expired", job=snap.job_id, ended_at=snap.final.ended_at)
            elif snap.final is None and snap.invalid:
                await self._fail_invalid(snap)
            elif snap.spec is not None and not snap.ended:
                await self._orphan(snap)

    def _expired(self, ended_at: float) -> bool:
        return self._retention_s is not None and ended_at < self._clock() - self._retention_s

    async def _fail_invalid(self, snap: JobSnapshot) -> None:
        """A job with a bad record ends FAILED, naming the key. A bad ``final`` is replaced by a
        readable one; nothing is written for a key that names no job."""
        if valid_job_id(snap.job_id) and await self._store_of(snap.job_id).fail_invalid(snap):
            _log.warning(
                "job.failed", job=snap.job_id, code=EndReason.INVALID_RECORD.value, key=snap.invalid[0].key
            )

    async def _orphan(self, snap: JobSnapshot) -> None:
        """A job no live member looks after: restart it (spending a restart) or fail it."""
        assert snap.spec is not None and snap.round is not None
        spec, result = snap.spec, snap.result
        store = self._store_of(snap.job_id)
        if result is not None:
            done = snap.done.get(snap.current, set())
            if set(result.nodes) <= done:  # everyone finished, and no one was left to say so
                await store.finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, "")
                return
            joined = {j.node for j in snap.current_joins}
            if any(n in joined for n in result.nodes if n not in done):
                return  # a member that has work left is alive: it looks after the job
            why = f"every node of round {snap.current} was lost"
            plan = rdzv.plan_bump(RoundReason.MEMBER_LOST, snap.restarts, spec.max_restarts, why)
            if plan.fail:
                await store.finalize(JobState.FAILED, EndReason.NODES_LOST, plan.why)
                return
            info = RoundInfo(snap.current + 1, RoundReason.MEMBER_LOST, time.time(), (), plan.why)
            if await store.bump(Seen.of(snap), info, plan.spend):
                _log.warning("job.orphaned", job=snap.job_id, round=snap.current, action="restart")
        elif not snap.current_joins and time.time() - snap.round.opened_at > spec.join_timeout_s:
            why = f"only 0 of the {spec.nnodes.min} nodes needed joined within {spec.join_timeout_s:g}s"
            await store.finalize(JobState.FAILED, EndReason.JOIN_TIMEOUT, why)


def report(snaps: dict[str, JobSnapshot]) -> None:
    """Log each bad key of a job not yet failed for it, once (every node does: it is what its
    operator reads)."""
    for snap in snaps.values():
        for bad in snap.invalid if snap.final is None else ():
            report_invalid(bad.key, bad.revision, bad.why, job=snap.job_id)

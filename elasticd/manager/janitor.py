"""Cluster-wide clean-up, done by one elected node instead of by every node.

The janitor is the node that holds the ``janitor`` key, which it creates under its own lease:
when that node dies or stops, the key goes with its lease and the next node to scan takes over.
Every clean-up write is a compare-and-swap, so a brief overlap of two janitors is harmless.

It ends jobs that have an invalid record (naming the key), restarts or fails jobs that no live
member looks after, fails jobs that no node joined within the join timeout, deletes the
records of jobs that ended longer ago than the retention (each node then drops its own logs),
and deletes notes (``notes/<job>/``) left of a job that has no records.

The read of every job it sweeps carries no join (``parts/``, one per member of a round), so
what it decides on them it asks for: whether a running round still has a member there with work
left, or every member is done (``Members.live``: the one found last time, its join and done
marker, at each sweep), and whether an open round past its join timeout has any join (counted).

While etcd is above its high-water mark (``elasticd.etcd.space``), it first removes ended jobs
before their retention is up, the oldest first, until their records add up to what is in use
above the mark, and compacts etcd's history to the current revision, so that the space they took
can be used again (deletes and compactions are what etcd still allows under NOSPACE). Giving the
file back to the disk (a defragmentation) is the operator's: it blocks the member while it runs.

What it does about each job is decided by ``janitorrule`` (pure), in two stages so that a read is
made only when the decision needs it; this module reads the facts and carries the actions out. A
round whose only member is gone gets a grace first (``SOLO_GRACE_S``): that node's workers are not
fenced (there are no peers to split from), so a daemon that was frozen or cut off from etcd past
its lease TTL still runs them, and re-asserts its join under its new lease when it is back
(``elasticd.agent.step``). A node that died for good still does not leave its job RUNNING for ever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from elasticd import log
from elasticd.decode import report_invalid
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.space import Ended, Space, relief
from elasticd.etcd.types import Compare, Put
from elasticd.happenings.bus import publish
from elasticd.happenings.records import JobExpired, JobFailed, JobOrphaned
from elasticd.history.store import EventLog
from elasticd.jobs.view import job_state
from elasticd.manager import janitorrule as rule
from elasticd.rendezvous.glance import Seen
from elasticd.rendezvous.jobread import JobRead, Live
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import RoundHead
from elasticd.rendezvous.rosterread import Members
from elasticd.terms.ids import valid_job_id
from elasticd.terms.state import EndReason, IllegalTransition, check_transition

_log = log.get("elasticd.janitor")

# How long a round's only member may be gone (no join key: its lease expired) before the janitor
# gives it up. It covers a daemon frozen or cut off from etcd for about this long past its TTL; a
# janitor that takes the role over starts counting afresh (later, never sooner).
SOLO_GRACE_S = 60.0
MAX_TXN_DELETES = 100  # etcd refuses a transaction of more than 128 operations (--max-txn-ops)
# Between two reliefs: etcd frees a compacted history in the background, and the next reading must
# show what the last relief gave back before another one removes more.
RELIEF_S = 60.0
JOB_OVERHEAD = 4096  # bytes of a job's records besides its spec (round, results, statuses), roughly


class Janitor:
    def __init__(
        self,
        kv: KV,
        keys: Keys,
        node_id: str,
        store_of: Callable[[str], JobStore],
        retention_s: float | None = None,
        clock: Callable[[], float] = time.time,
        solo_grace_s: float = SOLO_GRACE_S,
        space: Callable[[], Space | None] = lambda: None,
    ) -> None:
        self._kv = kv
        self._space = space  # the last reading of etcd's fullness (None: not watched)
        self._relieved_at: float | None = None
        self._events = EventLog(kv, keys)
        self._missing: dict[tuple[str, int], float] = {}  # (job, round) -> since when its member is gone
        self._policy = rule.Policy(retention_s, solo_grace_s)
        self._clock = clock
        self._keys = keys
        self._node = node_id
        self._store_of = store_of
        self._waits: dict[str, tuple[JobRead, rule.Wait]] = {}  # by job, per read of it (``_wait_of``)
        self._members = Members(kv, keys)  # who is a member of a running round, as asked
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
            self._missing.clear()  # counted afresh by whoever holds the role
        return holding

    def next_due(self, reads: Mapping[str, JobRead]) -> float | None:
        """The earliest time (this clock) at which a decision of ``sweep`` over ``reads`` can change
        by time alone (``janitorrule.next_due``). Everything else it decides on changes a key, and
        the watch wakes the scan for that (a write that lost a race is retried at the next change
        or by the safety net, never in a tight loop)."""
        return rule.next_due(
            self._missing.values(), reads.values(), self._wait_of, self._clock(), self._policy
        )

    async def sweep(self, reads: Mapping[str, JobRead]) -> None:
        """Decide on every job (``janitorrule``) and carry the decision out."""
        self._missing = rule.still_missing(self._missing, reads)
        self._members.retain(reads)
        await self._members.prefetch(reads)  # each running round's member, all in a request or few
        for read in reads.values():
            decided = rule.triage(read, self._wait_of(read), self._clock(), self._policy)
            if decided is rule.NOTHING:
                continue  # (most jobs: no coroutine for them)
            match decided:
                case rule.Remove(ended_at):
                    await self._remove(read.job_id)
                    publish(JobExpired(read.job_id, ended_at=ended_at))
                case rule.AskMembers(closed):
                    alive = await self._members.live(read, closed)
                    await self._judged(read, closed, alive)
                case rule.AskJoins():
                    count = await self._store_of(read.job_id).count_joins(read.current)
                    await self._act(read, rule.judge_joins(read, count > 0))
                case rule.FailInvalid() | rule.Finalize() | rule.Nothing() as action:
                    await self._act(read, action)
        if len(self._waits) > len(reads):  # (jobs gone)
            self._waits = {j: w for j, w in self._waits.items() if j in reads}

    def _wait_of(self, read: JobRead) -> rule.Wait:
        """``janitorrule.wait_of``, made once per read of the job (the read hands out the same one while
        the job's keys are unchanged): every change sweeps every job, and most wait."""
        held = self._waits.get(read.job_id)
        if held is not None and held[0] is read:
            return held[1]
        wait = rule.wait_of(read)
        self._waits[read.job_id] = (read, wait)
        return wait

    async def _judged(self, read: JobRead, closed: RoundHead, alive: Live) -> None:
        """Count a closed round's only member gone (or back), then act on the rule's judgement."""
        key = (read.job_id, read.current)
        judged = rule.judge_members(read, closed, alive, self._missing.get(key), self._clock(), self._policy)
        if judged.noted:
            _log.warning("job.member_missing", job=key[0], round=key[1], grace_s=self._policy.solo_grace_s)
        if judged.missing_since is None:
            self._missing.pop(key, None)
        else:
            self._missing[key] = judged.missing_since
        await self._act(read, judged.action)

    async def _act(self, read: JobRead, action: rule.Action) -> None:
        """Carry out one of the rule's actions on ``read``'s job."""
        match action:
            case rule.FailInvalid(None):
                await self._fail_invalid(read)
            case rule.FailInvalid(bad) if bad is not None:  # read while asking: reported here
                report_invalid(bad.key, bad.revision, bad.why, job=read.job_id)
                await self._fail_invalid(replace(read, invalid=(bad,)))
            case rule.Finalize(state, reason, why):
                try:
                    check_transition(read.job_id, job_state(read), state)
                except IllegalTransition as exc:  # one bad decision must not stop the sweep of the rest
                    _log.error("job.illegal_transition", job=read.job_id, error=str(exc))
                    return
                await self._store_of(read.job_id).finalize(state, reason, why)
            case rule.Bump(info, spend):
                if await self._store_of(read.job_id).bump(Seen.of(read), info, spend):
                    publish(JobOrphaned(read.job_id, read.current))
            case rule.MemberBack(node):
                _log.info("job.member_back", job=read.job_id, round=read.current, node=node)
            case rule.Nothing():
                pass

    async def drop_strays(self, strays: dict[str, list[str]]) -> None:
        """Delete parts of jobs that have no records (``jobparse.parse_jobs``), unless the job
        exists again by now (its head is created with its first records, in one transaction)."""
        for job_id, stray in strays.items():
            guard = [Compare(self._keys.job_spec(job_id), "create", 0)]
            for start in range(0, len(stray), MAX_TXN_DELETES):
                chunk = stray[start : start + MAX_TXN_DELETES]
                if not await asyncio.to_thread(self._kv.txn, guard, [], chunk):
                    break
                _log.info("job.parts_dropped", job=job_id[:80], keys=len(chunk))

    async def relieve(self, reads: Mapping[str, JobRead]) -> set[str]:
        """While etcd is above its mark: remove the oldest ended jobs (``space.relief``) and compact;
        the jobs removed. At most once every ``RELIEF_S``. The scan runs it before anything that
        writes (none of it is refused under NOSPACE), and leaves the jobs removed out after it."""
        space = self._space()
        now = self._clock()
        if space is None or (self._relieved_at is not None and now < self._relieved_at + RELIEF_S):
            return set()
        ended = [Ended(j, s.final.ended_at, _size(s)) for j, s in reads.items() if s.final is not None]
        chosen = relief(space, ended)
        if not chosen:
            return set()
        self._relieved_at = now
        for job_id in chosen:
            await self._store_of(job_id).remove()
            publish(JobExpired(job_id, why="etcd_full"))
        await asyncio.to_thread(self._events.drop_jobs, set(chosen))  # one read of the older events
        try:
            status = await asyncio.to_thread(self._kv.status)
            if status is not None:
                await asyncio.to_thread(self._kv.compact, status.revision)
                _log.warning(
                    "etcd.compacted",
                    revision=status.revision,
                    jobs_removed=len(chosen),
                    db_size=status.db_size,
                    next_step="an operator defragments each member (etcdctl defrag)",
                )
        except EtcdUnavailable as exc:
            _log.warning("etcd.compact_failed", error=str(exc), fix="etcdctl compact <revision>")
        return set(chosen)

    async def _remove(self, job_id: str) -> None:
        """Delete a job's records, then its own events (``EventLog.drop_jobs``)."""
        await self._store_of(job_id).remove()
        await asyncio.to_thread(self._events.drop_jobs, {job_id})

    def now(self) -> float:
        return self._clock()

    async def _fail_invalid(self, read: JobRead) -> None:
        """A job with a bad record ends FAILED, naming the key. A bad ``final`` is replaced by a
        readable one; nothing is written for a key that names no job."""
        if valid_job_id(read.job_id) and await self._store_of(read.job_id).fail_invalid(read):
            publish(JobFailed(read.job_id, EndReason.INVALID_RECORD, key=read.invalid[0].key))


def _size(read: JobRead) -> int:
    """About how many bytes a job's records take in etcd: its full spec, and the rest (its head
    among them) roughly."""
    return (read.head.spec_bytes if read.head is not None else 0) + JOB_OVERHEAD


def report(reads: Mapping[str, JobRead]) -> None:
    """Log each bad key of a job not yet failed for it, once (every node does: it is what its
    operator reads)."""
    for read in reads.values():
        for bad in read.invalid if read.final is None else ():
            report_invalid(bad.key, bad.revision, bad.why, job=read.job_id)

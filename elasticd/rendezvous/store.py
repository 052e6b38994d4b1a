"""A job's state in the key-value store: the writes that change it, behind the async
``JobStore`` protocol, over its reads (``storeread``: one consistent read at a time).

Every write that must not race is a transaction guarded by revisions (the fencing tokens):
- the job is created once (``create(head) == 0``), its head (``jobs/<job>/spec``) and its full
  spec (``specs/<job>``, read by a node about to take part: ``spec``) together, and removed
  with them together;
- a round's assignments, then its head, are written by its leader while its join is the one it
  led with, the head does not exist and the job has not ended (``close``, ``roster``): the head
  last, once;
- the round advances only from the revision the caller saw (``mod(round)``), together with the
  restart counter (``mod(restarts)``), so concurrent observers of one event bump it once;
- the job ends once (``create(final) == 0``).

The protocol is ``elasticd.rendezvous.jobstore.JobStore``. Two implementations share this logic
over the ``KV`` seam: ``EtcdJobStore`` (a real etcd; calls
run in a thread) and ``InlineJobStore`` (calls run inline: over ``MemoryKV`` for unit and property
tests). The contract tests in ``tests/contract`` run against both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from typing import Any, TypeVar, cast

from elasticd.etcd.types import Compare, Put, Query
from elasticd.rendezvous import leadership, roster
from elasticd.rendezvous.glance import Glance, Seen
from elasticd.rendezvous.jobread import InvalidKey, JobRead
from elasticd.rendezvous.model import DrainRecord, FinalRecord, Join, RoundInfo, RoundResult
from elasticd.rendezvous.storeread import KVJobReader
from elasticd.terms.head import JobHead, body_bytes
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, JobState, RoundReason

T = TypeVar("T")


class KVJobStore(KVJobReader):
    """``JobStore`` over any ``KV``: its reads (``KVJobReader``) and its writes; subclasses say
    how a blocking call is run."""

    # -- creation and the end ------------------------------------------------------------------
    async def create(self, spec: JobSpec) -> int:
        """Create the job: its head, its full spec and its first records, in one transaction.
        The revision it was written at (what a reader waits for to see it), or 0 if the job
        exists already (nothing written)."""
        k, j = self._keys, spec.id
        info = RoundInfo(0, RoundReason.START, time.time())
        body = spec.to_json()
        puts = [
            Put(k.job_body(j), body),
            Put(k.job_spec(j), JobHead.of(spec, len(body_bytes(spec))).to_json()),
            Put(k.job_round(j), info.to_json()),
            Put(k.job_restarts(j), 0),
        ]
        compare = [Compare(k.job_spec(j), "create", 0)]
        read = [Query(k.job_spec(j))]
        found = await self._run(lambda: self._kv.write_and_read(compare, puts, (), read))
        return found[0].kvs[0].mod_revision if found is not None and found[0].kvs else 0

    async def finalize(
        self, state: JobState, code: EndReason, reason: str, failure: dict[str, Any] | None = None
    ) -> bool:
        """End the job once; the first caller wins and later ones change nothing."""
        final = FinalRecord(state, reason, code, failure, time.time())
        key = self._keys.job_final(self.job_id)
        return await self._run(lambda: self._kv.txn([Compare(key, "create", 0)], [Put(key, final.to_json())]))

    async def fail_invalid(self, read: JobRead) -> bool:
        """End a job that has an invalid record FAILED, naming the (first) bad key. A bad ``final``
        itself is replaced instead. True if this call wrote the final record."""
        bad_final = read.final_invalid
        if bad_final is not None:
            return await self._replace_final(bad_final, bad_final.describe())
        return await self.finalize(JobState.FAILED, EndReason.INVALID_RECORD, read.invalid[0].describe())

    async def _replace_final(self, bad: InvalidKey, reason: str) -> bool:
        """Overwrite a ``final`` that is not a record (``bad``, read at its revision) with a FAILED
        one: the job has ended either way, and a readable record stops every reader from
        re-reporting it. Only that exact revision is replaced, so a real end is never lost."""
        final = FinalRecord(JobState.FAILED, reason, EndReason.INVALID_RECORD, None, time.time())
        key = self._keys.job_final(self.job_id)
        return await self._run(
            lambda: self._kv.txn([Compare(key, "mod", bad.revision)], [Put(key, final.to_json())])
        )

    # -- rounds --------------------------------------------------------------------------------
    async def join(self, round_no: int, join: Join, lease: int) -> Glance:
        """Put ``join`` under ``lease``, only while the job's head read last is there (as a
        status: ``put_node_status``), so that no join is left of a removed job: no read of every
        job covers the joins to find it. The answer is a glance from the same transaction
        (``leadership.join``)."""
        head, k, j = self._head_revision, self._keys, self.job_id
        return await self._run(lambda: leadership.join(self._kv, k, j, head, round_no, join, lease))

    async def withdraw(self, round_no: int, node: str) -> None:
        await self._run(lambda: leadership.withdraw(self._kv, self._keys, self.job_id, round_no, node))

    async def claim_lead(self, round_no: int, node: str, epoch: int, lease: int) -> bool:
        """Say that ``node`` leads round ``round_no`` (``leadership.claim``)."""
        k, j = self._keys, self.job_id
        return await self._run(lambda: leadership.claim(self._kv, k, j, round_no, node, epoch, lease))

    async def close(self, result: RoundResult, leader: str) -> bool:
        """Close the round: every member's assignment, in bounded transactions, then its head
        (``roster``). Each is guarded: no head yet, no final, and ``leader``'s join still the one
        it led with (``result.epoch``, its create revision), so a leader that lost its place (its
        lease ended, it withdrew) writes nothing more and never mixes with the next one's. False
        when a guard failed: someone else closed the round, or will."""
        k, j = self._keys, self.job_id
        head = k.result(j, result.round)
        compare = [
            Compare(head, "create", 0),
            Compare(k.job_final(j), "create", 0),
            Compare(k.join(j, result.round, leader), "create", result.epoch),
        ]
        items = [(k.assignment(j, a.round, a.member.node), a.to_json()) for a in roster.assignments(result)]
        txns = [[Put(key, value) for key, value in batch] for batch in roster.batches(items)]
        txns.append([Put(head, result.head().to_json())])
        return await self._run(lambda: self._write_in_order(compare, txns))

    def _write_in_order(self, compare: list[Compare], txns: list[list[Put]]) -> bool:
        """Each of ``txns`` under ``compare``, in order (the last one alone after all the others
        took); False at the first that did not."""
        return all(self._kv.txn(compare, puts) for puts in txns)

    async def bump(self, seen: Seen, info: RoundInfo, spend: bool) -> bool:
        """Open round ``info.round`` if the round is still the one the caller saw. True if we did."""
        k, j = self._keys, self.job_id
        puts = [Put(k.job_round(j), info.to_json())]
        if spend:
            puts.append(Put(k.job_restarts(j), seen.restarts + 1))
        compare = [
            Compare(k.job_round(j), "mod", seen.round_mod),
            Compare(k.job_restarts(j), "mod", seen.restarts_mod),
            Compare(k.job_final(j), "create", 0),
        ]
        return await self._run(lambda: self._kv.txn(compare, puts))

    async def amend(self, seen_mod: int, record: RoundInfo | FinalRecord) -> bool:
        """Rewrite the round (a ``RoundInfo``) or the final record if it is still at revision
        ``seen_mod``; a round that moved on, or a final written meanwhile, is left alone."""
        k, j = self._keys, self.job_id
        key = k.job_round(j) if isinstance(record, RoundInfo) else k.job_final(j)
        return await self._run(
            lambda: self._kv.txn([Compare(key, "mod", seen_mod)], [Put(key, record.to_json())])
        )

    async def mark_done(self, round_no: int, node: str) -> None:
        """``node``'s workers of ``round_no`` all exited 0 (beside its join: only while the job's
        head read last is there, so that none is left of a removed job)."""
        await self._put_guarded(Put(self._keys.done(self.job_id, round_no, node), {"at": time.time()}))

    async def mark_left(self, round_no: int, node: str) -> None:
        """``node`` stopped its workers: ``round_no`` need not wait for it (it rejoins only as a
        leader that withdrew as the cut one does, its workers still stopped)."""
        key = self._keys.left(self.job_id, round_no, node)
        await self._run(lambda: self._kv.put_json(key, {"at": time.time()}))

    async def revoke(self, lease: int) -> None:
        """Revoke a dead peer's lease: its keys go at once, as if its TTL had run out."""
        await self._run(lambda: self._kv.revoke_lease(lease))

    async def forget_rounds_before(self, round_no: int) -> None:
        """Old rounds are history; keep the previous one (stable ranks need its result)."""

        def forget() -> None:
            for old in range(max(0, round_no - 4), round_no - 1):
                for prefix in self._keys.rounds(self.job_id, old):  # the head before its assignments
                    self._kv.delete_prefix(prefix)

        await self._run(forget)

    async def remove(self) -> None:
        """Delete every record of the job: its joins and notes first (``Keys.job_prefixes``), then its
        records, its rounds' assignments, its nodes' reports and its full spec in one
        transaction, so that none is left without the others."""
        parts, notes, records = self._keys.job_prefixes(self.job_id)
        body = self._keys.job_body(self.job_id)
        rounds = Query(self._keys.job_rounds(self.job_id), prefix=True)
        reports = Query(self._keys.job_reports(self.job_id), prefix=True)

        def remove() -> None:
            self._kv.delete_prefix(parts)
            self._kv.delete_prefix(notes)
            self._kv.txn([], [], [Query(records, prefix=True), rounds, reports, body])

        await self._run(remove)

    # -- per-node records ------------------------------------------------------------------------
    async def set_waiting(self, node: str, lease: int) -> None:
        key = self._keys.waiting(self.job_id, node)
        await self._run(lambda: self._kv.put_json(key, {"at": time.time()}, lease))

    async def clear_waiting(self, node: str) -> None:
        await self._run(lambda: self._kv.delete(self._keys.waiting(self.job_id, node)))

    async def drain_member(self, node: str, record: DrainRecord) -> None:
        """Drain ``node`` out of this job (``jobs/<job>/drain/<node>``), as ``drain NODE --job``
        does: the node leaves gracefully, and stays out until the record is deleted (``undrain``)."""
        key = self._keys.job_drain(self.job_id, node)
        await self._run(lambda: self._kv.put_json(key, asdict(record)))

    async def put_node_status(self, node: str, status: dict[str, Any], lease: int) -> None:
        """Publish ``node``'s report (``reports/<job>/<node>``), only while the job's head read
        last is there: no read of every job covers the reports, so none finds one left of a
        removed job (a leaving agent's last publish after ``rm``) to delete; this puts none.
        Before any read of the job, unguarded."""
        await self._put_guarded(Put(self._keys.node_status(self.job_id, node), status, lease))

    async def _put_guarded(self, put: Put) -> None:
        """``put`` if the job's head is the one read last (unguarded before any read)."""
        head, spec = self._head_revision, self._keys.job_spec(self.job_id)
        if not head:
            await self._run(lambda: self._kv.put_json(put.key, put.value, put.lease))
            return
        await self._run(lambda: self._kv.txn([Compare(spec, "create", head)], [put]))

    async def note_pending(self, node: str, note: str | None, lease: int) -> None:
        key = self._keys.pending_note(self.job_id, node)
        if note is None:
            await self._run(lambda: self._kv.delete(key))
        else:
            await self._run(lambda: self._kv.put_json(key, note, lease))


class EtcdJobStore(KVJobStore):
    """Against etcd: each call blocks on the network, so it runs in a worker thread."""

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)


class InlineJobStore(KVJobStore):
    """Calls run inline, never suspending: against ``MemoryKV`` (deterministic tests), or from a
    thread of the caller's own (drive it with ``run_inline``)."""

    async def _run(self, fn: Callable[[], T]) -> T:
        return fn()


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine of an ``InlineJobStore``, which completes without suspending."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coro.close()
    raise RuntimeError("the coroutine suspended: only InlineJobStore calls can be run inline")

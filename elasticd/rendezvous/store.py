"""A job's state in the key-value store: one consistent snapshot per read, and the writes that
change it, behind the async ``JobStore`` protocol.

Reads are a single request over ``jobs/<job>/`` and the job's parts ``parts/<job>/`` (its joins
and pending notes), at one revision, so a snapshot is never torn; with the rounds' assignments
(``rounds/<job>/``: every one, or a member's own), in the same request. The nodes' statuses
(``reports/<job>/``: what ``status`` shows, no decider reads them) follow in pages
(``reportread``).
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
from dataclasses import asdict, replace
from typing import Any, TypeVar, cast

from elasticd.decode import DecodeError, parse_json
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV, prefix_end
from elasticd.etcd.pages import read_pages
from elasticd.etcd.types import Compare, Put, Query
from elasticd.rendezvous import leadership, reportread, roster, rosterread
from elasticd.rendezvous.glance import Glance, Seen
from elasticd.rendezvous.model import (
    DrainRecord,
    FinalRecord,
    Join,
    Member,
    NodeStatus,
    RoundHead,
    RoundInfo,
    RoundResult,
)
from elasticd.rendezvous.snapshot import InvalidKey, JobSnapshot
from elasticd.terms.head import JobHead, body_bytes, check_body
from elasticd.terms.spec import MAX_NODES, JobSpec
from elasticd.terms.state import EndReason, JobState, RoundReason

T = TypeVar("T")
READ_TRIES = 3  # a member's read finds the round closed at another round than it asked for
JOIN_PAGE = 500  # keys per request when a round's are read for one job (``round_parts``)
MAX_JOINS = 2 * MAX_NODES + 1024  # joins and done markers of one round such a read takes (a bound)


class KVJobStore:
    """``JobStore`` over any ``KV``; subclasses say how a blocking call is run."""

    def __init__(self, kv: KV, keys: Keys, job_id: str) -> None:
        self._kv = kv
        self._keys = keys
        self.job_id = job_id
        # The job's head's create revision as a read last found it (0: none found yet): a status
        # is put only while that head is there (``put_node_status``).
        self._head_revision = 0

    @property
    def keys(self) -> Keys:
        return self._keys

    async def _run(self, fn: Callable[[], T]) -> T:
        raise NotImplementedError

    # -- reads ---------------------------------------------------------------------------------
    async def snapshot(
        self,
        joins_counted_of: int | None = None,
        statuses: bool = True,
        *,
        node: str = "",
        rosters: bool = True,
    ) -> JobSnapshot:
        """The whole job; with ``joins_counted_of=r``, round r's join keys are only counted
        (a running member needs how many are left, not N records: O(1) instead of O(N)); with
        ``statuses=False``, its nodes' statuses and pending notes are left out (what ``status``
        shows, which no decider reads: an agent's read carries O(N) records fewer; with them, the
        statuses are read after the rest, in pages: ``reportread``); with
        ``rosters=False``, no round's assignments but ``node``'s own of the current round (a
        member's read: O(1) bytes, whatever the job's size)."""
        snap = await self._run(lambda: self._member_snapshot(joins_counted_of, statuses, node, rosters))
        return reportread.with_reports(snap, await self.statuses()) if statuses else snap

    async def statuses(self) -> dict[str, NodeStatus]:
        """Each node's status in the job (``reports/<job>/``), read in pages (``reportread``)."""
        reports = await self._run(lambda: reportread.read_reports(self._kv, self._keys, self.job_id))
        return reportread.statuses(self._keys, self.job_id, reports)

    async def node_status(self, node: str) -> NodeStatus | None:
        """``node``'s report alone (one key), None when there is none or it does not decode."""
        kv = await self._run(lambda: self._kv.get(self._keys.node_status(self.job_id, node)))
        return reportread.statuses(self._keys, self.job_id, [kv] if kv is not None else []).get(node)

    def _member_snapshot(
        self, counted_of: int | None, statuses: bool, node: str, rosters: bool
    ) -> JobSnapshot:
        """One read; a member's read that finds another round closed than it asked for
        (``counted_of``) reads again for that round's own assignment (the round moved meanwhile)."""
        hint = counted_of
        for _ in range(READ_TRIES):
            snap = self._snapshot(counted_of, statuses, node, rosters, hint)
            closed = snap.closed
            if rosters or not node or closed is None or closed.round == hint:
                return snap
            hint = closed.round
        raise EtcdUnavailable(f"job {self.job_id}'s round moved {READ_TRIES} times while it was read")

    def _snapshot(
        self, counted_of: int | None, statuses: bool, node: str, rosters: bool, hint: int | None
    ) -> JobSnapshot:
        k, j = self._keys, self.job_id
        start, end = k.job_joins(j)
        ranges = [(start, end)]
        counted = k.joins(j, counted_of) if counted_of is not None else None
        if counted is not None:  # all but round r's joins, which are counted
            ranges = [(start, counted), (prefix_end(counted), end)]
        # A member's read of its own assignment follows the round's head it was told of (a
        # glance, a watch event) from the same etcd member: served from what that member
        # applied (``Query.serializable``), it is no older than the head; etcd then skips the
        # round trip to its leader for every member of a closing round at once.
        member = not rosters and bool(node) and hint is not None
        queries = [Query(k.job(j), prefix=True, serializable=member)]
        queries += [Query(a, end=b, serializable=member) for a, b in ranges]
        if statuses:
            queries.append(Query(k.job_notes(j), prefix=True, serializable=member))
        if member and hint is not None:
            queries.append(Query(k.assignment(j, hint, node), serializable=True))
        read = len(queries)
        if counted is not None:
            queries.append(Query(counted, prefix=True, count_only=True, serializable=member))
        found = self._kv.read_many(queries)
        kvs = [kv for f in found[:read] for kv in f.kvs]
        head = next((kv.create_revision for kv in found[0].kvs if kv.key == k.job_spec(j)), 0)
        self._head_revision = head or self._head_revision  # (gone: the guard fails on the old one)
        mine = node if not rosters and hint is not None else ""
        snap = JobSnapshot.parse(k, j, kvs, node=mine)
        if counted_of is not None:
            snap.join_counts[counted_of] = found[-1].count
        return self._with_rosters(snap) if rosters else snap

    def _with_rosters(self, snap: JobSnapshot) -> JobSnapshot:
        """``snap`` with each closed round it names read whole, in pages (``rosterread``): what a
        round's leader and a node outside the round need, with no response that grows with the
        round. A round forgotten while it was read (a newer one closed) is left out."""
        for head in list(snap.heads.values()):
            roster = rosterread.read_round(self._kv, self._keys, self.job_id, head)
            snap = rosterread.with_round(snap, head, roster)
        return replace(snap, rosters=True)

    async def glance(self, round_no: int, node: str) -> Glance:
        """The small read of a node waiting in an open round (``leadership.glance``)."""
        return await self._run(lambda: leadership.glance(self._kv, self._keys, self.job_id, round_no, node))

    async def count_joins(self, round_no: int) -> int:
        """How many joins round ``round_no`` has (O(1) bytes, whatever N)."""
        query = Query(self._keys.joins(self.job_id, round_no), prefix=True, count_only=True)
        return (await self._run(lambda: self._kv.read_many([query])))[0].count

    async def round_parts(self, round_no: int) -> JobSnapshot:
        """Round ``round_no``'s joins and done markers alone, read in pages, as a snapshot of them
        (``joins``, ``done``, and each bad one in ``invalid``): for what shows them (``status
        <job>``)."""
        prefix = self._keys.round_parts(self.job_id, round_no)
        kvs = await self._run(lambda: read_pages(self._kv, prefix, JOIN_PAGE, MAX_JOINS))
        return JobSnapshot.parse(self._keys, self.job_id, kvs)

    async def members(self, head: RoundHead) -> tuple[Member, ...] | None:
        """``head``'s round's members, read in pages (``rosterread``); None when the round was
        forgotten meanwhile or an assignment is bad (the job's next full read reports it)."""
        found = await self._run(lambda: rosterread.read_round(self._kv, self._keys, self.job_id, head))
        return found.members if isinstance(found, RoundResult) else None

    async def join_of(self, round_no: int, node: str) -> Join | None:
        kv = await self._run(lambda: self._kv.get(self._keys.join(self.job_id, round_no, node)))
        try:
            return Join.from_json(parse_json(kv.value), kv.create_revision, kv.lease) if kv else None
        except DecodeError:  # the job's next full read reports it
            return None

    # -- creation and the end ------------------------------------------------------------------
    async def create(self, spec: JobSpec) -> bool:
        """Create the job: its head, its full spec and its first records, in one transaction."""
        k, j = self._keys, spec.id
        info = RoundInfo(0, RoundReason.START, time.time())
        body = spec.to_json()
        puts = [
            Put(k.job_body(j), body),
            Put(k.job_spec(j), JobHead.of(spec, len(body_bytes(spec))).to_json()),
            Put(k.job_round(j), info.to_json()),
            Put(k.job_restarts(j), 0),
        ]
        return await self._run(lambda: self._kv.txn([Compare(k.job_spec(j), "create", 0)], puts))

    async def spec(self, head: JobHead) -> JobSpec:
        """The job's full spec (``specs/<job>``), for a node about to take part: DecodeError when
        it is missing, not a spec, or disagrees with ``head`` (``check_body``)."""
        kv = await self._run(lambda: self._kv.get(self._keys.job_body(self.job_id)))
        return check_body(head, kv.value if kv is not None else None)

    async def finalize(
        self, state: JobState, code: EndReason, reason: str, failure: dict[str, Any] | None = None
    ) -> bool:
        """End the job once; the first caller wins and later ones change nothing."""
        final = FinalRecord(state, reason, code, failure, time.time())
        key = self._keys.job_final(self.job_id)
        return await self._run(lambda: self._kv.txn([Compare(key, "create", 0)], [Put(key, final.to_json())]))

    async def fail_invalid(self, snap: JobSnapshot) -> bool:
        """End a job that has an invalid record FAILED, naming the (first) bad key. A bad ``final``
        itself is replaced instead. True if this call wrote the final record."""
        bad_final = snap.final_invalid
        if bad_final is not None:
            return await self._replace_final(bad_final, bad_final.describe())
        return await self.finalize(JobState.FAILED, EndReason.INVALID_RECORD, snap.invalid[0].describe())

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

    async def watch_joins(
        self, round_no: int, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        """Watch round ``round_no``'s joins (what its leader needs, and no other node watches):
        ``KV.watch_prefix``'s callbacks, from another thread. Returns the cancel function."""
        prefix = self._keys.joins(self.job_id, round_no)
        return await self._run(lambda: self._kv.watch_prefix(prefix, on_change, on_broken))

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

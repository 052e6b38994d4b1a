"""Making room for a waiting job of a higher priority: the janitor carries ``jobs.room`` out.

One node decides for the cluster (the janitor: ``Janitor.elected``), over the read of every job
the scan already made; only when some job waits with a priority above a running elastic job that
may lend (``room.worth_asking``) does it read more: the live nodes' records (one request: each
node's free slots and the jobs it runs). Each lend is the drain record ``drain NODE --job JOB``
writes, with ``by`` naming the job it was lent to (``room.room_by``); each give-back deletes it.
Both are single keys, so a janitor that dies between two of them leaves records that the next one
reads back as what is already lent (``room.decide`` counts them): no state but etcd's.

When a job last lent a node is taken from its lend records (their ``at``) and from this node's
memory of the lends it wrote, so a job that grew back is not shrunk again within the interval
while this node stays the janitor (a new janitor starts from the records alone).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict

from elasticd import log
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.happenings.bus import publish
from elasticd.happenings.records import NodeDrained, NodeUndrained
from elasticd.jobs import room
from elasticd.jobs.ticket import JobTicket
from elasticd.node.registry import NodeRecord
from elasticd.rendezvous.jobread import JobRead
from elasticd.rendezvous.model import DrainRecord
from elasticd.terms.state import JobState

_log = log.get("elasticd.janitor")


def lends(reads: Mapping[str, JobRead]) -> list[tuple[room.Lent, float]]:
    """Every node lent now, with when, from the jobs' drain records."""
    out = []
    for job_id, read in reads.items():
        for node, record in read.drains.items():
            if (for_job := room.lent_for(record.by)) is not None:
                out.append((room.Lent(job_id, node, for_job), record.at))
    return out


def waiting_of(order: Sequence[JobTicket], reads: Mapping[str, JobRead]) -> list[room.Waiting]:
    """The jobs that never ran, in queue order, as ``room.decide`` sees them."""
    out = []
    for t in order:
        head = reads[t.id].head if t.id in reads else None
        if head is not None and t.state is JobState.PENDING:
            out.append(room.Waiting(t.id, t.priority, head.nnodes.min, head.nproc_per_node, head.nodes))
    return out


def running_of(
    tickets: Sequence[JobTicket],
    reads: Mapping[str, JobRead],
    members: Mapping[str, list[str]],
    shrunk: Mapping[str, float],
    lent: Sequence[tuple[room.Lent, float]],
) -> list[room.Running]:
    """The running jobs, as ``room.decide`` sees them (``members``: the nodes running each)."""
    out = []
    for t in tickets:
        read = reads.get(t.id)
        head, closed = (read.head, read.closed) if read is not None else (None, None)
        if head is None or closed is None or t.state is not JobState.RUNNING:
            continue
        times = [at for x, at in lent if x.job == t.id] + ([shrunk[t.id]] if t.id in shrunk else [])
        out.append(
            room.Running(
                t.id, t.priority, head.nnodes.min, closed.size, head.nproc_per_node, head.yields,
                head.submitted_at, tuple(sorted(members.get(t.id, ()))), max(times, default=None),
                frozenset(x.for_job for x, _ in lent if x.job == t.id),
            )
        )  # fmt: skip
    return out


class RoomMaker:
    """Lends and gives back nodes for the queue (module doc), on the janitor's scan."""

    def __init__(
        self,
        kv: KV,
        keys: Keys,
        records: Callable[[], list[NodeRecord]],
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kv = kv
        self._keys = keys
        self._records = records  # the live nodes' records (blocking: called in a thread)
        self._interval_s = interval_s
        self._clock = clock
        self._shrunk: dict[str, float] = {}  # job -> when this node last lent a node of it

    async def make(
        self,
        reads: Mapping[str, JobRead],
        tickets: Sequence[JobTicket],
        order: Sequence[JobTicket],
        failed: Collection[str] = (),
    ) -> room.Room:
        """Decide over one read of every job (``order``: the queue's; ``failed``: the jobs the
        scan failed for the limits, left out), and carry the decision out."""
        self._shrunk = {j: at for j, at in self._shrunk.items() if j in reads}
        lent = lends(reads)
        waiting = waiting_of([t for t in order if t.id not in failed], reads)
        optimistic = running_of(tickets, reads, {}, self._shrunk, lent)
        records: list[NodeRecord] = []  # none: only the give-backs, which need no node
        if room.worth_asking(waiting, optimistic):
            records = await asyncio.to_thread(self._records)
        elif not lent:
            return room.NOTHING
        members: dict[str, list[str]] = {}
        for r in records:
            for job in r.jobs:
                members.setdefault(job, []).append(r.node)
        running = running_of(tickets, reads, members, self._shrunk, lent)
        nodes = [room.NodeRoom(r.node, r.free_slots, r.draining) for r in records]
        alive = {t.id for t in tickets}
        now = self._clock()
        decided = room.decide(waiting, running, nodes, [x for x, _ in lent], alive, now, self._interval_s)
        await self._carry_out(decided, now)
        return decided

    async def _carry_out(self, decided: room.Room, now: float) -> None:
        for back in decided.returns:
            if await asyncio.to_thread(self._kv.delete, self._keys.job_drain(back.job, back.node)):
                _log.info("room.given_back", job=back.job, node=back.node, lent_to=back.for_job)
                publish(NodeUndrained(back.node, back.job, room.room_by(back.for_job)))
        for shrink in decided.shrinks:
            by = room.room_by(shrink.for_job)
            record = DrainRecord(None, now, by)
            key = self._keys.job_drain(shrink.job, shrink.node)
            await asyncio.to_thread(self._kv.put_json, key, asdict(record))
            self._shrunk[shrink.job] = now
            _log.info("room.lent", job=shrink.job, node=shrink.node, lent_to=shrink.for_job)
            publish(NodeDrained(shrink.node, shrink.job, None, by, (shrink.job,), False))
        if decided.shrinks:
            _log.warning("room.shrunk", why=decided.reason)

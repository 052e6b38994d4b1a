"""What the scan and ``status`` derive from one read of every job, made once per read.

The scan and ``status`` both work from the read of every job that ``manager/jobsread.py`` holds,
which hands out the same ``JobSnapshot`` object for a job while its keys are unchanged, and the
same mapping while nothing changed at all. So ``Board`` makes:

- each job's ticket (``jobs.ticket``) once per snapshot: after one change, one ticket, not one
  per queued job;
- the fair queue's order (``jobs.queue``), the admission order and each waiting job's place once
  per read and per this node's admissions (``Turns.admissions``, the only other input): the scan
  that a change wakes, the submit's own scan and every ``status`` after it share them.

A read's mapping and snapshots are shared by everyone given them: no one changes them. Pure: no
I/O and no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elasticd.jobs.queue import (
    QueuePlace,
    Reason,
    Turns,
    held_slots,
    queue_order,
    reasons,
    started_first,
    why,
)
from elasticd.jobs.room import Lent, lent_for, making
from elasticd.jobs.ticket import JobTicket, ticket_of
from elasticd.rendezvous.snapshot import JobSnapshot


@dataclass
class Queue:
    """One read's queue, as this node orders it: built on demand, then kept with the read."""

    order: Sequence[JobTicket]  # the waiting jobs, in queue order
    tickets: Sequence[JobTicket]
    last: Mapping[int, int]
    making: Mapping[str, str] = field(default_factory=dict)  # shrunk for a job (``room.making``)
    _admission: list[str] | None = None
    _ranked: list[tuple[str, Reason]] | None = None
    _index: dict[str, int] | None = field(default=None)

    @property
    def admission(self) -> list[str]:
        """Every job a node may join, by id, in the order it considers them (``admission_order``)."""
        if self._admission is None:
            self._admission = started_first(self.tickets, self.order)
        return self._admission

    @property
    def ranked(self) -> list[tuple[str, Reason]]:
        """Each waiting job in queue order, with its place's reason (``queue.reasons``)."""
        if self._ranked is None:
            self._ranked = reasons(self.order, held_slots(self.tickets), self.last, self.making)
        return self._ranked

    def place(self, job_id: str) -> QueuePlace | None:
        """A waiting job's place (None: the job does not wait)."""
        if self._index is None:
            self._index = {job: i for i, (job, _) in enumerate(self.ranked)}
        i = self._index.get(job_id)
        if i is None:
            return None
        return QueuePlace(i + 1, len(self.ranked), why(self.ranked[i][1]))


class Board:
    """Tickets and the queue of the latest read of every job (module doc). Keeps only what the
    latest read holds: its jobs' tickets and one queue."""

    def __init__(self, turns: Turns) -> None:
        self._turns = turns
        self._tickets: dict[str, tuple[JobSnapshot, JobTicket | None]] = {}
        self._read: tuple[Mapping[str, JobSnapshot], Sequence[JobTicket]] | None = None
        self._queue: tuple[Mapping[str, JobSnapshot], int, Queue] | None = None
        self.tickets_made = 0  # tickets built (not found here): what the tests count
        self.queues_made = 0  # queue orders computed: what the tests count

    def tickets(self, snaps: Mapping[str, JobSnapshot]) -> Sequence[JobTicket]:
        """``tickets_of(snaps.values())``: the tickets of the jobs that have not ended, in
        ``snaps``' order, each made again only for a snapshot not seen in the last read."""
        if self._read is not None and self._read[0] is snaps:
            return self._read[1]
        kept: dict[str, tuple[JobSnapshot, JobTicket | None]] = {}
        for job_id, snap in snaps.items():
            held = self._tickets.get(job_id)
            if held is None or held[0] is not snap:
                held = (snap, ticket_of(snap))
                self.tickets_made += 1
            kept[job_id] = held
        self._tickets = kept
        tickets = tuple(t for _, t in kept.values() if t is not None)
        self._read = (snaps, tickets)
        return tickets

    def queue(self, snaps: Mapping[str, JobSnapshot]) -> Queue:
        """The read's queue as this node orders it now (once per read and admission count)."""
        admissions = self._turns.admissions
        held = self._queue
        if held is not None and held[0] is snaps and held[1] == admissions:
            return held[2]
        tickets = self.tickets(snaps)
        last = dict(self._turns.last)  # as of now: later admissions make a new queue
        queue = Queue(queue_order(tickets, last), tickets, last, making(lent(snaps)))
        self.queues_made += 1
        self._queue = (snaps, admissions, queue)
        return queue


def lent(snaps: Mapping[str, JobSnapshot]) -> list[Lent]:
    """Every node lent to a waiting job now (``jobs.room``), from the jobs' drain records."""
    return [
        Lent(job_id, node, for_job)
        for job_id, snap in snaps.items()
        for node, record in snap.drains.items()
        if (for_job := lent_for(record.by)) is not None
    ]

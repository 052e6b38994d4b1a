"""The queue of every job as this node orders it, made from one read of every job.

The scan considers the jobs in its admission order, and ``status`` shows each waiting job's
place: both from ``queue`` of the same read, which the copy of every job makes once per change
of it and of this node's admissions (``manager/clustercopy.py``), each job's ticket once per
read of the job. Pure: no I/O and no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from elasticd.jobs.queue import (
    QueuePlace,
    Reason,
    held_slots,
    queue_order,
    reasons,
    started_first,
    why,
)
from elasticd.jobs.room import Lent, lent_for, making
from elasticd.jobs.ticket import JobTicket
from elasticd.rendezvous.jobread import JobRead


@dataclass(frozen=True)
class Queue:
    """One read's queue, as this node orders it (``queue``). Each of its parts is computed when
    first asked for: the scan asks for the admission order, ``status`` for the places."""

    order: tuple[JobTicket, ...]  # the waiting jobs, in queue order
    tickets: Sequence[JobTicket]  # every job that has not ended
    last: Mapping[int, int]  # when this node last admitted each user's job (``Turns.last``)
    making: Mapping[str, str]  # what is shrunk to make room for a job, by its id (``room.making``)

    @cached_property
    def admission(self) -> tuple[str, ...]:
        """Every job a node may join, by id, in the order it considers them (``admission_order``)."""
        return tuple(started_first(self.tickets, self.order))

    @cached_property
    def ranked(self) -> tuple[tuple[str, Reason], ...]:
        """Each waiting job in queue order, with its place's reason (``queue.reasons``)."""
        return tuple(reasons(self.order, held_slots(self.tickets), self.last, self.making))

    @cached_property
    def places(self) -> dict[str, int]:
        """Each waiting job's place (from 1), by id."""
        return {job: i for i, (job, _) in enumerate(self.ranked, 1)}

    def place(self, job_id: str) -> QueuePlace | None:
        """A waiting job's place (None: the job does not wait)."""
        i = self.places.get(job_id)
        if i is None:
            return None
        return QueuePlace(i, len(self.ranked), why(self.ranked[i - 1][1]))


def queue(reads: Mapping[str, JobRead], tickets: Sequence[JobTicket], last: Mapping[int, int]) -> Queue:
    """The queue of ``reads``, whose jobs that have not ended have ``tickets``; ``last``: when this
    node last admitted each user's job (``Turns.last``)."""
    return Queue(tuple(queue_order(tickets, last)), tickets, last, making(lent(reads)))


def lent(reads: Mapping[str, JobRead]) -> list[Lent]:
    """Every node lent to a waiting job now (``jobs.room``), from the jobs' drain records."""
    return [
        Lent(job_id, node, for_job)
        for job_id, read in reads.items()
        for node, record in read.drains.items()
        if (for_job := lent_for(record.by)) is not None
    ]

"""What the per-user limits and the fair queue need to know of a job, and the one adapter to it.

``JobTicket`` is a small frozen record: who submitted the job, when, at which priority, how large
its stored spec is, its state, the slots it wants and the slots it holds now. The pure rules
(``jobs.quota``: which jobs to fail; ``jobs.queue``: the admission order) work on tickets only,
never on reads or specs, so that where a job's records live in etcd matters to one function
here (``ticket_of``) and to nothing else. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from elasticd.jobs.view import job_state
from elasticd.rendezvous.jobread import JobRead
from elasticd.terms.state import JobState


@dataclass(frozen=True)
class JobTicket:
    """One job that has not ended, as the limits and the queue see it."""

    id: str
    user: str
    uid: int
    submitted_at: float
    priority: int
    spec_bytes: int  # the stored size of the job's spec, in bytes (the JSON etcd holds)
    state: JobState  # PENDING (never ran), RUNNING or RESTARTING
    slots: int = 1  # what it needs to start: MIN nodes x processes per node
    held: int = 0  # what it holds now: its running round's world size (0 unless RUNNING)

    @property
    def started(self) -> bool:
        """It ran (or runs): admitted once, so never held back or failed by a limit again."""
        return self.state is not JobState.PENDING


def ticket_of(read: JobRead) -> JobTicket | None:
    """The job's ticket; None for a job that has ended (or has a record nothing can be built on),
    and for one whose head is unreadable (the janitor fails those)."""
    head = read.head
    if head is None or read.ended:
        return None
    state = job_state(read)
    closed = read.closed
    return JobTicket(
        id=read.job_id,
        user=head.user,
        uid=head.uid,
        submitted_at=head.submitted_at,
        priority=head.priority,
        spec_bytes=head.spec_bytes,
        state=state,
        slots=head.nnodes.min * head.nproc_per_node,
        held=closed.world_size if state is JobState.RUNNING and closed is not None else 0,
    )


def tickets_of(reads: Iterable[JobRead]) -> list[JobTicket]:
    """The tickets of every job that has not ended."""
    return [t for t in map(ticket_of, reads) if t is not None]

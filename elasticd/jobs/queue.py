"""The fair queue: in which order a node considers the jobs waiting to start.

Order (``queue_order``), over the jobs that never ran (PENDING):

1. **Priority**, higher first (``--priority``: root and admins only, ``manager.access``).
2. **Users take turns** within one priority: each user's first waiting job, then each user's
   second, and so on (round-robin by user). In each turn, users holding fewer slots now (their
   running jobs' world sizes) go first, then the user whose oldest job waits longest, then uid.
3. **Submission time** within one user's jobs (then id, so that every node orders alike).

Why round-robin and not fair share by slots held: the issue's promise is a bound on waiting,
"another user's job waits for at most one admission", whatever one user has queued. Round-robin
keeps it for every job size: a user's k-th waiting job has at most k jobs of any other user of
its priority ahead of it. Ordering strictly by slots held (fair share) would put a user who holds
64 slots behind 64 one-slot jobs of someone holding none. Slots held still count, as the
tie-break inside each turn, so a user who holds little is served first when turns are equal.

Jobs that already ran (RUNNING: a node may join for scale-up; RESTARTING: waiting for its nodes)
are not queued: they were admitted once, and come before every waiting job
(``admission_order``), oldest first, so a restart is not starved by new work.

This is the order one node's scan considers jobs in (a job that does not fit this node's free
slots is passed over for the next: backfill), and what ``status`` shows as a waiting job's place
(``places``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import zip_longest

from elasticd.jobs.ticket import JobTicket


@dataclass(frozen=True)
class QueuePlace:
    """A waiting job's place in the queue (1-based) of ``of`` waiting jobs, and why it is there."""

    place: int
    of: int
    why: str

    def to_json(self) -> dict[str, int | str]:
        return {"place": self.place, "of": self.of, "why": self.why}


def _submission(t: JobTicket) -> tuple[float, str]:
    return (t.submitted_at, t.id)


def held_slots(tickets: Iterable[JobTicket]) -> dict[int, int]:
    """Slots each user's jobs hold now, by uid."""
    held: dict[int, int] = {}
    for t in tickets:
        held[t.uid] = held.get(t.uid, 0) + t.held
    return held


def queue_order(tickets: Iterable[JobTicket]) -> list[JobTicket]:
    """The waiting jobs (never ran) in the order they are considered (module doc)."""
    every = list(tickets)
    held = held_slots(every)
    by_priority: dict[int, dict[int, list[JobTicket]]] = {}
    for t in sorted((t for t in every if not t.started), key=_submission):
        by_priority.setdefault(t.priority, {}).setdefault(t.uid, []).append(t)
    order: list[JobTicket] = []
    for priority in sorted(by_priority, reverse=True):
        users = by_priority[priority]
        turn = sorted(users, key=lambda uid: (held.get(uid, 0), _submission(users[uid][0]), uid))
        for round_ in zip_longest(*(users[uid] for uid in turn)):
            order.extend(t for t in round_ if t is not None)
    return order


def admission_order(tickets: Iterable[JobTicket]) -> list[str]:
    """Every job a node may join, by id: those that ran first (oldest first), then the queue."""
    every = list(tickets)
    started = sorted((t for t in every if t.started), key=_submission)
    return [t.id for t in started] + [t.id for t in queue_order(every)]


def places(tickets: Iterable[JobTicket]) -> dict[str, QueuePlace]:
    """Each waiting job's place in the queue, and why, by id."""
    every = list(tickets)
    held = held_slots(every)
    order = queue_order(every)
    higher: dict[int, int] = {}  # priority -> waiting jobs of a higher priority
    for i, t in enumerate(order):  # the order is by priority first
        higher.setdefault(t.priority, i)
    turns: dict[tuple[int, int], int] = {}  # (priority, uid) -> jobs of that user seen so far
    out: dict[str, QueuePlace] = {}
    for i, t in enumerate(order, 1):
        k = turns[(t.priority, t.uid)] = turns.get((t.priority, t.uid), 0) + 1
        why = [f"priority {t.priority}"]
        if higher[t.priority]:
            why.append(f"{higher[t.priority]} waiting job(s) of higher priority first")
        why.append(
            f"{t.user}'s waiting job {k}, in turn {k}: users take turns, one job each, "
            f"those holding fewer slots first ({t.user} holds {held.get(t.uid, 0)})"
        )
        out[t.id] = QueuePlace(i, len(order), "; ".join(why))
    return out

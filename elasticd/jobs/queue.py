"""The fair queue: in which order a node considers the jobs waiting to start.

Order (``queue_order``), over the jobs that never ran (PENDING):

1. **Priority**, higher first (``--priority``: root and admins only, ``manager.access``).
2. **Users take turns** within one priority (round-robin by user): each user's first waiting
   job, then each user's second, and so on. The turn goes first to the user this node admitted
   a job of *least recently* (``Turns``; never: first of all), then to the user holding fewer
   slots now (their running jobs' world sizes: what decides on a node that just started, and
   between users this node never admitted), then to the user whose oldest job waits longest.
3. **Submission time** within one user's jobs (then id).

Why round-robin, and why "least recently admitted" leads it: the promise is a bound on waiting,
"another user's job waits for at most one admission", whatever one user queued and whatever
anyone holds. Within one ordering, round-robin gives a user's k-th waiting job at most k jobs of
any other user of its priority ahead of it. Across admissions, the user just admitted goes to
the back of the next turn, so a waiting user is next after at most one admission of anyone
else's. Fair share by slots held alone would not bound it: a user who holds 64 slots would wait
behind 64 one-slot jobs of someone holding none. Slots held still break ties, so a user who holds
little is served first among users alike otherwise.

Jobs that already ran (RUNNING: a node may join for scale-up; RESTARTING: waiting for its nodes)
are not queued: they were admitted once, and come before every waiting job
(``admission_order``), oldest first, so a restart is not starved by new work.

Each node keeps its own ``Turns`` (what it admitted); a job another node could take is still
next there after at most one of that node's admissions, and the slots held (the same for every
node, from etcd) order users alike on nodes that admitted none of theirs. A job that does not
fit a node's free slots is passed over for the next (backfill). ``status`` shows a waiting job's
place in the order of the node asked (``places``). Pure: no I/O and no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import zip_longest

from elasticd.jobs.ticket import JobTicket

MAX_TURNS = 4096  # users whose last admission a node remembers (the least recent are forgotten)
NEVER = -1

# What a waiting job's ``why`` says, as values (``why``): its priority, how many waiting jobs of a
# higher priority come first, its user, which of that user's waiting jobs it is, the slots the
# user holds, whether this node admitted a job of theirs lately, and what is shrunk to make room
# for it ("": nothing, ``jobs.room.making``). Most of a queue's places keep theirs when one job
# comes or goes (its place and ``of`` move): the text is made once.
Reason = tuple[int, int, str, int, int, bool, str]


@dataclass(frozen=True)
class QueuePlace:
    """A waiting job's place in the queue (1-based) of ``of`` waiting jobs, and why it is there."""

    place: int
    of: int
    why: str

    def to_json(self) -> dict[str, int | str]:
        return {"place": self.place, "of": self.of, "why": self.why}


class Turns:
    """When this node last admitted a job of each user, as a count of its admissions (bounded:
    past ``max_users`` the least recently admitted user is forgotten, and comes first again)."""

    def __init__(self, max_users: int = MAX_TURNS) -> None:
        self._last: dict[int, int] = {}  # uid -> admission number, least recent first
        self._count = 0
        self._max = max_users

    @property
    def last(self) -> Mapping[int, int]:
        return self._last

    @property
    def admissions(self) -> int:
        """How many admissions this node made: the queue's order moves only when this does (or
        when the jobs do)."""
        return self._count

    def admitted(self, uid: int) -> None:
        self._count += 1
        self._last.pop(uid, None)
        self._last[uid] = self._count
        while len(self._last) > self._max:
            del self._last[next(iter(self._last))]


def _submission(t: JobTicket) -> tuple[float, str]:
    return (t.submitted_at, t.id)


def held_slots(tickets: Iterable[JobTicket]) -> dict[int, int]:
    """Slots each user's jobs hold now, by uid."""
    held: dict[int, int] = {}
    for t in tickets:
        held[t.uid] = held.get(t.uid, 0) + t.held
    return held


def queue_order(tickets: Iterable[JobTicket], last: Mapping[int, int] | None = None) -> list[JobTicket]:
    """The waiting jobs (never ran) in the order they are considered (module doc); ``last``:
    when this node last admitted each user's job (``Turns.last``)."""
    every = list(tickets)
    last = last or {}
    held = held_slots(every)
    by_priority: dict[int, dict[int, list[JobTicket]]] = {}
    for t in sorted((t for t in every if not t.started), key=_submission):
        by_priority.setdefault(t.priority, {}).setdefault(t.uid, []).append(t)
    order: list[JobTicket] = []
    for priority in sorted(by_priority, reverse=True):
        users = by_priority[priority]

        def turn(
            uid: int, users: dict[int, list[JobTicket]] = users
        ) -> tuple[int, int, tuple[float, str], int]:
            return (last.get(uid, NEVER), held.get(uid, 0), _submission(users[uid][0]), uid)

        for round_ in zip_longest(*(users[uid] for uid in sorted(users, key=turn))):
            order.extend(t for t in round_ if t is not None)
    return order


def admission_order(tickets: Iterable[JobTicket], last: Mapping[int, int] | None = None) -> list[str]:
    """Every job a node may join, by id: those that ran first (oldest first), then the queue."""
    every = list(tickets)
    return started_first(every, queue_order(every, last))


def started_first(tickets: Iterable[JobTicket], order: Sequence[JobTicket]) -> list[str]:
    """``admission_order`` of ``tickets``, given their queue order (``queue_order``)."""
    started = sorted((t for t in tickets if t.started), key=_submission)
    return [t.id for t in started] + [t.id for t in order]


def reasons(
    order: Sequence[JobTicket],
    held: Mapping[int, int],
    last: Mapping[int, int] | None = None,
    making: Mapping[str, str] | None = None,
) -> list[tuple[str, Reason]]:
    """Each waiting job's id, in queue ``order`` (``queue_order``), with what its place's ``why``
    says (``held``: ``held_slots`` of every job; ``last``: as for ``queue_order``; ``making``: what
    is shrunk to make room for a job, by its id: ``jobs.room.making``)."""
    last, making = last or {}, making or {}
    higher: dict[int, int] = {}  # priority -> waiting jobs of a higher priority
    turns: dict[tuple[int, int], int] = {}  # (priority, uid) -> jobs of that user seen so far
    out: list[tuple[str, Reason]] = []
    for i, t in enumerate(order):  # the order is by priority first
        first = higher.setdefault(t.priority, i)
        k = turns[(t.priority, t.uid)] = turns.get((t.priority, t.uid), 0) + 1
        reason = (t.priority, first, t.user, k, held.get(t.uid, 0), t.uid in last, making.get(t.id, ""))
        out.append((t.id, reason))
    return out


@lru_cache(maxsize=MAX_TURNS)
def why(reason: Reason) -> str:
    """The text of a place's reason (``reasons``)."""
    priority, higher, user, k, held, lately, room = reason
    said = [f"priority {priority}"]
    if room:  # first: the nodes it will start on are on their way, it does not just wait
        said.append(room)
    if higher:
        said.append(f"{higher} waiting job(s) of higher priority first")
    had = ", had a job admitted here lately" if lately else ""
    said.append(
        f"{user}'s waiting job {k}: users take turns, one job each, whoever was admitted "
        f"least recently first ({user} holds {held} slots{had})"
    )
    return "; ".join(said)


def places(tickets: Iterable[JobTicket], last: Mapping[int, int] | None = None) -> dict[str, QueuePlace]:
    """Each waiting job's place in the queue, and why, by id."""
    every = list(tickets)
    ranked = reasons(queue_order(every, last), held_slots(every), last)
    return {job: QueuePlace(i, len(ranked), why(r)) for i, (job, r) in enumerate(ranked, 1)}

"""Making room: which nodes running elastic jobs lend to a waiting job of a higher priority (pure).

A job submitted with ``--nnodes MIN:MAX`` holds every node it can, up to MAX. Without this rule
a job of a higher priority that finds no free node waits at the head of the queue until one of
them ends. Here, the janitor (one node: ``manager/room.py`` carries this out) lends it nodes those
jobs hold above their MIN, by the graceful drain an operator's ``drain NODE --job JOB`` writes:
the node leaves at a step boundary, no step is lost and no restart is spent. The drain record says
whom the node was lent to (``room_by``), so ``status`` can tell why the job shrank, and so that
the lender gets the node back (the record deleted: ``GiveBack``) once the borrower has ended; the
lender then grows back at its next round like any running job below MAX, which a node considers
before every waiting job (``queue.admission_order``).

The decision (``decide``), over the first waiting job in queue order that free nodes cannot start:

- only jobs that allow it (``--yield``, the default; ``--no-yield``: never), of a lower priority,
  above their MIN, and not shrunk within the interval (a daemon setting: a job is not made to
  shrink again and again for a stream of high-priority jobs) lend nodes; never below MIN;
- the lowest priority lends first, then the job with the most nodes above its MIN, then the
  youngest (the one that loses the least work it has not checkpointed), then by id and node;
- all or nothing: nodes are taken only when they are enough for the waiting job's MIN with the
  free ones, so no job shrinks for a job that still could not start;
- what was already lent to it counts as its own, so a decision made again (a later scan, a new
  janitor after a crash mid-shrink) takes only what is still missing, never twice; but only while
  the node lives, and a lender's spare nodes are counted from its live members, so a node that
  died mid-shrink (with the janitor, say) neither keeps the waiting job waiting for it nor lets
  a job be taken below MIN.

A job at its MIN is never preempted: making room there would mean stopping it and putting it back
in the queue (a requeue policy), which needs a checkpoint the job resumes from on other nodes and a
promise of when it runs again; not done here. Nodes lent are given back only when the borrower
has ended, never while it runs, so a lend and a return never follow each other for one borrower.
Pure: no I/O and no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from elasticd.terms.ids import valid_job_id

ROOM_BY = "elasticd (room for "  # a drain record's ``by`` when a node was lent: ``room_by(job)``
SHRINK_INTERVAL_S = 300.0  # the daemon's default ``shrink_interval``


def room_by(job_id: str) -> str:
    """What the drain record of a node lent to ``job_id`` says in ``by``."""
    return f"{ROOM_BY}{job_id})"


def lent_for(by: str) -> str | None:
    """The job a drain record's ``by`` says the node was lent to (None: another drain). The record
    is untrusted: anything but a valid job id in the expected frame is no lend."""
    if not (by.startswith(ROOM_BY) and by.endswith(")")):
        return None
    job = by[len(ROOM_BY) : -1]
    return job if valid_job_id(job) else None


@dataclass(frozen=True)
class Waiting:
    """A job that never ran, in queue order: what it needs to start."""

    id: str
    priority: int
    minimum: int  # nodes (--nnodes MIN)
    nproc: int  # slots per node
    nodes: tuple[str, ...] = ()  # the nodes it may run on (empty: any)

    def allows(self, node: str) -> bool:
        return not self.nodes or node in self.nodes


@dataclass(frozen=True)
class Running:
    """A job whose current round runs: what it could lend."""

    id: str
    priority: int
    minimum: int
    size: int  # the nodes of its running round
    nproc: int
    yields: bool  # its submitter lets it shrink for a higher priority (--yield)
    submitted_at: float
    members: tuple[str, ...]  # the nodes that run it now
    last_shrunk: float | None = None  # when it last lent a node (None: never, or long forgotten)
    lent_to: frozenset[str] = frozenset()  # the jobs its nodes are lent to now


@dataclass(frozen=True)
class NodeRoom:
    """A live node: its free slots, and whether it is drained (it takes no job then)."""

    node: str
    free: int
    draining: bool = False


@dataclass(frozen=True)
class Lent:
    """A drain record that lent ``node`` of ``job`` to ``for_job``."""

    job: str
    node: str
    for_job: str


@dataclass(frozen=True)
class Shrink:
    """Write the drain of ``node`` from ``job``, lending it to ``for_job``."""

    job: str
    node: str
    for_job: str


@dataclass(frozen=True)
class GiveBack:
    """Delete the drain of ``node`` from ``job``: ``for_job`` ended, the job may grow back."""

    job: str
    node: str
    for_job: str


@dataclass(frozen=True)
class Room:
    shrinks: tuple[Shrink, ...] = ()
    returns: tuple[GiveBack, ...] = ()
    reason: str = ""  # why it shrinks, or why a waiting job of a higher priority still waits


NOTHING = Room()


def making(lent: Iterable[Lent]) -> dict[str, str]:
    """What a waiting job's queue place says while nodes are lent to it (their lenders' drains
    under way, or done and the job not started yet): ``making room: shrinking JOB (NODE, ...)``,
    by the borrower's id. Without it, the job would show only its place, as if it were stuck."""
    lenders: dict[str, dict[str, list[str]]] = {}
    for x in sorted(lent, key=lambda x: (x.for_job, x.job, x.node)):
        lenders.setdefault(x.for_job, {}).setdefault(x.job, []).append(x.node)
    return {
        job: "making room: shrinking " + ", ".join(f"{j} ({', '.join(nodes)})" for j, nodes in by.items())
        for job, by in lenders.items()
    }


def worth_asking(waiting: Iterable[Waiting], running: Iterable[Running]) -> bool:
    """Whether ``decide`` could lend anything, from the jobs alone: some job waits with a priority
    above a running job's that yields and runs above its MIN. When not, the caller reads no node
    record, and with nothing lent nothing changes: today's queue, exactly."""
    low = min((r.priority for r in running if r.yields and r.size > r.minimum), default=None)
    return low is not None and any(w.priority > low for w in waiting)


def decide(
    waiting: Sequence[Waiting],
    running: Sequence[Running],
    nodes: Sequence[NodeRoom],
    lent: Sequence[Lent],
    alive: Collection[str],
    now: float,
    interval_s: float,
) -> Room:
    """What to lend and what to give back (module doc). ``waiting``: in queue order; ``alive``: the
    jobs that have not ended; ``now``: the clock the ``last_shrunk`` times are on."""
    returns = tuple(GiveBack(x.job, x.node, x.for_job) for x in lent if x.for_job not in alive)
    kept = [x for x in lent if x.for_job in alive]
    free = {n.node: n.free for n in nodes if not n.draining}
    reserved: set[str] = set()
    for w in waiting:
        supply = _supply(w, free, kept, reserved)
        if len(supply) >= w.minimum:  # it can start: the nodes it would take are no one else's
            reserved |= set(sorted(supply)[: w.minimum])
            continue
        need = w.minimum - len(supply)
        taken = _take(w, need, running, free, kept, reserved | supply, now, interval_s)
        if len(taken) < need:
            return Room(
                (), returns, f"{w.id} waits: {len(taken)} of the {need} node(s) it lacks could be lent"
            )
        lenders = sorted({s.job for s in taken})
        why = f"{', '.join(lenders)} shrunk by {need} node(s) for {w.id} (priority {w.priority})"
        return Room(taken, returns, why)
    return Room((), returns, "")


def _supply(w: Waiting, free: Mapping[str, int], lent: Sequence[Lent], reserved: set[str]) -> set[str]:
    """The nodes ``w`` could run on now: free enough and allowed, or already lent to it and live
    (a lent node that died, say with the janitor that lent it, would keep ``w`` waiting for it)."""
    own = {x.node for x in lent if x.for_job == w.id and x.node in free}
    return {n for n, slots in free.items() if n not in reserved and w.allows(n) and slots >= w.nproc} | own


def _may_lend(r: Running, w: Waiting, now: float, interval_s: float) -> bool:
    if not r.yields or r.priority >= w.priority:
        return False
    if w.id in r.lent_to:  # finishing a lend begun earlier (a janitor that stopped mid-way)
        return True
    return r.last_shrunk is None or now >= r.last_shrunk + interval_s


def _take(
    w: Waiting,
    need: int,
    running: Sequence[Running],
    free: Mapping[str, int],
    lent: Sequence[Lent],
    excluded: set[str],
    now: float,
    interval_s: float,
) -> tuple[Shrink, ...]:
    """Up to ``need`` nodes for ``w``, one at a time from the best lender (module doc). A job's
    spare nodes are counted from its live members: a member that died still counts in its round's
    size until the next round, and lending on that count would take the job below MIN."""
    gone = {(x.job, x.node) for x in lent}
    spare = {
        r.id: min(r.size, len(r.members)) - r.minimum - sum((r.id, n) in gone for n in r.members)
        for r in running
        if _may_lend(r, w, now, interval_s)
    }
    pool = [
        (r, n)
        for r in running
        if r.id in spare
        for n in r.members
        if n in free
        and w.allows(n)
        and n not in excluded
        and (r.id, n) not in gone
        and free[n] + r.nproc >= w.nproc
    ]
    taken: list[Shrink] = []
    used: set[str] = set()
    while len(taken) < need:
        options = [(r, n) for r, n in pool if spare[r.id] > 0 and n not in used]
        if not options:
            break
        r, n = min(options, key=lambda o: (o[0].priority, -spare[o[0].id], -o[0].submitted_at, o[0].id, o[1]))
        spare[r.id] -= 1
        used.add(n)
        taken.append(Shrink(r.id, n, w.id))
    return tuple(taken)

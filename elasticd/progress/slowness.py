"""Which rank the others wait for: each rank's time outside collectives against its time waiting in
them, its slowness score, and when a rank becomes (and stops being) a straggler. Pure: every call
takes ``now``.

The evidence comes from outside the script (``threadstate``): the state of each rank's main thread,
sampled from ``/proc``. In synchronous data-parallel training every rank waits for the slowest at
each collective, so step times are the same everywhere; what differs is *where* the time goes. A
rank's main thread blocked on a futex (``S`` in ``futex_*``) waits for a collective (or the GIL);
anything else (running, runnable or throttled, stopped, in I/O, asleep in the script's own code) is
the rank's own work, which the others wait for. The rank with the largest share of its own work is
the one holding the job back.

Score: ``own_r = computing_r / (computing_r + waiting_r)`` over the window, and
``score_r = min(own) / own_r``: 1.0 for the fastest rank, lower for slower ones (a rank that needs
twice the time scores about 0.5, one 20% slower about 0.83). A rank is a straggler once its score
stayed under ``ENTER`` for ``SUSTAIN_S``, and stops being one once it stayed over ``LEAVE`` as long
(hysteresis: a rank near the line is not named and cleared on alternate evaluations).

A rank's time running and waiting for a CPU comes from the kernel's own count
(``/proc/<pid>/task/<tid>/schedstat``), the looks only splitting the rest (``ActivityWindow``).
A host's CPUs are its ranks' to share: time a rank's main thread was runnable but waiting for a
CPU (its run-queue wait; a cgroup's CPU throttling counts there too) is the host's, not the
rank's. On a host whose cores are oversubscribed by other
processes, every local rank waits for a CPU, but not equally over a window: one rank's extra
wait for a core becomes its peers' wait in the next collective, and it would be named although
nothing about it is slow (seen: rank 0 of a healthy single-node job, at score 0.80, while other
test suites loaded the host). So each node's ranks pool their run-queue wait (``pool``): each
rank's share of it is replaced by the mean share of the node's ranks of the job. Ranks of one node
then differ only by what they run, stop or sleep on; a node whose CPUs are slower for all its ranks
(a quota on its workers, a noisy neighbour) still holds the job's straggler, since its ranks all
wait for CPUs more than the other nodes' do. What pooling gives up: a rank that alone waits for a
CPU while its node's other ranks of the job do not (a hog pinned to its core) is not told apart
from its node's; its node is what a drain moves anyway.

Two more guards, both seen with a slow link (every rank waits in the collectives, and each rank's
own share falls to a few percent): a rank scores under 1.0 only when its own work exceeds the
fastest's by ``MIN_EXCESS`` of the window (below that, what tells ranks apart is noise, and the job
would not be measurably faster without the rank); and every node's windows end on the same
``ALIGN_S`` boundary of the wall clock, the judge comparing one boundary's windows (``aligned``).
Nodes publish every 5 s, each at its own phase: while the job's pace changed, one node's window
compared with another's a few seconds older named the staler ranks for as long as a window lasts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

SAMPLE_S = 0.05  # one look at every local rank's main thread this often (20 Hz)
WINDOW_S = 20.0  # the evidence a rank's score is computed over
MIN_SPAN_S = 8.0  # a rank needs this much sampled time in the window before it is scored
MIN_OWN = 0.02  # the fastest rank's share of own work under which nothing is scored (all wait: a hang)
ENTER = 0.88  # a score under this, for SUSTAIN_S, names a straggler (20% slower is ~0.83)
LEAVE = 0.93  # and over this, for SUSTAIN_S, clears it
SUSTAIN_S = 12.0  # how long a score must stay past a line before the verdict changes
MIN_EXCESS = 0.05  # own work beyond the fastest's (a share of the window) that can lower a score
ALIGN_S = 5.0  # every node's windows end on a multiple of this (wall clock): the same seconds
MAX_TRACKED = 4096  # ranks a verdict remembers (a job's world size is bounded far below)


class Activity(Enum):
    """What one look at a rank's main thread saw."""

    OWN = "own"  # stopped, in I/O or asleep in its own code
    RUNNABLE = "runnable"  # running, or runnable (waiting for a CPU, throttled): its own too
    WAITING = "waiting"  # blocked on a futex: a collective's wait (or the GIL)


def classify(state: str, wchan: str) -> Activity | None:
    """One look: ``state`` is the thread's state letter from ``/proc/<pid>/task/<tid>/stat``,
    ``wchan`` the kernel function it sleeps in (read only for ``S``). None: nothing to count
    (a zombie or dead thread, an unknown letter, a sleep the kernel did not name)."""
    match state:
        case "R":
            return Activity.RUNNABLE
        case "D" | "T" | "t":
            return Activity.OWN
        case "S" | "I":
            if wchan.startswith("futex"):
                return Activity.WAITING
            return Activity.OWN if wchan and wchan != "0" else None
        case _:
            return None


@dataclass(frozen=True)
class Evidence:
    """A rank's seconds computing (outside collectives) and waiting (in them) over a window; of
    its computing, ``queued_s`` runnable but waiting for a CPU (as published: its node's share)."""

    computing_s: float
    waiting_s: float
    queued_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("computing_s", "waiting_s", "queued_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value <= 2 * WINDOW_S):
                raise ValueError(f"{name} must be 0..{2 * WINDOW_S:g} seconds")
        if self.queued_s > self.computing_s:
            raise ValueError("queued_s is part of computing_s")

    @property
    def span_s(self) -> float:
        return self.computing_s + self.waiting_s

    @property
    def own(self) -> float:
        """The share of the window spent outside collectives (0..1)."""
        return self.computing_s / self.span_s if self.span_s > 0 else 0.0


class ActivityWindow:
    """One rank's looks over the last ``WINDOW_S``, and its CPU time, in one-second buckets
    (bounded: at most ``WINDOW_S + ALIGN_S + 1`` buckets, whatever the sampling rate).

    The kernel counts a thread's time running and waiting for a CPU exactly (``schedstat``);
    looks only split the rest, its sleep, into collectives' waits and its own. Looks alone would
    do (and do, where the kernel does not say), but on a host whose CPUs are all busy the looks
    themselves wait for a CPU, and when they get one is not independent of what the ranks do."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        # [second, looks own, looks waiting, seconds queued, seconds run, looks runnable, CPU time
        # reads], back to the oldest window an aligned end can ask for
        self._buckets: deque[list[float]] = deque(maxlen=int(window_s + ALIGN_S) + 1)
        self._first: float | None = None

    def _bucket(self, now: float) -> list[float]:
        second = int(now)
        if self._first is None:
            self._first = now
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append([second, 0, 0, 0.0, 0.0, 0, 0])
        return self._buckets[-1]

    def add(self, activity: Activity, now: float) -> None:
        self._bucket(now)[_COLUMN[activity]] += 1

    def cpu(self, run_s: float, queued_s: float, now: float) -> None:
        """The rank's main thread ran ``run_s`` and waited ``queued_s`` for a CPU since the last
        call (each bounded, so a clock or counter that jumps cannot fill the window)."""
        bucket = self._bucket(now)
        for column, seconds in ((4, run_s), (3, queued_s)):
            if math.isfinite(seconds) and seconds > 0:
                bucket[column] += min(seconds, self._window_s)
        bucket[6] += 1

    def evidence(self, until: float) -> Evidence | None:
        """The evidence, in seconds, of the window that ends at ``until`` (now, or an
        ``aligned_end`` not long before); None until the looks span ``MIN_SPAN_S``."""
        if self._first is None:
            return None
        start = max(self._first, until - self._window_s)
        span = until - start
        kept = [b for b in self._buckets if b[0] < until and b[0] + 1 > until - self._window_s]
        own, waiting, queued, run, runnable, reads = (sum(b[i] for b in kept) for i in range(1, 7))
        if span < MIN_SPAN_S or own + waiting + runnable == 0:
            return None
        span = min(span, self._window_s)
        if reads:
            busy = min(span, run + queued)
            queued = queued * busy / (run + queued) if run + queued > 0 else 0.0
            wait = (span - busy) * waiting / (own + waiting) if own + waiting else 0.0
        else:
            wait = span * waiting / (own + waiting + runnable)
        computing = round(span - wait, 3)
        return Evidence(computing, round(wait, 3), min(computing, round(queued, 3)))


_COLUMN = {Activity.OWN: 1, Activity.WAITING: 2, Activity.RUNNABLE: 5}


def pool(evidence: Mapping[int, Evidence]) -> dict[int, Evidence]:
    """The evidence of one node's ranks of a job, each rank's run-queue wait replaced by the
    node's mean (as shares of each rank's window, which keeps its span): ``own_r - queued_r +
    mean(queued)``, within 0..1, and the rest of the window waiting. Ranks that run alike then look
    alike, however the host's CPUs split their waits among them."""
    if not evidence:
        return {}
    shares = {r: e.queued_s / e.span_s if e.span_s > 0 else 0.0 for r, e in evidence.items()}
    mean = math.fsum(shares.values()) / len(shares)
    out: dict[int, Evidence] = {}
    for rank, e in evidence.items():
        own = min(1.0, max(0.0, e.own - shares[rank] + mean))
        computing = round(e.span_s * own, 3)
        out[rank] = Evidence(
            computing, round(e.span_s - computing, 3), min(computing, round(e.span_s * mean, 3))
        )
    return out


def scores(evidence: Mapping[int, Evidence]) -> dict[int, float]:
    """Each rank's score (1.0: as fast as the fastest; lower is slower), over the ranks of every
    node that gave evidence. Empty with fewer than two ranks to compare, or when the fastest rank
    did next to no work of its own (every rank waits: a hang, judged elsewhere)."""
    known = {rank: e for rank, e in evidence.items() if e.span_s >= MIN_SPAN_S}
    if len(known) < 2:
        return {}
    fastest = min(e.own for e in known.values())
    if fastest < MIN_OWN:
        return {}
    return {
        rank: round(min(1.0, fastest / e.own), 3) if e.own - fastest >= MIN_EXCESS else 1.0
        for rank, e in known.items()
    }


def aligned_end(now: float) -> float:
    """The end of the window a node publishes at ``now``: the last ``ALIGN_S`` boundary."""
    return math.floor(now / ALIGN_S) * ALIGN_S


Seen = Mapping[int, Mapping[float | None, Evidence]]  # rank -> its windows' evidence, by end


def aligned(seen: Seen) -> dict[int, Evidence] | None:
    """Each rank's evidence of the latest window end every rank has; None when they share none.
    A rank whose windows say no end (an older daemon's report) matches any end, with its latest."""
    ends = [said for by in seen.values() if (said := {e for e in by if e is not None})]
    common: set[float] = set.intersection(*ends) if ends else set()
    if ends and not common:
        return None
    end: float | None = max(common) if common else None
    out: dict[int, Evidence] = {}
    for rank, by in seen.items():
        got = by.get(end, by.get(None))
        if got is None:
            return None
        out[rank] = got
    return out


@dataclass(frozen=True)
class RankScore:
    """A rank's score as the round's judge published it (read back from etcd: bounded)."""

    rank: int
    score: float

    def __post_init__(self) -> None:
        if not 0 <= self.rank < 2**31:
            raise ValueError("rank must be 0..2**31-1")
        if not (math.isfinite(self.score) and 0 <= self.score <= 1):
            raise ValueError("score must be 0..1")


def report_scores(current: Mapping[int, float]) -> list[RankScore]:
    """The judge's scores as its report carries them: every rank's, for a round of at most
    ``MAX_TRACKED`` ranks (a larger one's are computed by the reader from the reports)."""
    if len(current) > MAX_TRACKED:
        return []
    return [RankScore(rank, score) for rank, score in sorted(current.items())]


@dataclass(frozen=True)
class Change:
    """A rank became a straggler (``straggler``) or stopped being one, with its score then."""

    rank: int
    straggler: bool
    score: float | None  # None: the rank is no longer scored (it left, or the round ended)


@dataclass(frozen=True)
class Verdicts:
    """Which ranks are stragglers (and since when), and since when each score has been past its line."""

    flagged: frozenset[int] = frozenset()
    past_since: Mapping[int, float] = field(default_factory=dict)  # rank -> first time past its line
    flagged_at: Mapping[int, float] = field(default_factory=dict)  # flagged rank -> when it was named


def judge(v: Verdicts, current: Mapping[int, float], now: float) -> tuple[Verdicts, tuple[Change, ...]]:
    """The verdicts after one evaluation of ``current`` scores. A flagged rank that is no longer
    scored is cleared at once (there is nothing to say it still holds the job back)."""
    past: dict[int, float] = {}
    changes: list[Change] = []
    flagged = set(v.flagged)
    for rank, score in sorted(current.items())[:MAX_TRACKED]:
        crossing = score >= LEAVE if rank in flagged else score < ENTER
        if not crossing:
            continue
        since = v.past_since.get(rank, now)
        if now - since >= SUSTAIN_S:
            flagged ^= {rank}
            changes.append(Change(rank, rank in flagged, score))
        else:
            past[rank] = since
    for rank in sorted(flagged - current.keys()):
        flagged.discard(rank)
        changes.append(Change(rank, False, None))
    named = {c.rank: now for c in changes if c.straggler}
    at = {r: t for r, t in v.flagged_at.items() if r in flagged} | named
    return replace(v, flagged=frozenset(flagged), past_since=past, flagged_at=at), tuple(changes)


def ended(v: Verdicts) -> tuple[Change, ...]:
    """What the end of the round (or of the evaluation) says of each flagged rank."""
    return tuple(Change(rank, False, None) for rank in sorted(v.flagged))


@dataclass(frozen=True)
class Drain:
    """Drain ``node`` out of the job: it has held straggler ``rank`` for the grace."""

    node: str
    rank: int
    score: float | None


@dataclass(frozen=True)
class Keep:
    """``node`` holds a straggler past the grace, but the job is at its minimum: it stays."""

    node: str
    rank: int
    why: str


def drains(
    v: Verdicts,
    scores_now: Mapping[int, float],
    holders: Mapping[str, Collection[int]],
    size: int,
    minimum: int,
    grace_s: float,
    now: float,
) -> list[Drain | Keep]:
    """The nodes to drain out of the job under ``StragglerPolicy.DRAIN``: each node (of
    ``holders``: node -> its ranks) that holds a rank named a straggler at least ``grace_s`` ago,
    with its slowest such rank, so long as the round (``size`` nodes) keeps ``minimum`` nodes: a
    drain never takes a job below it (the node is kept, and said so)."""
    due = {r for r, t in v.flagged_at.items() if r in v.flagged and now - t >= grace_s}
    out: list[Drain | Keep] = []
    left = size
    for node in sorted(holders):
        mine = sorted(due.intersection(holders[node]))
        if not mine:
            continue
        rank = min(mine, key=lambda r: scores_now.get(r, 1.0))
        if left - 1 < minimum:
            out.append(Keep(node, rank, f"the job needs {minimum} nodes and has {left}"))
            continue
        left -= 1
        out.append(Drain(node, rank, scores_now.get(rank)))
    return out

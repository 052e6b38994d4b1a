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
MAX_TRACKED = 4096  # ranks a verdict remembers (a job's world size is bounded far below)


class Activity(Enum):
    """What one look at a rank's main thread saw."""

    OWN = "own"  # running, runnable, throttled, stopped, in I/O or asleep in its own code
    WAITING = "waiting"  # blocked on a futex: a collective's wait (or the GIL)


def classify(state: str, wchan: str) -> Activity | None:
    """One look: ``state`` is the thread's state letter from ``/proc/<pid>/task/<tid>/stat``,
    ``wchan`` the kernel function it sleeps in (read only for ``S``). None: nothing to count
    (a zombie or dead thread, an unknown letter, a sleep the kernel did not name)."""
    match state:
        case "R" | "D" | "T" | "t":
            return Activity.OWN
        case "S" | "I":
            if wchan.startswith("futex"):
                return Activity.WAITING
            return Activity.OWN if wchan and wchan != "0" else None
        case _:
            return None


@dataclass(frozen=True)
class Evidence:
    """A rank's seconds computing (outside collectives) and waiting (in them) over a window."""

    computing_s: float
    waiting_s: float

    def __post_init__(self) -> None:
        for name in ("computing_s", "waiting_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value <= 2 * WINDOW_S):
                raise ValueError(f"{name} must be 0..{2 * WINDOW_S:g} seconds")

    @property
    def span_s(self) -> float:
        return self.computing_s + self.waiting_s

    @property
    def own(self) -> float:
        """The share of the window spent outside collectives (0..1)."""
        return self.computing_s / self.span_s if self.span_s > 0 else 0.0


class ActivityWindow:
    """One rank's looks over the last ``WINDOW_S``, in one-second buckets (bounded: at most
    ``WINDOW_S + 1`` buckets, whatever the sampling rate)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._buckets: deque[list[int]] = deque(maxlen=int(window_s) + 1)  # [second, own, waiting]
        self._first: float | None = None

    def add(self, activity: Activity, now: float) -> None:
        second = int(now)
        if self._first is None:
            self._first = now
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append([second, 0, 0])
        self._buckets[-1][1 if activity is Activity.OWN else 2] += 1

    def evidence(self, now: float) -> Evidence | None:
        """The window's evidence in seconds (looks scaled to the time they span); None until the
        looks span ``MIN_SPAN_S``."""
        if self._first is None:
            return None
        start = max(self._first, now - self._window_s)
        span = now - start
        kept = [b for b in self._buckets if b[0] + 1 > now - self._window_s]
        own, waiting = sum(b[1] for b in kept), sum(b[2] for b in kept)
        if span < MIN_SPAN_S or own + waiting == 0:
            return None
        span = min(span, self._window_s)
        return Evidence(round(span * own / (own + waiting), 3), round(span * waiting / (own + waiting), 3))


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
    return {rank: round(min(1.0, fastest / e.own), 3) for rank, e in known.items()}


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

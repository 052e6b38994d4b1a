"""A recent read, shared: what ``status`` answers from instead of asking etcd on every call.

``status`` reads every job's records (``jobs/`` and ``notes/``) and is asked by every user and
script that watches a job, often several times a second. Asking etcd each time put one etcd
round trip, a thread hand-off and a decode on every call's path, and under many concurrent
callers those queue behind each other (p99 10 ms for 50 clients, where a ``ping`` took 3 ms).
``manager/sharedread.py``'s ``RecentRead`` keeps the last read and gives it out while it is
*valid*, as ``freshness`` (here, pure) judges it:

- no change was seen since the read began (``invalidate``: the daemon's watch of everything
  outside ``notes/`` calls it for every job key that changes anywhere in the cluster, and the
  control commands call it after their own writes, so a ``kill`` or ``submit`` is seen by the
  ``status`` that follows it);
- the read began less than ``max_age_s`` ago. The jobs' pending notes are watched by no
  daemon, by design (``Keys.watched``), so this bounds how old they can be (what ``status
  <job>`` adds of one job, its members' statuses and joins, it reads each time).

A change this process made itself need not cost a read: its writer reads back what it wrote
(one job's keys) and ``advance``s the held read with it, provided no other change was seen since
the held read began; the watch's news of that write then does not invalidate it (the writer
says which news is its own). The scan then works from the advanced read as from a read begun
after the write (the watch reports every other change of what it shows; the unwatched notes
are as old as the held read, within ``max_age_s``).

A caller that finds it older than ``refresh_s`` (but still valid) gets it at once and starts
one read in the background for the next caller. Callers that need a read share the one in
flight if it began after the last change, so a burst of calls makes one read, never one each.
A failed read leaves nothing behind: its callers get the error (``EtcdUnavailable``, which
``status`` answers from the local agents' own view).

States of the held value (``Held``), by time since its read began and changes seen since:
    fresh (age < refresh_s) ──age──> refreshing (given out; one background read)
    refreshing ──read done──> fresh
    fresh | refreshing ──invalidate, or age ≥ max_age_s──> invalid (the next caller reads)
    fresh | refreshing ──advance──> fresh | refreshing, current (the scan takes it as a new read)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

T = TypeVar("T")

MAX_AGE_S = 1.0  # the most a held read's unwatched notes can lag behind etcd
REFRESH_S = 0.25  # a held read this old is refreshed in the background when asked for


@dataclass(frozen=True)
class Held(Generic[T]):
    value: T
    generation: int  # of the changes seen when the read began
    began: float  # when the read began (``now``'s clock)
    # Brought past every change seen by this process's own change, read back (``advance``): as
    # good as a read begun after it for everything the watch reports.
    current: bool = False


class Freshness(StrEnum):
    """What a held read is worth to a caller now (the transitions are in the module doc)."""

    INVALID = "invalid"  # nothing held, a change seen since its read began, or too old: read
    FRESH = "fresh"  # give it out
    REFRESHING = "refreshing"  # give it out, and have one read begin for the next caller


def freshness(
    held: Held[T] | None, generation: int, now: float, max_age_s: float, refresh_s: float
) -> Freshness:
    """``held`` judged at ``now``, when ``generation`` changes have been seen."""
    if held is None or held.generation != generation:
        return Freshness.INVALID
    age = now - held.began
    if age >= max_age_s:
        return Freshness.INVALID
    return Freshness.REFRESHING if age >= refresh_s else Freshness.FRESH

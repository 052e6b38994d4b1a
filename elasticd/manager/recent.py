"""A recent read, shared: what ``status`` answers from instead of asking etcd on every call.

``status`` reads every job's records (``jobs/`` and ``parts/``) and is asked by every user and
script that watches a job, often several times a second. Asking etcd each time put one etcd
round trip, a thread hand-off and a decode on every call's path, and under many concurrent
callers those queue behind each other (p99 10 ms for 50 clients, where a ``ping`` took 3 ms).
``RecentRead`` keeps the last read and gives it out while it is *valid*:

- no change was seen since the read began (``invalidate``: the daemon's watch of everything
  outside ``parts/`` calls it for every job key that changes anywhere in the cluster, and the
  control commands call it after their own writes, so a ``kill`` or ``submit`` is seen by the
  ``status`` that follows it);
- the read began less than ``max_age_s`` ago. The jobs' parts (each node's status of its
  members, joins, pending notes) are watched by no daemon, by design (``Keys.watched``), so
  this bounds how old they can be.

A caller that finds it older than ``refresh_s`` (but still valid) gets it at once and starts
one read in the background for the next caller. Callers that need a read share the one in
flight if it began after the last change, so a burst of calls makes one read, never one each.
A failed read leaves nothing behind: its callers get the error (``EtcdUnavailable``, which
``status`` answers from the local agents' own view).

States of the held value (``Held``), by time since its read began and changes seen since:
    fresh (age < refresh_s) ──age──> refreshing (given out; one background read)
    refreshing ──read done──> fresh
    fresh | refreshing ──invalidate, or age ≥ max_age_s──> invalid (the next caller reads)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

MAX_AGE_S = 1.0  # the most a held read's unwatched parts can lag behind etcd
REFRESH_S = 0.25  # a held read this old is refreshed in the background when asked for


@dataclass(frozen=True)
class Held(Generic[T]):
    value: T
    generation: int  # of the changes seen when the read began
    began: float  # when the read began (``now``'s clock)


class RecentRead(Generic[T]):
    """One value read by ``read``, shared by concurrent callers while it is valid (module doc).

    Owned by one event loop, and used on it only (the watch's changes reach it through the loop:
    ``JobManager.wake``). ``T`` is never None: None means "nothing held"."""

    def __init__(
        self,
        read: Callable[[], Awaitable[T]],
        now: Callable[[], float] = time.monotonic,
        max_age_s: float = MAX_AGE_S,
        refresh_s: float = REFRESH_S,
    ) -> None:
        if not 0 < refresh_s <= max_age_s:
            raise ValueError(f"need 0 < refresh_s <= max_age_s, got {refresh_s}, {max_age_s}")
        self._read = read
        self._now = now
        self._max_age_s = max_age_s
        self._refresh_s = refresh_s
        self._generation = 0
        self._held: Held[T] | None = None
        self._inflight: tuple[int, asyncio.Task[T]] | None = None  # (generation, the read)
        self.reads = 0  # reads begun (what the tests count)

    def invalidate(self) -> None:
        """Something the value shows changed: no caller gets a read that began before this."""
        self._generation += 1

    def held(self) -> T | None:
        """The held value while it is valid, without reading (None: there is none)."""
        held = self._held
        if held is None or held.generation != self._generation:
            return None
        age = self._now() - held.began
        if age >= self._max_age_s:
            return None
        if age >= self._refresh_s:
            self._join()  # for the next caller; this one is served now
        return held.value

    async def get(self) -> T:
        """The held value while it is valid, else a read that began after the last change."""
        value = self.held()
        if value is not None:
            return value
        return await asyncio.shield(self._join())  # a caller that goes away leaves the read to others

    def _join(self) -> asyncio.Task[T]:
        """The read in flight if it began after the last change, else a new one."""
        generation = self._generation
        if self._inflight is not None and self._inflight[0] == generation:
            return self._inflight[1]
        task = asyncio.ensure_future(self._read_once(generation, self._now()))
        task.add_done_callback(_retrieve)
        self._inflight = (generation, task)
        return task

    async def _read_once(self, generation: int, began: float) -> T:
        self.reads += 1
        try:
            value = await self._read()
        finally:
            if self._inflight is not None and self._inflight[0] == generation:
                self._inflight = None
        if self._held is None or self._held.began <= began:
            self._held = Held(value, generation, began)
        return value


def _retrieve(task: asyncio.Task[object]) -> None:
    """A background read's error is its callers' (if any): never 'exception was never retrieved'."""
    if not task.cancelled():
        task.exception()

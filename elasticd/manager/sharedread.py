"""``RecentRead``: one read shared by concurrent callers while ``manager/recent.py`` judges it
valid; it holds the read's task, so that a burst of calls makes one read, never one each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Generic, TypeVar

from elasticd.manager.recent import MAX_AGE_S, REFRESH_S, Freshness, Held, freshness

T = TypeVar("T")


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

    @property
    def generation(self) -> int:
        """How many changes were seen: what ``advance`` is given, taken before a write."""
        return self._generation

    def invalidate(self) -> None:
        """Something the value shows changed: no caller gets a read that began before this."""
        self._generation += 1

    def held(self) -> T | None:
        """The held value while it is valid, without reading (None: there is none)."""
        held = self._held
        verdict = freshness(held, self._generation, self._now(), self._max_age_s, self._refresh_s)
        if held is None or verdict is Freshness.INVALID:
            return None
        if verdict is Freshness.REFRESHING:
            self._join()  # for the next caller; this one is served now
        return held.value

    def amend(self, change: Callable[[T], T]) -> None:
        """Put ``change(value)`` in place of the held value while it is valid, as of the same read:
        for what this process itself just wrote and read back, which no watch reports."""
        held = self._held
        if held is not None and self.held() is not None:
            self._held = replace(held, value=change(held.value))

    def advance(self, since: int, change: Callable[[T], T]) -> T | None:
        """Put ``change(value)`` in place of the held value, as past this process's own write that
        ``change`` applies (read back after it): only if the value was valid when ``since`` was
        taken (``generation``, before the write) and no change was seen since (the write's own
        watch news is not counted: its caller does not ``invalidate`` for it). Returns the new
        value, which ``fresh`` gives out as a read begun now would be; else (None) invalidates,
        and the next caller reads. Reads begun before are never held after it."""
        held = self._held
        now, generation = self._now(), self._generation
        if (
            held is None
            or since != generation
            or freshness(held, generation, now, self._max_age_s, self._refresh_s) is Freshness.INVALID
        ):
            self.invalidate()
            return None
        self._generation += 1
        value = change(held.value)
        self._held = Held(value, self._generation, held.began, current=True)
        return value

    async def get(self) -> T:
        """The held value while it is valid, else a read that began after the last change."""
        value = self.held()
        if value is not None:
            return value
        return await asyncio.shield(self._join())  # a caller that goes away leaves the read to others

    async def fresh(self) -> T:
        """A read that began after the last change: the one in flight if it did, else a new one
        (never a held value that merely has seen no change since, however recent: what the watch
        does not report is seen too), or the held value ``advance`` brought past the last change.
        The scan's: it shares its read with ``get``'s callers, and theirs with it."""
        held = self._held
        if held is not None and held.current and self.held() is not None:
            return held.value
        return await asyncio.shield(self._join())

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
        held = self._held
        if held is None or (held.generation, held.began) <= (generation, began):
            self._held = Held(value, generation, began)
        return value


def _retrieve(task: asyncio.Task[object]) -> None:
    """A background read's error is its callers' (if any): never 'exception was never retrieved'."""
    if not task.cancelled():
        task.exception()

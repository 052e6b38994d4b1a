"""``Informer``: keeps a ``Store`` current with one list and one watch of its ranges.

It lists every range the store holds in one read (one revision, R), then watches its watch
ranges (which cover the held ones, and may cover more: their news is routed, not held) each
from R + 1 (``KV.watch_from``): every change after the list, none it showed. When a watch breaks it is
opened again from the revision after the last change it delivered; when that cannot be (the
revision was compacted, or the watch broke again before delivering anything), it lists again.
The watch's news goes to the store on the event loop, then to ``on_events`` (every change, held
or not; None after a list: anything may have changed), which wakes whoever acts on it. What is
computed from the copy is asked of it (``derived``), and made again only when the copy changed.

A writer that needs to read its own write waits for the copy to reach the revision the write
made (``wait_for``): the watch delivers it (a write into the ranges), or a later list shows it.
One that does not know its write's revision (a delete) asks etcd what changed in the held ranges
since the copy's revision (``caught_up``: one small read) and waits for that; the scan's safety
net asks the same, so a watch that stalled silently is found out and the copy listed again.

States (``Phase``):
    LISTING ──listed, watches open──> WATCHING
    LISTING ──etcd unreachable──> LISTING (after ``RETRY_S``)
    WATCHING ──a watch broke, after news──> WATCHING (resumed from the last revision)
    WATCHING ──a watch broke with no news since it opened, or cannot resume──> LISTING
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Generic, TypeVar

from elasticd import log
from elasticd.aio import wait_event
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.kv import KV
from elasticd.etcd.types import Found, Query, WatchEvent
from elasticd.informer.derived import Derived
from elasticd.informer.store import Completeness, Store

_log = log.get("elasticd.informer")
T = TypeVar("T")

RETRY_S = 1.0  # between lists while etcd cannot be reached


class Phase(Enum):
    """Where the informer is (the transitions are in the module doc)."""

    LISTING = "listing"
    WATCHING = "watching"


class Informer(Generic[T]):
    """The copy of ``ranges`` ([start, end) each), kept current by ``run`` (module doc). Used on
    one event loop; ``run`` is its one task."""

    def __init__(
        self,
        kv: KV,
        store: Store[T],
        watched: Sequence[tuple[str, str]] = (),
        on_events: Callable[[list[WatchEvent] | None], None] = lambda events: None,
        name: str = "informer",
    ) -> None:
        self._kv = kv
        self._ranges = tuple(watched) or store.held  # the watches' ranges
        self.store = store
        self.derived = Derived(store.reads)  # values made from the copy, kept until it changes
        self._on_events = on_events
        # The watch range each held range is in: its news says how far that held range is.
        self._watch_of = [_covering(self._ranges, held) for held in store.held]
        self._name = name
        self.phase = Phase.LISTING
        self.phase_since = time.monotonic()  # when it entered ``phase``
        self._seen = [0] * len(self._ranges)  # each range's newest revision known
        self._news = False  # whether a watch delivered anything since it opened
        self._advanced = asyncio.Event()  # set (and replaced) at each change of the copy
        self.lists = 0  # lists made: what the tests and benches count
        self.events = 0  # changes applied from the watches
        self.probes = 0  # reads of what changed since the copy's revision (``caught_up``)

    # -- reading ----------------------------------------------------------------------------------
    def reads(self) -> Mapping[str, T]:
        """Every group's read, as the copy holds it now (empty before the first list)."""
        return self.store.reads()

    @property
    def revision(self) -> int:
        return self.store.revision

    async def wait_for(self, revision: int, timeout_s: float, key: str | None = None) -> bool:
        """Wait until the copy is as of ``revision`` or later (with ``key``: as far as the watch of
        the range that holds ``key`` goes, which is what a write of ``key`` needs: another range's
        stream may be ahead); False if it was not within ``timeout_s`` (its watch lost, etcd
        slow: the caller reads what it needs itself)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._reached(key) < revision:
            left = deadline - loop.time()
            if left <= 0 or not await wait_event(self._advanced, left):
                return self._reached(key) >= revision
        return True

    def _reached(self, key: str | None) -> int:
        if key is None:
            return self.store.revision
        watch = next((i for i, (start, end) in enumerate(self._ranges) if start <= key < end), None)
        return self._seen[watch] if watch is not None else self.store.revision

    async def caught_up(self, timeout_s: float) -> None:
        """Make the copy hold every change its ranges had when this was called: one read of what
        changed since its revision, then, with a watch open, its news of that (within
        ``timeout_s``); else, or when it does not come, a list. Without a first list: that list.
        EtcdUnavailable when etcd cannot be asked."""
        if not self.store.listed:
            await self._list()
            return
        since = self.store.revision
        queries = [Query(start, end=end, min_mod_revision=since + 1) for start, end in self.store.held]
        found = await asyncio.to_thread(self._kv.read_many, queries)
        self.probes += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._holds(found):
            left = deadline - loop.time()
            if self.phase is not Phase.WATCHING or left <= 0 or not await wait_event(self._advanced, left):
                if not self._holds(found):
                    if self.phase is Phase.WATCHING:  # (a stalled stream: the safety net's catch)
                        _log.warning("informer.behind", informer=self._name, revision=self.store.revision)
                    await self._list()
                return

    def _holds(self, found: list[Found]) -> bool:
        """Whether the copy holds what ``found`` (each held range's changes since the copy's
        revision, and its count) says etcd had: its watch has news from after that read, or
        the newest change and as many keys (fewer: a deletion not heard of yet)."""
        for (start, end), f, w in zip(self.store.held, found, self._watch_of, strict=True):
            seen, newest = self._seen[w], max((kv.mod_revision for kv in f.kvs), default=0)
            if not (seen >= f.revision > 0 or (seen >= newest and f.count == self.store.count(start, end))):
                return False
        return True

    async def listed(self, timeout_s: float) -> None:
        """Wait for the first list; EtcdUnavailable if it did not come within ``timeout_s``."""
        if not self.store.listed and not await self.wait_for(1, timeout_s):
            raise EtcdUnavailable(f"the {self._name} copy could not be read from etcd yet")

    # -- keeping it current -----------------------------------------------------------------------
    async def run(self) -> None:
        """List, then watch; again whenever the watch is lost (module doc). Until cancelled."""
        try:
            await self._run()
        finally:  # no watch open: readers ask etcd
            self._enter(Phase.LISTING)

    async def _run(self) -> None:
        resume, failing = self.store.listed, False
        while True:
            if not resume:
                try:
                    await self._list()
                except EtcdUnavailable as exc:
                    if not failing:  # (once an outage: the next list says it is over)
                        _log.warning("informer.list_failed", informer=self._name, error=str(exc))
                    failing = True
                    await asyncio.sleep(RETRY_S)
                    continue
                failing = False
            broken = asyncio.Event()
            try:
                cancels = await self._open(broken)
            except EtcdUnavailable as exc:  # compacted, or etcd gone: list again
                _log.info("informer.relist", informer=self._name, why=str(exc)[:200])
                resume = False
                continue
            self._enter(Phase.WATCHING)
            try:
                await broken.wait()
            finally:
                for cancel in cancels:
                    cancel()
            resume = self._news
            self._enter(Phase.LISTING)
            _log.info("watch.rearm", informer=self._name, resume=resume)

    def _enter(self, phase: Phase) -> None:
        if phase is not self.phase:
            self.phase, self.phase_since = phase, time.monotonic()

    async def _list(self) -> None:
        queries = [Query(start, end=end) for start, end in self.store.held]
        found = await asyncio.to_thread(self._kv.read_many, queries)
        revision = max((f.revision for f in found), default=0)
        kvs = [kv for f in found for kv in f.kvs]
        if not revision:  # (a backend that does not tell: the newest key's is a safe lower bound)
            revision = max((kv.mod_revision for kv in kvs), default=1)
        self.lists += 1
        self.store.replace(kvs, revision)
        self._seen = [max(seen, revision) for seen in self._seen]
        self._report_bound()
        self._advance(None)

    async def _open(self, broken: asyncio.Event) -> list[Callable[[], None]]:
        """A watch of each range from the revision after its newest known; their cancels."""
        loop = asyncio.get_running_loop()
        self._news = False

        def on_broken() -> None:  # on the watch's thread
            loop.call_soon_threadsafe(broken.set)

        cancels: list[Callable[[], None]] = []
        try:
            for i, (start, end) in enumerate(self._ranges):

                def on_events(events: list[WatchEvent], i: int = i) -> None:  # on the watch's thread
                    loop.call_soon_threadsafe(self._apply, i, events)

                cancels.append(await _opened(self._kv, start, end, self._seen[i] + 1, on_events, on_broken))
        except BaseException:
            for cancel in cancels:
                cancel()
            raise
        return cancels

    def _apply(self, i: int, events: list[WatchEvent]) -> None:
        self._news = True
        self.events += len(events)
        self._seen[i] = max([self._seen[i], *(e.kv.mod_revision for e in events)])
        self.store.apply(events)
        self._report_bound()
        self._advance(events)

    def _advance(self, events: list[WatchEvent] | None) -> None:
        self._advanced.set()
        self._advanced = asyncio.Event()
        self._on_events(events)

    def _report_bound(self) -> None:
        store = self.store
        if store.state is Completeness.OVER_BOUND and store.left_out:
            _log.error(
                "informer.over_bound", informer=self._name, keys=len(store), bytes=store.size,
                left_out=store.left_out,
            )  # fmt: skip


def _covering(ranges: tuple[tuple[str, str], ...], held: tuple[str, str]) -> int:
    for i, (start, end) in enumerate(ranges):
        if start <= held[0] and held[1] <= end:
            return i
    raise ValueError(f"no watched range covers the held range {held}")


async def _opened(
    kv: KV,
    start: str,
    end: str,
    revision: int,
    on_events: Callable[[list[WatchEvent]], None],
    on_broken: Callable[[], None],
) -> Callable[[], None]:
    """``kv.watch_from`` in a thread; a caller cancelled meanwhile leaves no watch open."""
    opening = asyncio.ensure_future(
        asyncio.to_thread(kv.watch_from, start, end, revision, on_events, on_broken)
    )
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_cancel_opened)
        raise


def _cancel_opened(opening: asyncio.Future[Callable[[], None]]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result()()

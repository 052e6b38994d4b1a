"""The events subscriber: turns the daemon's typed records into cluster events and appends them
to the history in etcd, off the thread that published them.

``offer`` is called by ``elasticd.happenings.bus`` on any thread; it selects (``elasticd.history.select``) and
queues. One task on the daemon's loop appends, retrying while etcd is unreachable. The queue is
bounded: when etcd stays away that long, newer events are dropped (and counted) rather than
holding memory without limit. At shutdown, ``close`` gives what is queued a short time to reach
etcd, so a stop's own events (drains, leaving jobs) are recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from elasticd import log
from elasticd.decode import DecodeError
from elasticd.errors import EtcdUnavailable
from elasticd.happenings.records import Happening
from elasticd.history.model import ClusterEvent
from elasticd.history.select import select
from elasticd.history.store import AppendConflict, EventLog

_log = log.get("elasticd.history")

QUEUE_MAX = 1000
RETRY_S = 1.0
FLUSH_S = 3.0  # at shutdown, at most this long to write what is queued


class EventRecorder:
    def __init__(self, events: EventLog, node: str, clock: Callable[[], float] = time.time) -> None:
        self._events = events
        self._node = node
        self._clock = clock
        self._queue: asyncio.Queue[ClusterEvent] = asyncio.Queue(QUEUE_MAX)
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._writing = False
        self.dropped = 0
        self.recorded = 0

    def offer(self, happening: Happening) -> None:
        """A record (any thread): queue it if it is a cluster event."""
        selected = select(happening, self._node, self._clock())
        if selected is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: the daemon is gone
            self._loop.call_soon_threadsafe(self._put, selected)

    def _put(self, event: ClusterEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                _log.warning("events.dropped", dropped=self.dropped, why="etcd unreachable for long")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="events")

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            self._writing = True
            while True:
                try:
                    await asyncio.to_thread(self._events.append, event)
                    self.recorded += 1
                    break
                except EtcdUnavailable:
                    await asyncio.sleep(RETRY_S)
                except (AppendConflict, DecodeError) as exc:
                    _log.warning("events.unrecorded", kind=event.kind, job=event.job, why=str(exc))
                    break
            self._writing = False

    async def close(self, flush_s: float = FLUSH_S) -> None:
        """Give queued events ``flush_s`` to be written, then stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_s
        await asyncio.sleep(0)  # events offered just now are still in call_soon_threadsafe's queue
        while (self._writing or not self._queue.empty()) and loop.time() < deadline and self._task:
            await asyncio.sleep(0.05)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if not self._queue.empty():
            _log.warning("events.unflushed", events=self._queue.qsize())

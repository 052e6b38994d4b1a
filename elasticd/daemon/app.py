"""Lifecycle of one daemon: start in order, serve, shut down in reverse order.

Start: state dir lock -> reaper sidecar -> etcd (embedded or external) -> crash recovery ->
node lease -> control socket -> READY. SIGTERM and SIGINT take the same path as any stop:
stop serving, stop every job's workers, flush statuses, revoke the lease, stop etcd. What is
built, in which order, and how it is undone is ``elasticd.daemon.compose``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from elasticd import log
from elasticd.config import Settings
from elasticd.daemon import compose
from elasticd.happenings.bus import publish
from elasticd.happenings.records import DaemonStopping

_log = log.get("elasticd.daemon")


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started_at = time.time()
        self._stop = asyncio.Event()

    def request_stop(self, reason: str) -> None:
        publish(DaemonStopping(reason))
        self._stop.set()

    async def run(self) -> int:
        """Serve until asked to stop (0) or until a task crashes (1); every part is undone on the
        way out, however far the start got."""
        async with contextlib.AsyncExitStack() as stack:
            node = await compose.start(self.settings, stack, self.started_at, self.request_stop)
            crashed = asyncio.create_task(node.background.first_crash())
            stop = asyncio.create_task(self._stop.wait())
            await asyncio.wait({crashed, stop}, return_when=asyncio.FIRST_COMPLETED)
            code = 1 if crashed.done() else 0
            crashed.cancel()
            stop.cancel()
            return code

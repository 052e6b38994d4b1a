"""The node losses a daemon hears of: one watch per job of several nodes it takes part in (at most
one per slot: a stream each), on that job's presences (``presence/<job>/``), for deletions only.

A node's presence in a job goes when its agent has left or its lease has ended (a member may be
lost: the job's agents look). etcd filters the puts out (``deletes_only``), so a job of N nodes
forming sends its agents nothing, a node's loss reaches the daemons that share a job with it
once each, and no other daemon hears of it. Before, every daemon watched every node's record:
N events per node that came, went or was admitted, N² for a job of N nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from elasticd import log
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keyref import Change, KeyKind, KeyRef
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV, prefix_end

_log = log.get("elasticd.jobs")

REARM_S = 1.0  # after etcd refused a watch


class PresenceWatches:
    """A deletes-only watch per job, re-armed when its stream breaks; ``wake`` gets each deletion
    as a ``Change`` of the job (and one after a re-arm: what the broken stream missed is unknown)."""

    def __init__(self, kv: KV, keys: Keys, wake: Callable[[Change], None]) -> None:
        self._kv = kv
        self._keys = keys
        self._wake = wake
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def follow(self, job_id: str) -> None:
        """Watch ``job_id``'s presences from now on; returns once the watch exists (a deletion after
        this call is heard). Raises ``EtcdUnavailable`` if etcd refuses it."""
        if job_id in self._tasks:
            return
        broken = asyncio.Event()
        cancel = await self._arm(job_id, broken)
        self._tasks[job_id] = asyncio.create_task(
            self._keep(job_id, cancel, broken), name=f"presence-{job_id}"
        )

    def drop(self, job_id: str) -> None:
        task = self._tasks.pop(job_id, None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for job_id in list(self._tasks):
            self.drop(job_id)

    def followed(self) -> frozenset[str]:
        return frozenset(self._tasks)

    async def _arm(self, job_id: str, broken: asyncio.Event) -> Callable[[], None]:
        loop = asyncio.get_running_loop()
        start = self._keys.presences(job_id)

        def on_change(key: str, deleted: bool) -> None:  # on the watch's thread
            change = self._keys.route(key, deleted)
            if change is not None and change.job == job_id:
                loop.call_soon_threadsafe(self._wake, change)

        def on_broken() -> None:  # on the watch's thread
            loop.call_soon_threadsafe(broken.set)

        return await asyncio.to_thread(
            self._kv.watch_range, start, prefix_end(start), on_change, on_broken, True
        )

    async def _keep(self, job_id: str, cancel: Callable[[], None], broken: asyncio.Event) -> None:
        try:
            while True:
                await broken.wait()
                cancel()
                broken.clear()
                _log.info("presence.rearm", job=job_id)
                while True:
                    try:
                        cancel = await self._arm(job_id, broken)
                        break
                    except EtcdUnavailable:
                        await asyncio.sleep(REARM_S)
                self._wake(Change(job_id, KeyRef(KeyKind.PRESENCE, job_id), True))
        finally:
            with contextlib.suppress(Exception):
                cancel()

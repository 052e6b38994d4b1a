"""Reads how full etcd is, every few seconds, and keeps the last reading for those who ask.

``SpaceWatch`` is the executor of ``elasticd.etcd.space``: it reads etcd's status (the database
size and the alarms: two small requests to one member), turns it into a level through
``space.decide``, and logs each change of level. ``submit`` asks ``check_submit`` first (a refusal
with ``etcd_full`` that says what an operator does), the janitor asks for the reading to decide
its relief, ``nodes`` and the metrics show it. A failed read keeps the previous reading (its
``read_at`` ages): an unreachable etcd refuses submits on its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from elasticd import log
from elasticd.errors import EtcdFull, EtcdUnavailable
from elasticd.etcd.kv import KV
from elasticd.etcd.space import Space, SpaceLevel, SpaceLimits, decide

_log = log.get("elasticd.etcd")

READ_S = 5.0  # two small requests to one member; etcd fills at most a few MB/s even under a flood


class SpaceWatch:
    def __init__(
        self, kv: KV, limits: SpaceLimits, clock: Callable[[], float] = time.time, read_s: float = READ_S
    ) -> None:
        self._kv = kv
        self._clock = clock
        self.read_s = read_s
        self.space = Space(SpaceLevel.UNKNOWN, None, limits)

    def check_submit(self) -> None:
        """Raise ``EtcdFull`` while etcd is above its high-water mark or alarmed."""
        space = self.space
        if space.refuses_submits:
            raise EtcdFull(space.message(), **space.to_json())

    async def read(self) -> Space:
        """One reading; the level it gives is kept (and returned)."""
        try:
            status = await asyncio.to_thread(self._kv.status)
        except EtcdUnavailable as exc:
            _log.debug("etcd.status_failed", error=str(exc))
            return self.space
        old = self.space
        level = decide(status, old.limits, old.level)
        self.space = Space(level, status, old.limits, self._clock())
        if level is not old.level:
            self._report(old.level, self.space)
        return self.space

    def _report(self, old: SpaceLevel, space: Space) -> None:
        s = space.status
        fields = {"level": space.level.value, "was": old.value} | (
            {"db_size": s.db_size, "db_size_in_use": s.db_size_in_use, "alarms": list(s.alarms)}
            if s is not None
            else {}
        )
        if space.level is SpaceLevel.UNKNOWN:
            _log.warning("etcd.space_unknown", why="etcd keeps its status to its admins", **fields)
        elif space.refuses_submits:
            _log.warning("etcd.space", quota_bytes=space.limits.quota_bytes, advice=space.message(), **fields)
        else:
            _log.info("etcd.space", **fields)

    async def run(self) -> None:
        """Read every ``read_s`` until cancelled."""
        while True:
            await self.read()
            await asyncio.sleep(self.read_s)

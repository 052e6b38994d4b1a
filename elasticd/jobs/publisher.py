"""Publishes job status to etcd, latest value wins, surviving etcd outages.

Supervisors never wait on etcd: a state change is queued here and written in the background.
If etcd is away, the newest value per key is kept and written when it returns, so a job keeps
running through an etcd restart and its final status is not lost.
"""

from __future__ import annotations

import asyncio
from typing import Any

from elasticd import log
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.client import EtcdClient

_log = log.get("elasticd.publisher")


class StatusPublisher:
    def __init__(self, etcd: EtcdClient) -> None:
        self._etcd = etcd
        self._pending: dict[str, Any] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def publish(self, key: str, value: Any) -> None:
        self._pending[key] = value
        self._idle.clear()
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                key, value = next(iter(self._pending.items()))
                try:
                    await asyncio.to_thread(self._etcd.put_json, key, value)
                except EtcdUnavailable as exc:
                    _log.warning("status.publish_failed", key=key, error=str(exc))
                    await asyncio.sleep(1.0)
                    continue
                if self._pending.get(key) is value:
                    del self._pending[key]
            self._idle.set()

    async def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued is written; False if etcd did not take it in time."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            _log.warning("status.unflushed", keys=list(self._pending))
            return False

"""This node's lease and its ``nodes/<node>`` record.

The record (host, address, inventory, free slots) lives under a lease that we keep alive every
TTL/3. A clean stop revokes the lease, so the key disappears at once; after a SIGKILL it expires
within the TTL. If the lease is lost (etcd was away longer than the TTL) we grant a new one and
publish again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Any

from elasticd import __version__, log
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys

_log = log.get("elasticd.registry")


class NodeRegistry:
    def __init__(
        self,
        etcd: EtcdClient,
        keys: Keys,
        node_id: str,
        ttl_s: float,
        record: Callable[[], dict[str, Any]],
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self.node_id = node_id
        self.ttl_s = ttl_s
        self._record = record
        self.lease_id: int | None = None
        self._dirty = asyncio.Event()

    def full_record(self) -> dict[str, Any]:
        return {"node": self.node_id, "host": socket.gethostname(), "version": __version__} | self._record()

    async def start(self) -> None:
        await self._register()

    async def _register(self) -> None:
        self.lease_id = await asyncio.to_thread(self._etcd.grant_lease, self.ttl_s)
        await asyncio.to_thread(
            self._etcd.put_json, self._keys.node(self.node_id), self.full_record(), self.lease_id
        )
        _log.info("lease.granted", node=self.node_id, lease=self.lease_id, ttl_s=self.ttl_s)

    def publish_soon(self) -> None:
        """Ask for the record to be re-published (free capacity changed)."""
        self._dirty.set()

    async def run(self) -> None:
        """Keep the lease alive and the record current until cancelled."""
        interval = self.ttl_s / 3
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout=interval)
            changed = self._dirty.is_set()
            self._dirty.clear()
            try:
                if self.lease_id is None:
                    await self._register()
                    continue
                remaining = await asyncio.to_thread(self._etcd.refresh_lease, self.lease_id)
                if remaining <= 0:
                    _log.warning("lease.lost", node=self.node_id, lease=self.lease_id)
                    self.lease_id = None
                    await self._register()
                elif changed:
                    await asyncio.to_thread(
                        self._etcd.put_json, self._keys.node(self.node_id), self.full_record(), self.lease_id
                    )
            except EtcdUnavailable as exc:
                _log.warning("lease.refresh_failed", node=self.node_id, error=str(exc))
                await asyncio.sleep(min(1.0, interval))

    async def stop(self) -> None:
        if self.lease_id is None:
            return
        try:
            await asyncio.to_thread(self._etcd.revoke_lease, self.lease_id)
            _log.info("lease.revoked", node=self.node_id, lease=self.lease_id)
        except EtcdUnavailable as exc:
            _log.warning("lease.revoke_failed", node=self.node_id, error=str(exc))
        self.lease_id = None

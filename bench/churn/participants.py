"""Who takes part in a bench_node_churn run: light nodes (the real ``NodeRegistry``, their lease
calls on one shared pool) and observer daemons (a daemon's watches, counting what reaches it)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from elasticd.config import Settings
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import prefix_end
from elasticd.node.registry import NodeRegistry

T = TypeVar("T")
JOB, OTHER = "big-0a1b2c3d", "small-0a1b2c3d"
DEFAULTS = Settings()


def old_watched(keys: Keys) -> tuple[tuple[str, str], ...]:
    """What every daemon watched before: the whole prefix but ``parts/`` and ``specs/``."""
    return ((f"{keys.prefix}/", keys.all_parts()), (prefix_end(keys.specs()), prefix_end(f"{keys.prefix}/")))


class LightRegistry(NodeRegistry):
    """The real registry, its lease calls on a pool shared by every participant (one thread each
    would be N threads in this one process)."""

    pool: ThreadPoolExecutor
    revoke_sent = 0.0  # when its revoke left for etcd (monotonic)

    async def _lease_call(self, fn: Callable[..., T], *args: Any) -> T:
        def call() -> T:
            if getattr(fn, "__name__", "") == "revoke_lease":
                self.revoke_sent = time.monotonic()
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self.pool, call)


class Observer:
    """One daemon's watches, counting what reaches it."""

    def __init__(self, endpoint: str, keys: Keys, job: str, old: bool) -> None:
        self.keys, self.job = keys, job
        self.client = EtcdClient([endpoint], timeout_s=60)
        self._lock = threading.Lock()
        self.node_events = 0  # events of nodes/ and presence/ keys: what a node's change costs
        self.events = 0
        self.heard: dict[str, float] = {}  # node -> when its loss reached this daemon
        for start, end in old_watched(keys) if old else keys.watched():
            self.client.watch_range(start, end, self.on_change, lambda: None)
        if not old:
            gone = keys.presences(job)
            self.client.watch_range(gone, prefix_end(gone), self.on_change, lambda: None, True)

    def on_change(self, key: str, deleted: bool) -> None:
        now = time.monotonic()
        change = self.keys.route(key, deleted)
        with self._lock:
            self.events += 1
            if change is not None and change.kind in (KeyKind.NODE, KeyKind.PRESENCE):
                self.node_events += 1
                if deleted and change.ref is not None:
                    self.heard.setdefault(change.ref.node, now)

    def count(self) -> int:
        with self._lock:
            return self.node_events

    def close(self) -> None:
        self.client.close()

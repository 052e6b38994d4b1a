"""Wiring of what watches the daemon: the cluster event history and the metrics endpoint.

Both are subscribers of the daemon's typed bus (``elasticd.happenings.bus``): control logic only
publishes what happens. The metrics registry is this daemon's own (not prometheus_client's default).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.happenings import bus
from elasticd.history.recorder import EventRecorder
from elasticd.history.store import EventLog
from elasticd.manager.etcdspace import SpaceWatch
from elasticd.manager.jobmanager import JobManager
from elasticd.metrics.address import HostPort
from elasticd.metrics.counters import EventMetrics
from elasticd.metrics.server import MetricsServer
from elasticd.metrics.state import StateCollector, gather
from elasticd.node.registry import NodeRegistry


class Observability:
    def __init__(
        self,
        node_id: str,
        kv: KV,
        keys: Keys,
        metrics_address: HostPort | None,
        manager: JobManager,
        registry: NodeRegistry,
        space: SpaceWatch | None = None,
    ) -> None:
        self._manager, self._node_registry, self._space = manager, registry, space
        self.recorder = EventRecorder(EventLog(kv, keys), node_id)
        self.registry = CollectorRegistry()
        self.metrics = EventMetrics(self.registry)
        self._address = metrics_address
        self._server: MetricsServer | None = None
        self._unsubscribe: list[Callable[[], None]] = []

    async def start(self) -> None:
        """Subscribe, start recording, and serve metrics if asked (ConfigError if it cannot listen)."""
        self.recorder.start()
        self._unsubscribe.append(bus.subscribe(self.recorder.offer))
        if self._address is None:
            return
        collector = StateCollector()
        self.registry.register(collector)

        manager, registry, space = self._manager, self._node_registry, self._space

        async def refresh() -> None:
            collector.update(await gather(manager, registry, space.space if space is not None else None))

        self._unsubscribe.append(bus.subscribe(self.metrics.observe))
        self._server = MetricsServer(self._address, self.registry, refresh)
        await self._server.start()

    async def close(self) -> None:
        """Stop serving, then give the last events a moment to reach etcd. Idempotent."""
        while self._unsubscribe:
            self._unsubscribe.pop()()
        if self._server is not None:
            await self._server.close()
            self._server = None
        await self.recorder.close()

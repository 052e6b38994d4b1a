"""Carrying out the GPU health watcher's verdicts: the GPU leaves the pool, its job goes on without it.

The verdicts come from ``node/gpuwatch.py`` (a thread) through a queue; the marks in etcd and the
allocator's ``out`` are ``GpuPool``'s. A job holding a GPU out of the pool leaves this node (no
restart spent), and the scan admits it again where enough healthy GPUs are free.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from elasticd import log
from elasticd.agent.executor import JobAgent
from elasticd.errors import EtcdUnavailable
from elasticd.gpu.health import Verdict
from elasticd.happenings.bus import publish
from elasticd.happenings.records import GpuUnhealthy
from elasticd.jobs.attempt import NodeRuntime
from elasticd.manager.admitter import Admitter
from elasticd.manager.gpus import GpuPool
from elasticd.node.registry import NodeRegistry
from elasticd.terms.state import RoundReason

_log = log.get("elasticd.jobs")


class GpuHealth:
    """The verdicts on this node's GPUs, carried out against the jobs in ``agents`` (``JobManager``'s);
    ``wake_scan`` is told when a GPU left the pool."""

    def __init__(
        self,
        rt: NodeRuntime,
        gpus: GpuPool,
        admitter: Admitter,
        registry: NodeRegistry,
        agents: Mapping[str, JobAgent],
        wake_scan: Callable[[], None],
    ) -> None:
        self.rt = rt
        self.gpus = gpus
        self.admitter = admitter
        self._registry = registry
        self.agents = agents
        self._wake_scan = wake_scan

    async def watch_gpus(self, verdicts: asyncio.Queue[tuple[str, Verdict]]) -> None:
        """Carry out the health watcher's verdicts (``node/gpuwatch.py``), one at a time."""
        while True:
            uuid, verdict = await verdicts.get()
            try:
                await self.gpu_unhealthy(uuid, verdict)
            except EtcdUnavailable as exc:  # the mark is kept and written at the next scan
                _log.warning("gpu.report_failed", uuid=uuid, error=str(exc))

    async def gpu_unhealthy(self, uuid: str, verdict: Verdict) -> None:
        """Take the GPU out of the pool; the job holding it goes on without it (``leave_bad_gpus``)."""
        if not self.gpus.known(uuid):
            return
        holders = self.admitter.allocator.holders(self.gpus.slots_of({uuid}))
        await self.gpus.report(uuid, verdict, holders[0] if holders else None, time.time())
        publish(
            GpuUnhealthy(
                self.rt.node_id, uuid, verdict.fault, verdict.reason, holders[0] if holders else None
            )
        )
        self.leave_bad_gpus()
        self._registry.publish_soon()
        self._wake_scan()

    def leave_bad_gpus(self) -> None:
        """Every job holding a GPU out of the pool leaves (no restart spent); the scan admits it
        again where enough healthy GPUs are free."""
        out = self.admitter.allocator.out
        for job_id in self.admitter.allocator.holders(out):
            agent = self.agents.get(job_id)
            if agent is None:
                continue
            bad = sorted(
                {
                    self.rt.inventory.gpus[self.rt.inventory.devices[s].gpu].uuid
                    for s in set(agent.slots) & out
                }
            )
            reasons = "; ".join(f"{u}: {self.gpus.marks[u].reason}" for u in bad if u in self.gpus.marks)
            agent.leave(RoundReason.GPU_FAILED, f"GPU unhealthy on {self.rt.node_id} ({reasons})")

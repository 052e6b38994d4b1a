"""The lease keep-alive has a thread of its own: slow or many agent calls cannot delay it."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.node.registry import NodeRegistry

pytestmark = pytest.mark.timeout(30)


def test_keepalive_runs_while_the_default_executor_is_saturated() -> None:
    async def scenario() -> None:
        deadlines: list[float] = []
        reaper = SimpleNamespace(set_deadline=deadlines.append)
        registry = NodeRegistry(MemoryKV(), Keys("/t"), "n1", 2.0, lambda: {"slots": 1}, reaper)  # type: ignore[arg-type]
        await registry.start()
        granted = registry.deadline
        release = threading.Event()
        # Far more blocking calls than the default executor has threads: every later to_thread
        # call (as the agents' store calls are) queues behind them until they are released.
        blockers = [asyncio.ensure_future(asyncio.to_thread(release.wait, 20)) for _ in range(64)]
        keepalive = asyncio.create_task(registry.run())
        try:
            moved = time.monotonic() + 10
            while registry.deadline == granted and time.monotonic() < moved:
                await asyncio.sleep(0.05)
            # The keep-alive moved the deadline while every default thread was still blocked.
            assert registry.deadline > granted
            assert not any(b.done() for b in blockers)
            assert len(deadlines) >= 2
        finally:
            release.set()
            keepalive.cancel()
            await asyncio.gather(keepalive, *blockers, return_exceptions=True)
            await registry.stop()

    asyncio.run(scenario())


def test_under_nospace_the_lease_is_kept_and_a_changed_record_waits_for_room() -> None:
    """etcd refuses the record's write under NOSPACE but not the keep-alive: the lease stays, no
    failure is counted, and the record is written once etcd has room."""

    async def scenario() -> None:
        kv = MemoryKV()
        record = {"slots": 1}
        reaper = SimpleNamespace(set_deadline=lambda _: None)
        registry = NodeRegistry(kv, Keys("/t"), "n1", 2.0, lambda: dict(record), reaper)  # type: ignore[arg-type]
        await registry.start()
        lease = registry.lease_id
        keepalive = asyncio.create_task(registry.run())
        try:
            kv.alarms.add("NOSPACE")
            record["slots"] = 2
            registry.publish_soon()
            renewed = registry.renewals
            deadline = time.monotonic() + 10
            while registry.renewals < renewed + 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # three keep-alives: longer than the 2 s TTL
            assert registry.renewals >= renewed + 3 and registry.lease_id == lease
            node = kv.get("/t/nodes/n1")
            assert node is not None and node.json()["slots"] == 1  # not written: no room
            kv.alarms.discard("NOSPACE")
            while time.monotonic() < deadline and (kv.get("/t/nodes/n1") or node).json()["slots"] != 2:
                await asyncio.sleep(0.05)
            assert (kv.get("/t/nodes/n1") or node).json()["slots"] == 2 and registry.lease_id == lease
        finally:
            keepalive.cancel()
            await asyncio.gather(keepalive, return_exceptions=True)
            await registry.stop()

    asyncio.run(scenario())

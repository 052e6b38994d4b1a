"""The phases of a bench_node_churn run: what the observers hear while the nodes come, are
admitted and go; an agent's read of its live nodes; and the cluster at rest."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

from churn.etcdstats import cpu_s, scrape
from churn.participants import DEFAULTS, JOB, LightRegistry, Observer
from churn.report import Phase, Rest
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from elasticd.etcd.space import SpaceLimits
from elasticd.jobs.attempt import NodeRuntime
from elasticd.manager.etcdspace import READ_S, SpaceWatch
from elasticd.manager.jobmanager import JobManager
from elasticd.node.inventory import Inventory
from elasticd.node.registry import NodeRegistry
from elasticd.node.statedir import StateDir


def _per_change(counts: list[int], changes: int) -> tuple[float, float]:
    per = [c / changes for c in counts] if changes else [0.0]
    return statistics.median(per), max(per)


async def run_phase(
    name: str, changes: int, observers: list[Observer], act: Callable[[], Any], settle: Callable[[], bool]
) -> Phase:
    """Run ``act``, wait until ``settle()`` and the observers are quiet, and count what they heard."""
    before = [o.count() for o in observers]
    t0 = time.monotonic()
    await act()
    deadline = time.monotonic() + 120
    while not settle() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    seconds = time.monotonic() - t0
    last = [o.count() for o in observers]
    while time.monotonic() < deadline:  # until no event arrived for a second
        await asyncio.sleep(1.0)
        now = [o.count() for o in observers]
        if now == last:
            break
        last = now
    got = [a - b for a, b in zip(last, before, strict=True)]
    half = len(observers) // 2
    return Phase(name, changes, seconds, _per_change(got[:half], changes), _per_change(got[half:], changes))


def _manager(registry: NodeRegistry, client: EtcdClient, keys: Keys, tmp: Path) -> JobManager:
    """A daemon's ``JobManager`` as far as its scan goes (no workers: no job is admitted here)."""
    rt = NodeRuntime(registry.node_id, "127.0.0.1", tmp, Inventory((), 8), SimpleNamespace())  # type: ignore[arg-type]
    return JobManager(rt, client, keys, StateDir(tmp), registry)


async def go_phase(
    gone: list[LightRegistry],
    tasks: dict[str, asyncio.Task[None]],
    watching: list[Observer],
    observers: list[Observer],
) -> Phase:
    """Half the nodes stop (their leases revoked): who hears of it, and how soon after the revoke."""
    revoked: dict[str, float] = {}

    async def go() -> None:
        async def stop(r: LightRegistry) -> None:
            tasks[r.node_id].cancel()  # a daemon that stops: no keep-alive registers it again
            await r.stop()
            revoked[r.node_id] = r.revoke_sent

        await asyncio.gather(*(stop(r) for r in gone))

    heard_all = lambda: all(len(o.heard) >= len(gone) for o in watching)  # noqa: E731
    phase = await run_phase("go", len(gone), observers, go, heard_all)
    lags = [o.heard[node] - at for o in watching for node, at in revoked.items() if node in o.heard]
    phase.heard_s = (statistics.median(lags), max(lags)) if lags else None
    return phase


async def alive_read(reg: NodeRegistry, metrics: str, old: bool) -> tuple[float, float]:
    """What one agent's read of its job's live nodes costs: the presences, or (``old``) every
    node's record, as ``NodeRegistry.alive`` read them."""
    sent = "etcd_network_client_grpc_sent_bytes_total"
    times, sizes = [], []
    for _ in range(5):
        before, t0 = scrape(metrics)[sent], time.monotonic()
        if old:
            await asyncio.to_thread(reg.live_nodes)
        else:
            await reg.present(JOB)
        times.append(time.monotonic() - t0)
        sizes.append(scrape(metrics)[sent] - before)
    return statistics.median(times), statistics.median(sizes)


async def rest(
    regs: list[LightRegistry], clients: list[EtcdClient], keys: Keys, metrics: str, etcd_pid: int,
    args: argparse.Namespace,
) -> Rest:  # fmt: skip
    """The cluster at rest for ``--rest-s``: keep-alives, and the periodic parts ``--rest`` names."""
    parts = set(args.rest.split(","))
    extra: list[asyncio.Task[None]] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-churn-"))
    for i, r in enumerate(regs):
        client = clients[i % len(clients)]
        if "space" in parts:
            watch = SpaceWatch(client, SpaceLimits(DEFAULTS.etcd_quota_bytes, DEFAULTS.etcd_high_water))
            extra.append(asyncio.create_task(_after(i * READ_S / len(regs), watch.run())))
        if "scan" in parts:
            manager = _manager(r, client, keys, tmp / r.node_id)
            extra.append(asyncio.create_task(_after(i * 10.0 / len(regs), manager.run())))
    await asyncio.sleep(args.warm_s)  # past the first (full) scans and the spread of the starts
    etcd, me = psutil.Process(etcd_pid), psutil.Process()
    a, cpu0, mine0, t0 = scrape(metrics), cpu_s(etcd), cpu_s(me), time.monotonic()
    await asyncio.sleep(args.rest_s)
    b, cpu1, mine1, t1 = scrape(metrics), cpu_s(etcd), cpu_s(me), time.monotonic()
    for t in extra:
        t.cancel()
    await asyncio.gather(*extra, return_exceptions=True)
    dt = t1 - t0
    methods = {k[4:]: (b[k] - a.get(k, 0.0)) / dt for k in b if k.startswith("req:") and b[k] > a.get(k, 0.0)}
    recv, sent = "etcd_network_client_grpc_received_bytes_total", "etcd_network_client_grpc_sent_bytes_total"
    etcd_pct, mine_pct = 100 * (cpu1 - cpu0) / dt, 100 * (mine1 - mine0) / dt
    return Rest(
        dt, sum(methods.values()), methods, (b[recv] - a[recv]) / dt, (b[sent] - a[sent]) / dt,
        etcd_pct, len(regs) / (args.ttl / 4), mine_pct, ",".join(sorted(parts)),
    )  # fmt: skip


async def _after(delay_s: float, coro: Any) -> None:
    await asyncio.sleep(delay_s)  # daemons do not start in step
    await coro

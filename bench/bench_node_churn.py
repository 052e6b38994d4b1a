"""What nodes that come, get admitted and go cost each daemon's watch, and what a cluster at rest
costs etcd per second.

N light participants run the real node code against one real etcd (loopback TCP, its /metrics
scraped): each a ``NodeRegistry`` (lease, ``nodes/<node>`` record, keep-alive every TTL/4,
presence in its job), and at rest also the periodic work a daemon does besides its keep-alive
(``--rest``): ``SpaceWatch`` (etcd's status every ``READ_S``) and ``JobManager.run``'s safety-net
scan (``SCAN_S``; a full one every ``FULL_SCAN_S``). The registries share a pool of lease threads
and a few clients (a daemon has its own: the requests etcd sees are the same).

The watches are measured on W observer daemons (each its own client and streams, routed as a
daemon's are), half of them members of the job every participant joins, half of another job:
what one daemon receives does not depend on how many others watch. ``--layout old`` arms the
ranges a daemon watched before (everything but ``parts/`` and ``specs/``: every node record);
``new`` arms today's (``Keys.watched``) and, as ``PresenceWatches`` does, the deletions of its
job's presences.

Phases, per N: come (every registry registers), admit (each enters the job and rewrites its
record: its free slots changed), rest (``--rest-s``: etcd requests/s, bytes/s, CPU), go (half
the nodes stop: their leases revoked). Reported per phase: watch events per observer per node
change (median/max, members and others apart), and for ``go`` how long after the revoke a member
observer heard the loss.

    python bench/bench_node_churn.py --sizes 256,1024 --layout both --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import psutil

from elasticd import log
from elasticd.config import Settings
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import KeyKind, Keys
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.space import SpaceLimits
from elasticd.jobs.launch import NodeRuntime
from elasticd.manager.etcdspace import READ_S, SpaceWatch
from elasticd.manager.jobs import JobManager
from elasticd.node.inventory import Inventory
from elasticd.node.registry import NodeRegistry
from elasticd.node.statedir import StateDir
from tests.support import EtcdServer

T = TypeVar("T")
JOB, OTHER = "big-0a1b2c3d", "small-0a1b2c3d"
DEFAULTS = Settings()
TTL_S = DEFAULTS.lease_ttl
NODES_PER_CLIENT = 64


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


@dataclass
class Phase:
    name: str
    changes: int
    seconds: float
    member_events: tuple[float, float]  # per observer per node change: median, max
    other_events: tuple[float, float]
    # go: from the revoke's request to a member observer's event (median, max)
    heard_s: tuple[float, float] | None = None


@dataclass
class Rest:
    seconds: float
    requests_s: float
    by_method: dict[str, float]
    received_bytes_s: float
    sent_bytes_s: float
    etcd_cpu_pct: float
    expected_keepalives_s: float
    harness_cpu_pct: float
    parts: str


@dataclass
class Outcome:
    n: int
    layout: str
    load: str
    phases: list[Phase] = field(default_factory=list)
    rest: Rest | None = None
    # An agent's read of its live nodes (``JobLease.alive``: the job's presences; before, every
    # node's record): seconds and bytes etcd sent, median of 5
    alive_read_s: float = 0.0
    alive_read_bytes: float = 0.0


def scrape(metrics_url: str) -> dict[str, float]:
    """The etcd counters this bench reads, summed over their labels (per method for requests)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^(\w+)(\{[^}]*\})?\s+(\S+)$", line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "grpc_server_handled_total":
            method = re.search(r'grpc_method="(\w+)"', labels)
            key = f"req:{method.group(1) if method else '?'}"
            out[key] = out.get(key, 0.0) + value
        elif name in (
            "etcd_network_client_grpc_received_bytes_total",
            "etcd_network_client_grpc_sent_bytes_total",
            "process_cpu_seconds_total",
        ):
            out[name] = out.get(name, 0.0) + value
    return out


def _per_change(counts: list[int], changes: int) -> tuple[float, float]:
    per = [c / changes for c in counts] if changes else [0.0]
    return statistics.median(per), max(per)


async def _phase(
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


async def run_size(
    endpoint: str, metrics: str, etcd_pid: int, n: int, args: argparse.Namespace, old: bool
) -> Outcome:
    keys = Keys(f"/bench/{'old' if old else 'new'}{n}-{int(time.time())}")
    out = Outcome(n, "old" if old else "new", os.getloadavg().__repr__())
    LightRegistry.pool = ThreadPoolExecutor(args.threads, thread_name_prefix="lease")
    clients = [EtcdClient([endpoint], timeout_s=60) for _ in range(max(1, -(-n // NODES_PER_CLIENT)))]
    half = args.observers // 2
    observers = [Observer(endpoint, keys, JOB if i < half else OTHER, old) for i in range(args.observers)]
    free = [8] * n
    reaper = SimpleNamespace(set_deadline=lambda _: None)

    def record(i: int) -> dict[str, Any]:
        return {"slots": 8, "free_slots": free[i]}

    client_of = [clients[i % len(clients)] for i in range(n)]
    regs = [
        LightRegistry(client_of[i], keys, f"node-{i:05d}", args.ttl, functools.partial(record, i), reaper)  # type: ignore[arg-type]
        for i in range(n)
    ]
    tasks: dict[str, asyncio.Task[None]] = {}
    try:

        async def come() -> None:
            await asyncio.gather(*(r.start() for r in regs))
            tasks.update((r.node_id, asyncio.create_task(r.run())) for r in regs)

        out.phases.append(await _phase("come", n, observers, come, lambda: True))

        async def admit() -> None:
            await asyncio.gather(*(r.enter(JOB) for r in regs))
            for i, r in enumerate(regs):
                free[i] = 0
                r.publish_soon()

        written = lambda: all(r._published is not None and r._published["free_slots"] == 0 for r in regs)  # noqa: E731
        out.phases.append(await _phase("admit", n, observers, admit, written))
        out.alive_read_s, out.alive_read_bytes = await _alive_read(regs[0], metrics, old)
        out.rest = await _rest(regs, clients, keys, metrics, etcd_pid, args)

        out.phases.append(await _go_phase(regs[: n // 2], tasks, observers[:half], observers))
    finally:
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await asyncio.gather(*(r.stop() for r in regs), return_exceptions=True)
        for o in observers:
            o.close()
        for c in clients:
            c.close()
        LightRegistry.pool.shutdown(wait=False)
    return out


async def _go_phase(
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
    phase = await _phase("go", len(gone), observers, go, heard_all)
    lags = [o.heard[node] - at for o in watching for node, at in revoked.items() if node in o.heard]
    phase.heard_s = (statistics.median(lags), max(lags)) if lags else None
    return phase


async def _alive_read(reg: NodeRegistry, metrics: str, old: bool) -> tuple[float, float]:
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


async def _rest(
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
    a, cpu0, mine0, t0 = scrape(metrics), _cpu(etcd), _cpu(me), time.monotonic()
    await asyncio.sleep(args.rest_s)
    b, cpu1, mine1, t1 = scrape(metrics), _cpu(etcd), _cpu(me), time.monotonic()
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


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def report(outcomes: list[Outcome]) -> None:
    print()
    print(
        f"{'N':>6} {'layout':<6} {'phase':<6} {'changes':>7} {'s':>6}  events/daemon/change:"
        " member med/max   other med/max   loss heard (s) med/max"
    )
    for o in outcomes:
        for p in o.phases:
            heard = f"{p.heard_s[0]:.3f}/{p.heard_s[1]:.3f}" if p.heard_s else "-"
            print(
                f"{o.n:>6} {o.layout:<6} {p.name:<6} {p.changes:>7} {p.seconds:>6.2f}"
                f"  {p.member_events[0]:>22.2f}/{p.member_events[1]:<6.2f}"
                f" {p.other_events[0]:>8.2f}/{p.other_events[1]:<6.2f} {heard:>16}"
            )
    print()
    for o in outcomes:
        print(
            f"{o.n:>6} {o.layout:<6} an agent's read of its live nodes: {o.alive_read_s * 1000:.1f} ms,"
            f" {o.alive_read_bytes / 1024:.1f} KiB sent by etcd"
        )
    print()
    print(
        f"{'N':>6} {'layout':<6} {'rest parts':<20} {'req/s':>8} {'keepalive exp.':>14} {'recv B/s':>10}"
        f" {'sent B/s':>10} {'etcd CPU %':>10} {'harness %':>9}  by method"
    )
    for o in outcomes:
        r = o.rest
        if r is None:
            continue
        methods = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.by_method.items(), key=lambda kv: -kv[1]))
        print(
            f"{o.n:>6} {o.layout:<6} {r.parts:<20} {r.requests_s:>8.1f} {r.expected_keepalives_s:>14.1f}"
            f" {r.received_bytes_s:>10.0f} {r.sent_bytes_s:>10.0f} {r.etcd_cpu_pct:>10.1f}"
            f" {r.harness_cpu_pct:>9.1f}  {methods}"
        )


def _exit_on_term(_signo: int, _frame: object) -> None:
    raise SystemExit(143)  # so that etcd is stopped (``finally``)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_term)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256,1024")
    p.add_argument("--layout", choices=["old", "new", "both"], default="both")
    p.add_argument("--observers", type=int, default=16, help="observer daemons (half in the job)")
    p.add_argument("--threads", type=int, default=32, help="lease threads shared by the registries")
    p.add_argument("--rest", default="keepalive,space,scan", help="what runs at rest, besides keep-alives")
    p.add_argument("--rest-s", type=float, default=30.0)
    p.add_argument(
        "--ttl", type=float, default=TTL_S,
        help="lease TTL (default: the daemon's); longer where this one process cannot keep N leases alive",
    )  # fmt: skip
    p.add_argument("--warm-s", type=float, default=12.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    log.configure(level="warning")
    layouts = {"old": [True], "new": [False], "both": [True, False]}[args.layout]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="elasticd-bench-churn-") as tmp:
        etcd = EtcdServer(Path(tmp))
        etcd.start()
        assert etcd.proc is not None
        metrics = f"http://127.0.0.1:{etcd.client_port}/metrics"
        try:
            for n in (int(s) for s in args.sizes.split(",")):
                for old in layouts:
                    outcomes.append(
                        asyncio.run(run_size(etcd.endpoint, metrics, etcd.proc.pid, n, args, old))
                    )
                    print(json.dumps(asdict(outcomes[-1])), flush=True)
        finally:
            etcd.stop()
    print(f"uptime: {os.popen('uptime').read().strip()}")
    report(outcomes)
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

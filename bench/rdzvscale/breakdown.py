"""Where etcd's CPU goes per participant of a round: each request a participant makes (and the
watch it holds) measured alone, many times, from several client threads, on each client (the
JSON gateway and grpc), with etcd's CPU per operation read off its process (psutil).

A participant of a round of N makes, in order: a lease, its join (which answers with a glance
read in the same transaction), its status, two watch streams (the manager's ranges), one watch
event (the round's head), a glance once the round closed and its read of the job with its own
assignment. Each is played here
``OPS`` times against a job whose round holds N joins (as the round's last joiners see it), and
the sum is set beside what a whole round cost etcd per participant (``Outcome.etcd_cpu_s / n``).
The glance is measured twice: before the leader claimed the round (the oldest join: what every
glance cost before the lead key, and still costs in a round's first moments) and after.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from elasticd.etcd.backend import connect
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import Backend
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.store import InlineJobStore, run_inline
from rdzvscale.etcdrates import cpu_s
from rdzvscale.node import spec_for

THREADS = 8  # client threads at once, each with its own client (as nodes have)
OPS = 400  # operations of each kind, over all threads
WATCHERS = 256  # watch streams one head event is delivered to
# Measured, but no part of a participant's sum: a glance in the open round, which a joiner no
# longer makes (its join answers with one, read in the same transaction), before the leader
# claimed the round (the oldest join, a sort of every join: what every glance cost before the
# lead key) and after (what a member woken while the round is open pays).
ASIDE = frozenset({"glance_unclaimed", "glance_open"})


@dataclass
class Breakdown:
    """etcd's CPU per operation of each kind (µs), and the client's wall time per operation."""

    client: str
    n: int
    etcd_us: dict[str, float] = field(default_factory=dict)
    wall_ms: dict[str, float] = field(default_factory=dict)

    @property
    def per_participant_us(self) -> float:
        """What one participant's requests and watch cost etcd in all (each kind once; the
        watch streams counted as opened and closed; the unclaimed glance is the one before)."""
        return sum(us for name, us in self.etcd_us.items() if name not in ASIDE)


class _Round:
    """A job whose round 0 holds ``n`` joins, its store and the clients the threads use."""

    def __init__(self, endpoint: str, kind: str, n: int) -> None:
        self.keys, self.job = Keys(f"/bench/breakdown-{time.time_ns()}"), "breakdown"
        self.endpoint, self.kind, self.n = endpoint, kind, n
        self.owner = connect(kind, [endpoint], timeout_s=60)
        self.store = InlineJobStore(self.owner, self.keys, self.job)
        run_inline(self.store.create(spec_for(n + OPS, self.job)))
        run_inline(self.store.read(statuses=False))  # the head the guards name
        self.lease = self.owner.grant_lease(600)
        self.clients = [connect(kind, [endpoint], timeout_s=60) for _ in range(THREADS)]
        self.stores = [InlineJobStore(c, self.keys, self.job) for c in self.clients]
        for s in self.stores:
            run_inline(s.read(statuses=False))
        for i in range(n):
            run_inline(self.store.join(0, Join(_node(i), "127.0.0.1", 29500, 8), self.lease))

    def claim(self) -> tuple[float, float]:
        """The oldest join's node claims the round, as its leader does while it waits for joins
        (once per round: not measured, (0, 0))."""
        first = run_inline(self.store.join_of(0, _node(0)))
        assert first is not None
        assert run_inline(self.store.claim_lead(0, first.node, first.create_revision, self.lease))
        return 0.0, 0.0

    def close_round(self) -> None:
        joins = run_inline(self.store.read_rosters(statuses=False)).current_joins
        result = rdzv.build_result(0, joins, time.time(), joins[0].create_revision)
        assert run_inline(self.store.close(result, joins[0].node))

    def stop(self) -> None:
        self.owner.revoke_lease(self.lease)
        self.owner.delete_prefix(f"{self.keys.prefix}/")
        for c in [self.owner, *self.clients]:
            c.close()


def _node(i: int) -> str:
    return f"node-{i:05d}"


def _measure(pid: int | None, ops: Callable[[int, int], None]) -> tuple[float, float]:
    """``ops(thread, i)`` for i in 0..OPS-1 spread over ``THREADS`` threads: etcd's CPU per
    operation (µs) and the wall time per operation of one thread (ms)."""

    def worker(k: int) -> None:
        for i in range(k, OPS, THREADS):
            ops(k, i)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    cpu, t = cpu_s(pid), time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall, cpu = time.perf_counter() - t, cpu_s(pid) - cpu
    return 1e6 * cpu / OPS, 1e3 * wall * THREADS / OPS


def _watch_open(r: _Round, pid: int | None) -> tuple[float, float]:
    """A node's two watch streams (``Keys.watched``), opened and closed."""

    def op(k: int, _i: int) -> None:
        client = r.clients[k]
        cancels = [client.watch_range(a, b, lambda _k, _d: None, lambda: None) for a, b in r.keys.watched()]
        for cancel in cancels:
            cancel()

    return _measure(pid, op)


def _head_event(r: _Round, pid: int | None) -> tuple[float, float]:
    """One put of a key under ``jobs/`` delivered to ``WATCHERS`` nodes' watch streams (each node
    holds both of its ranges open; one of them carries the event): etcd's CPU per delivery."""
    got = threading.Semaphore(0)
    clients: list[Backend] = [connect(r.kind, [r.endpoint], timeout_s=60) for _ in range(WATCHERS // 16)]
    cancels = [
        clients[i % len(clients)].watch_range(a, b, lambda _k, _d: got.release(), lambda: None)
        for i in range(WATCHERS)
        for a, b in r.keys.watched()
    ]
    cpu, t = cpu_s(pid), time.perf_counter()
    r.owner.put_json(r.keys.job_restarts(r.job), 0)
    for _ in range(WATCHERS):
        got.acquire(timeout=60)
    wall, cpu = time.perf_counter() - t, cpu_s(pid) - cpu
    for cancel in cancels:
        cancel()
    for c in clients:
        c.close()
    return 1e6 * cpu / WATCHERS, 1e3 * wall / WATCHERS


def breakdown(endpoint: str, pid: int | None, kind: str, n: int) -> Breakdown:
    """Each of a participant's operations against a round of ``n`` joins, over client ``kind``."""
    r = _Round(endpoint, kind, n)
    out = Breakdown(kind, n)
    leases: list[int] = []

    def lease(k: int, _i: int) -> None:
        leases.append(r.clients[k].grant_lease(300))

    def join(k: int, i: int) -> None:
        run_inline(r.stores[k].join(0, Join(_node(n + i), "127.0.0.1", 29500, 8), r.lease))

    def status(k: int, i: int) -> None:
        body = {"state": "JOINING", "round": -1, "devices": "", "pids": [], "updated_at": time.time()}
        run_inline(r.stores[k].put_node_status(_node(i), body, r.lease))

    def glance(k: int, i: int) -> None:
        run_inline(r.stores[k].glance(0, _node(i % n)))

    def member_read(k: int, i: int) -> None:
        read = run_inline(r.stores[k].read_member(_node(i % n), 0, statuses=False))
        assert read.me(_node(i % n)) is not None

    try:
        steps: list[tuple[str, Callable[[], tuple[float, float]]]] = [
            ("lease", lambda: _measure(pid, lease)),
            ("join", lambda: _measure(pid, join)),
            ("status", lambda: _measure(pid, status)),
            ("glance_unclaimed", lambda: _measure(pid, glance)),
            ("claim", lambda: r.claim()),
            ("glance_open", lambda: _measure(pid, glance)),
            ("watch_open", lambda: _watch_open(r, pid)),
            ("head_event", lambda: _head_event(r, pid)),
        ]
        for name, run in steps:
            cost = run()
            if name != "claim":  # (once per round, by its leader)
                out.etcd_us[name], out.wall_ms[name] = cost
        r.close_round()
        for name, fn in (("glance_closed", glance), ("member_read", member_read)):
            out.etcd_us[name], out.wall_ms[name] = _measure(pid, fn)
        for lease_id in leases:
            r.owner.revoke_lease(lease_id)
    finally:
        r.stop()
    return out


def report_breakdowns(parts: list[Breakdown]) -> None:
    """One row per kind of operation, one column per client: etcd's CPU per operation (µs)."""
    if not parts:
        return
    print(f"\netcd CPU per operation (µs), a round of {parts[0].n} joins:")
    print(f"{'operation':<15}" + "".join(f"{b.client:>10}" for b in parts))
    for name in parts[0].etcd_us:
        print(f"{name:<15}" + "".join(f"{b.etcd_us.get(name, 0.0):>10.0f}" for b in parts))
    print(f"{'per participant':<15}" + "".join(f"{b.per_participant_us:>10.0f}" for b in parts))

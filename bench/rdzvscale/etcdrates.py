"""What etcd costs per operation on this machine (``etcd_rates``, for ``rdzv_model``), and a
process's CPU time (etcd's, over a round)."""

from __future__ import annotations

import json
import statistics
import threading
import time

import psutil

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous import roster
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.store import InlineJobStore, run_inline
from rdzvscale.meter import CountingClient
from rdzvscale.node import spec_for

RATE_READERS = 8  # client threads that read at once while etcd's read rate is measured
RATE_READS = 400  # member reads (glance + its read of the job) they make in all
RATE_MEMBERS = 2400  # assignments written (20 transactions) while the write rate is measured
RATE_WATCHERS = 200  # watch streams one put is sent to while the fan-out is measured


def etcd_rates(endpoint: str, pid: int | None) -> dict[str, float]:
    """What etcd does per operation on this machine, for ``rdzv_model``: a member's reads (the
    glance and its read of the job: requests per second, etcd CPU per request, bytes per
    request), the leader's transactions of assignments (seconds and etcd CPU per transaction,
    bytes per second) and its read of every join (seconds per join, parsed)."""
    prefix = f"/bench/rates-{time.time_ns()}"
    keys, job_id = Keys(prefix), "rates"
    client = EtcdClient([endpoint], timeout_s=60)
    store = InlineJobStore(client, keys, job_id)
    run_inline(store.create(spec_for(RATE_MEMBERS, job_id)))
    lease = client.grant_lease(300)
    for i in range(RATE_MEMBERS):  # the joins, which the leader then reads and closes over
        run_inline(store.join(0, Join(f"node-{i:05d}", "127.0.0.1", 29500, 8), lease))
    cpu0, t0 = cpu_s(pid), time.perf_counter()
    joins = run_inline(store.read_rosters(statuses=False)).current_joins
    joins_read_s = time.perf_counter() - t0
    # the leader's claim, which the members' glances read (as in a round that waits for joins)
    assert run_inline(store.claim_lead(0, joins[0].node, joins[0].create_revision, lease))
    result = rdzv.build_result(0, joins, time.time(), joins[0].create_revision)
    txns = (
        len(
            roster.batches(
                [(keys.assignment(job_id, 0, a.member.node), a.to_json()) for a in roster.assignments(result)]
            )
        )
        + 1
    )
    cpu1, t1 = cpu_s(pid), time.perf_counter()
    assert run_inline(store.close(result, joins[0].node))
    close_s, close_cpu = time.perf_counter() - t1, cpu_s(pid) - cpu1
    written = sum(len(roster.encoded(a.to_json())) for a in roster.assignments(result))
    reads = _member_reads(endpoint, keys, job_id, pid) | _fan_out(endpoint, keys, pid)
    client.revoke_lease(lease)
    client.close()
    return reads | {
        "joins_read_s_per_join": joins_read_s / len(joins),
        "txn_s": close_s / txns,
        "txn_etcd_cpu_s": close_cpu / txns,
        "txn_puts": roster.MAX_TXN_PUTS,
        "write_bytes_per_s": written / close_s,
        "assignment_bytes": written / len(joins),
        "setup_etcd_cpu_s": cpu1 - cpu0,
    }


def _member_reads(endpoint: str, keys: Keys, job_id: str, pid: int | None) -> dict[str, float]:
    """``RATE_READS`` member reads (glance, then the read of the job with its own assignment) from
    ``RATE_READERS`` threads, each with its own client: etcd's rate and CPU per request."""
    clients = [CountingClient([endpoint], timeout_s=60) for _ in range(RATE_READERS)]
    sizes: list[int] = []
    lock = threading.Lock()

    def reader(k: int) -> None:
        store = InlineJobStore(clients[k], keys, job_id)
        for i in range(k, RATE_READS // 2, RATE_READERS):
            node = f"node-{i:05d}"
            run_inline(store.glance(0, node))
            read = run_inline(store.read_member(node, 0, statuses=False))
            with lock:
                sizes.append(len(json.dumps(read.assignment.to_json())))  # type: ignore[union-attr]

    cpu, t = cpu_s(pid), time.perf_counter()
    threads = [threading.Thread(target=reader, args=(k,)) for k in range(RATE_READERS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall, cpu = time.perf_counter() - t, cpu_s(pid) - cpu
    requests = sum(c.requests for c in clients)
    for c in clients:
        c.close()
    return {
        "read_requests_per_s": requests / wall,
        "read_etcd_cpu_s": cpu / requests,
        "assignment_read_bytes": statistics.median(sizes),
    }


def _fan_out(endpoint: str, keys: Keys, pid: int | None) -> dict[str, float]:
    """One put sent to ``RATE_WATCHERS`` watch streams (one client, as one process of nodes):
    etcd's CPU and the wall time per watcher, from the put to the last delivery."""
    client = EtcdClient([endpoint], timeout_s=60)
    key = keys.result("fan-out", 0)
    got = threading.Semaphore(0)
    cancels = [
        client.watch_prefix(key, lambda _k, _d: got.release(), lambda: None) for _ in range(RATE_WATCHERS)
    ]
    cpu, t = cpu_s(pid), time.perf_counter()
    client.put_json(key, {"at": time.time()})
    for _ in range(RATE_WATCHERS):
        got.acquire(timeout=60)
    wall, cpu = time.perf_counter() - t, cpu_s(pid) - cpu
    for cancel in cancels:
        cancel()
    client.close()
    return {"event_etcd_cpu_s": cpu / RATE_WATCHERS, "event_s_per_watcher": wall / RATE_WATCHERS}


def cpu_s(pid: int | None) -> float:
    """A process's CPU seconds so far (0 for no process)."""
    if pid is None:
        return 0.0
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)

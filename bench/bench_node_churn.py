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
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from churn.participants import DEFAULTS, JOB, OTHER, LightRegistry, Observer
from churn.phases import alive_read, go_phase, rest, run_phase
from churn.report import Outcome, report

from elasticd import log
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from tests.support import EtcdServer

TTL_S = DEFAULTS.lease_ttl
NODES_PER_CLIENT = 64


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

        out.phases.append(await run_phase("come", n, observers, come, lambda: True))

        async def admit() -> None:
            await asyncio.gather(*(r.enter(JOB) for r in regs))
            for i, r in enumerate(regs):
                free[i] = 0
                r.publish_soon()

        written = lambda: all(r._published is not None and r._published["free_slots"] == 0 for r in regs)  # noqa: E731
        out.phases.append(await run_phase("admit", n, observers, admit, written))
        out.alive_read_s, out.alive_read_bytes = await alive_read(regs[0], metrics, old)
        out.rest = await rest(regs, clients, keys, metrics, etcd_pid, args)

        out.phases.append(await go_phase(regs[: n // 2], tasks, observers[:half], observers))
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

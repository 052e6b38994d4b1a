"""Rendezvous at scale: N simulated participants against one etcd, next to torch's c10d handler.

elasticd side: each participant runs the join path of ``elasticd.agent.step`` with the
real ``JobStore`` (etcd I/O) and the real pure deciders (``leader``, ``decide_close``,
``order_members``, ``build_result``): it puts its join key under its own lease, reads the job
snapshot, and either leads (closes the round when MAX have joined) or waits for the result.
As in the daemon, one watch per process turns etcd events into wake-ups, and a participant that
does not lead is not woken by other joins. The etcd requests of every participant are counted
(unary calls; each participant's share of the watch is reported separately).

torch side: ``DynamicRendezvousHandler`` over ``C10dRendezvousBackend`` on one ``TCPStore``,
one handler (and store client) per participant, all calling ``next_rendezvous()``; backend
``get_state``/``set_state`` calls are counted as its requests.

Both sides run N threads in one process, started together, with min = max = N; the clock runs
from the start signal until every participant holds the round's result. A side that does not
finish within ``--timeout`` seconds is reported as such.

    .venv/bin/python bench/bench_rdzv_scale.py [--sizes 64,256,1024] [--timeout 180] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from elasticd.agent.executor import LEADER_BATCH_S
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.embedded import EmbeddedEtcd
from elasticd.etcd.keys import Keys
from elasticd.jobs.spec import EntryKind, JobSpec, NodeRange
from elasticd.netaddr import free_port
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.store import InlineJobStore, run_inline


@dataclass
class Outcome:
    side: str
    n: int
    finished: int
    seconds: float | None
    requests_per_participant: float
    note: str = ""


class CountingClient(EtcdClient):
    """Counts every unary etcd request (the one place they all go through)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = 0
        self._count_lock = threading.Lock()

    def call(self, op: Any) -> Any:
        with self._count_lock:
            self.requests += 1
        return super().call(op)


def spec_for(n: int, job_id: str) -> JobSpec:
    return JobSpec(
        id=job_id,
        name="bench",
        entry_kind=EntryKind.EXEC,
        entry="true",
        args=(),
        python="",
        cwd="/",
        env={},
        uid=0,
        gid=0,
        user="root",
        nnodes=NodeRange(n, n),
        last_call_s=30.0,
        join_timeout_s=600.0,
    )


def run_elasticd(endpoint: str, n: int, timeout_s: float) -> Outcome:
    keys = Keys(f"/bench/{n}-{time.time_ns()}")
    client = CountingClient([endpoint], timeout_s=30)
    job_id = f"scale-{n}"
    store = InlineJobStore(client, keys, job_id)
    spec = spec_for(n, job_id)
    assert run_inline(store.create(spec))
    leases = [client.grant_lease(120) for _ in range(n)]  # each node's lease exists before the job
    setup_requests = client.requests
    wake = [threading.Event() for _ in range(n)]
    leading = [False] * n
    join_prefix = f"{keys.job(job_id)}rdzv/0/join/"

    def on_change(key: str, deleted: bool) -> None:  # the daemon's per-process watch, filtered
        if key.startswith(join_prefix):
            for i in range(n):
                if leading[i]:
                    wake[i].set()
        else:
            for event in wake:
                event.set()

    cancel = client.watch_prefix(keys.job(job_id), on_change, lambda: None)
    setup_requests = client.requests  # the watch is reported per participant, not counted here
    start = threading.Event()
    done_at: list[float | None] = [None] * n

    errors: list[str] = []

    def participant(i: int) -> None:
        try:
            run_participant(i)
        except Exception as exc:  # reported, not hidden: a participant that fails does not finish
            errors.append(f"{type(exc).__name__}: {exc}"[:200])

    def run_participant(i: int) -> None:
        me = f"node-{i:05d}"
        start.wait()
        deadline = time.monotonic() + timeout_s
        state = {"joined": False, "seen": (), "last_join_at": time.time()}
        while time.monotonic() < deadline:
            try:  # as the agent's executor: an etcd error means "try again in a moment"
                if step(i, me, state):
                    return
            except EtcdUnavailable:
                time.sleep(1.0)

    def step(i: int, me: str, state: dict[str, Any]) -> bool:
        if not state["joined"]:
            run_inline(store.join(0, Join(me, "127.0.0.1", 29500, 1), leases[i]))
            state["joined"] = True
        wake[i].clear()
        if not leading[i]:  # the agent's glance: one small read while someone else leads
            glance = run_inline(store.glance(0, me))
            if glance.closed:
                run_inline(
                    store.snapshot(joins_counted_of=0)
                )  # the member then reads the job, result included
                done_at[i] = time.monotonic()
                return True
            if glance.quiet(0, me):
                wake[i].wait(1.0)
                return False
        snap = run_inline(store.snapshot())
        if snap.result is not None:
            done_at[i] = time.monotonic()
            return True
        joins = snap.current_joins
        names = tuple(j.node for j in joins)
        if names != state["seen"]:
            state["seen"], state["last_join_at"] = names, time.time()
        leading[i] = rdzv.leader(joins) == me
        if leading[i] and snap.round is not None:
            decision = rdzv.decide_close(
                snap.round,
                joins,
                set(names),
                spec.nnodes,
                now=time.time(),
                last_join_at=state["last_join_at"],
                last_call_s=spec.last_call_s,
                join_timeout_s=spec.join_timeout_s,
                expect_grace_s=0.0,
            )
            if decision.verdict is rdzv.Close.NOW:
                ordered = rdzv.order_members(joins, None, spec.nnodes.max)
                run_inline(store.close(rdzv.build_result(0, ordered, time.time())))
                return False
            time.sleep(LEADER_BATCH_S)
        wake[i].wait(1.0)
        return False

    threads = [threading.Thread(target=participant, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    start.set()
    for t in threads:
        t.join(max(0.0, t0 + timeout_s - time.monotonic()))
    cancel()
    finished = [d for d in done_at if d is not None]
    seconds = max(finished) - t0 if len(finished) == n else None
    requests = (client.requests - setup_requests) / n
    for lease in leases:
        client.revoke_lease(lease)
    client.close()
    note = f"{len(errors)} errors, first: {errors[0]}" if errors else "+1 watch per daemon"
    return Outcome("elasticd", n, len(finished), seconds, requests, note)


def run_torch(n: int, timeout_s: float) -> Outcome:
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    port = free_port()
    server = TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )
    run_id = f"scale-{n}"
    counter = {"calls": 0}
    lock = threading.Lock()

    class CountingBackend(C10dRendezvousBackend):
        def get_state(self) -> Any:
            with lock:
                counter["calls"] += 1
            return super().get_state()

        def set_state(self, state: bytes, token: Any = None) -> Any:
            with lock:
                counter["calls"] += 1
            return super().set_state(state, token)

    start = threading.Event()
    done_at: list[float | None] = [None] * n
    errors: list[str] = []

    def participant(i: int) -> None:
        try:
            store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))
            handler = DynamicRendezvousHandler.from_backend(
                run_id, store, CountingBackend(store, run_id), n, n, local_addr=f"node-{i:05d}",
                timeout=RendezvousTimeout(join=timedelta(seconds=timeout_s), last_call=timedelta(seconds=1)),
            )  # fmt: skip
            start.wait()
            handler.next_rendezvous()
            done_at[i] = time.monotonic()
        except Exception as exc:  # a timeout, a store error: the side did not finish
            errors.append(f"{type(exc).__name__}: {exc}"[:200])

    threads = [threading.Thread(target=participant, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # let every client connect before the clock starts
    t0 = time.monotonic()
    start.set()
    for t in threads:
        t.join(max(0.0, t0 + timeout_s - time.monotonic()))
    finished = [d for d in done_at if d is not None]
    seconds = max(finished) - t0 if len(finished) == n else None
    note = errors[0] if errors else ("timed out" if seconds is None else "")
    del server
    return Outcome("torch c10d", n, len(finished), seconds, counter["calls"] / n, note)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64,256,1024")
    p.add_argument("--timeout", type=float, default=180.0, help="per side and size, seconds")
    p.add_argument("--only", choices=["elasticd", "torch"])
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="elasticd-bench-rdzv-") as tmp:
        etcd = EmbeddedEtcd(Path(tmp) / "etcd")
        etcd.start()
        try:
            for n in sizes:
                if args.only != "torch":
                    outcomes.append(run_elasticd(etcd.endpoint, n, args.timeout))
                    print(outcomes[-1], flush=True)
                if args.only != "elasticd":
                    outcomes.append(run_torch(n, args.timeout))
                    print(outcomes[-1], flush=True)
        finally:
            etcd.stop()
    print()
    print(f"{'N':>6}  {'side':<11} {'round complete (s)':>19} {'requests/participant':>21}  note")
    for o in outcomes:
        secs = f"{o.seconds:.3f}" if o.seconds is not None else f"DNF ({o.finished}/{o.n})"
        print(f"{o.n:>6}  {o.side:<11} {secs:>19} {o.requests_per_participant:>21.1f}  {o.note}")
    for n in sizes:
        pair = {o.side: o for o in outcomes if o.n == n}
        e, t = pair.get("elasticd"), pair.get("torch c10d")
        if e and t and e.seconds and t.seconds:
            print(f"N={n}: elasticd/torch time ratio {e.seconds / t.seconds:.2f}")
    if args.json:
        args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

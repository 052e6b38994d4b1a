"""Rendezvous at scale: N participants against one etcd, spread over several processes.

elasticd side: each participant is a *node*: its own etcd client (its own connections, as one
daemon has), its own lease, and the watch a daemon has: the manager's ranges (``Keys.watched``:
the whole prefix but the jobs' notes, joins and reports), routed by the real codec
and filtered as the agent's ``wake`` filters (``AgentRecord.woken_by``). It runs the join path of
``elasticd.agent.step`` with the real ``JobStore`` (etcd I/O) and the real pure deciders
(``leader``, ``decide_close``, ``order_members``, ``build_result``): it puts its join key under
its lease and (as the agent's ``Publish``; ``--no-publish`` leaves it out) its status, glances at
the round while someone else leads, and the leader, which alone watches the round's joins
(``JobStore.watch_joins``, opened when it finds it leads, then a read of what came before),
closes the round when MAX have joined.
The participants run as threads in ``--procs`` separate processes (default: one per 128
participants), so that no single Python interpreter carries them all: the harness is not what
is measured. The unary etcd requests of every
participant are counted in its own client (the watch is one stream per node, counted apart).

Reported per N: the time from the *last join* (the last participant's join put returned) to the
leader's close and to the moment *every* participant holds its assignment (the round's head and
its own record, ``elasticd.rendezvous.roster``); the time from the start signal; unary requests
per participant (median and max); whether that stays O(1) (the max does not grow with N); the
watch events the participants received (all of them, and joins among them); the bytes each
participant read (``read_bytes_per_participant``: every unary response body and every watch
line, counted in its client; median and max, the leader apart) and wrote; the bytes one more
daemon's scan of every job (``JobsRead``, ``ScanProbe``) reads once the round closed, and what a
read of ``rounds/`` (every member's assignment, which that read leaves out) would add; etcd's CPU over the
run (psutil on its process); and etcd's own rates on this machine (``etcd_rates``: small reads,
transactions of assignments, bytes per second), which ``bench/rdzv_model.py`` takes to predict
rounds beyond what one machine can play.

torch side (``--torch``, off by default at N > 256 where it does not finish): the
``DynamicRendezvousHandler`` over ``C10dRendezvousBackend`` on one ``TCPStore``, one handler per
participant, threads of one process; ``get_state``/``set_state`` calls count as its requests.

    .venv/bin/python bench/bench_rdzv_scale.py [--sizes 64,256,1024] [--procs P] [--no-publish]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil

import elasticd.etcd.transport as etcd_transport
import elasticd.etcd.watch as etcd_watch
from elasticd.agent.executor import LEADER_BATCH_S, POLL_S
from elasticd.agent.record import AgentRecord
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.embedded import EmbeddedEtcd
from elasticd.etcd.keys import KeyKind, Keys
from elasticd.etcd.types import Found, Query
from elasticd.manager.jobsread import JobsRead
from elasticd.manager.wakes import QUIET_KINDS
from elasticd.netaddr import free_port
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous import roster
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.options import EntryKind
from elasticd.terms.spec import JobSpec, NodeRange

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Outcome:
    side: str
    n: int
    finished: int
    seconds: float | None  # start signal -> every participant holds the result
    requests_per_participant: float  # median
    note: str = ""
    procs: int = 1
    requests_max: float = 0.0  # over the participants that did not lead
    leader_requests: float = 0.0  # the leader reads the joins again per batch of joins it is woken for
    last_join: float | None = None  # start signal -> the last join put returned
    after_last_join: float | None = None  # the last join -> every participant holds the result
    closed: float | None = None  # the last join -> the leader sends its close
    events: int = 0  # watch events the participants received (the leader's join watch included)
    join_events: int = 0  # ... of which joins
    # Where the time after the close goes: the leader's close -> each participant's watch
    # delivered the result, and that -> it had read the job (median, max); CPU seconds of etcd
    # and of the participants' processes (the harness) over the whole run.
    result_event: tuple[float, float] | None = None
    result_read: tuple[float, float] | None = None
    result_read_cpu: tuple[float, float] | None = None  # that last step's CPU time, in its thread
    etcd_cpu_s: float = 0.0
    harness_cpu_s: float = 0.0
    # Bytes each participant read (unary response bodies and watch lines, as received) and wrote
    # (request bodies): median and max over those that did not lead; the leader's apart.
    read_bytes_per_participant: tuple[float, float] = (0.0, 0.0)
    written_bytes_per_participant: tuple[float, float] = (0.0, 0.0)
    leader_read_bytes: int = 0
    leader_written_bytes: int = 0
    watch_bytes_per_participant: tuple[float, float] = (0.0, 0.0)  # of the bytes read, from watches
    # A daemon's scan (``JobsRead``) that held the job before the round: its read once the round's
    # head exists, and what ``rounds/`` (every member's assignment, which the scan leaves to
    # the few that need it) would add to it (``ScanProbe``).
    scan_read_bytes: int = 0
    scan_rounds_bytes: int = 0
    load: str = ""  # ``uptime``'s load averages before the run: the machine is shared


class Meter:
    """Bytes each node's client moves, counted where they cross the wire: the unary responses
    (``transport.parse_json``, given the body), the request bodies (``Transport.post``) and each
    watch line (``watch.parse_watch``). A unary call runs on its node's thread (``InlineJobStore``);
    a watch line on its stream's thread, which ``watching`` ties to the node that opened it."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._threads: dict[int, Node] = {}
        transports, watches = vars(etcd_transport), vars(etcd_watch)  # patched in this process only
        parse_json, parse_watch, post = (
            transports["parse_json"],
            watches["parse_watch"],
            etcd_transport.Transport.post,
        )

        def counted_json(data: bytes) -> Any:
            node = getattr(self._local, "node", None)
            if node is not None:
                node.read_bytes += len(data)
            return parse_json(data)

        def counted_post(transport: Any, path: str, body: bytes, token: str | None) -> Any:
            node = getattr(self._local, "node", None)
            if node is not None:
                node.written_bytes += len(body)
            return post(transport, path, body, token)

        def counted_watch(line: bytes) -> Any:
            node = self._threads.get(threading.get_ident())
            if node is not None:
                node.read_bytes += len(line)
                node.watch_bytes += len(line)
            return parse_watch(line)

        transports["parse_json"], watches["parse_watch"] = counted_json, counted_watch
        etcd_transport.Transport.post = counted_post  # type: ignore[method-assign,assignment]

    def running(self, node: Node | None) -> None:
        """Count this thread's unary requests to ``node`` (None: to no one)."""
        self._local.node = node

    def watching(self, node: Node, open_watches: Callable[[], Any]) -> Any:
        """Run ``open_watches`` and count the lines of the watch threads it started to ``node``
        (one node opens its watches at a time: in the process's main thread, or as the leader)."""
        before = {t.ident for t in threading.enumerate()}
        out = open_watches()
        for t in threading.enumerate():
            if t.ident not in before and t.ident is not None and t.name == "etcd-watch":
                self._threads[t.ident] = node
        return out


METER: Meter | None = None  # in a participant process only


class Tally:
    """What ``Meter`` adds a node's bytes to, for a reader that is no participant."""

    def __init__(self) -> None:
        self.read_bytes = self.written_bytes = self.watch_bytes = 0


class ScanProbe:
    """One daemon's scan of every job beside the round, on the real ``JobsRead`` (what the scan
    and the table of ``status`` read through): it reads the job before the round starts, then once
    more as soon as the round's head exists (before the participants leave), and counts that read's
    response bytes; then, apart, the bytes of ``rounds/`` (every member's assignment: what the
    scan's read carried too when it covered that range)."""

    def __init__(self, endpoint: str, keys: Keys, job_id: str, meter: Meter) -> None:
        self._client = _MeteredClient([endpoint], timeout_s=60)
        self._client.meter = meter
        self._keys, self._job = keys, job_id
        self._reader = JobsRead(self._client, keys)
        asyncio.run(self._reader.read())
        self.read_bytes = self.rounds_bytes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, timeout_s: float) -> None:
        self._deadline = time.monotonic() + timeout_s
        self._thread.start()

    def stop(self) -> None:
        self._deadline = 0.0
        self._thread.join(10)
        self._client.close()

    def _run(self) -> None:
        while self._client.get(self._keys.result(self._job, 0)) is None:
            if time.monotonic() > self._deadline:
                return
            time.sleep(0.02)
        tally = self._client.tally = Tally()
        asyncio.run(self._reader.read())
        self.read_bytes, tally.read_bytes = tally.read_bytes, 0
        self._client.read_many([Query(self._keys.job_rounds(self._job), prefix=True)])
        self.rounds_bytes = tally.read_bytes
        self._client.tally = None


class _MeteredClient(EtcdClient):
    """Counts the response bytes of its reads to ``tally`` (on whichever thread they run: the
    ``JobsRead`` hands them to a worker thread)."""

    meter: Meter | None = None
    tally: Tally | None = None

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        if self.meter is None or self.tally is None:
            return super().read_many(queries)
        self.meter.running(self.tally)  # type: ignore[arg-type]
        try:
            return super().read_many(queries)
        finally:
            self.meter.running(None)


SCAN_METER: list[Meter] = []  # the bench's own process: its ``ScanProbe``'s


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


def _participant_proc(argv: list[str]) -> int:
    """One process of participants: ``_node ENDPOINT PREFIX JOB N FIRST COUNT TIMEOUT WATCH PUBLISH``.

    Prints ``ready`` once every participant has its client, lease and watch, starts on a line on
    stdin, and prints one JSON line: per participant its join time, done time (``time.time()``,
    one clock for every process of the host), requests, watch events, and error if any.
    """
    endpoint, prefix, job_id, n_s, first_s, count_s, timeout_s, watch, publish = argv
    n, first, count, timeout = int(n_s), int(first_s), int(count_s), float(timeout_s)
    global METER
    METER = Meter()
    keys = Keys(prefix)
    spec = spec_for(n, job_id)
    nodes = [
        Node(i, endpoint, keys, spec, watch == "node", publish == "1") for i in range(first, first + count)
    ]
    if watch == "process":  # one stream for the process, fanned out to its nodes' wake-ups
        shared = EtcdClient([endpoint], timeout_s=60)

        def fan_out(key: str, deleted: bool) -> None:
            for node in nodes:
                node.on_change(key, deleted)

        for start, end in keys.watched():
            shared.watch_range(start, end, fan_out, lambda: None)
    print("ready", flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=node.run, args=(timeout,), daemon=True) for node in nodes]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    print(json.dumps([node.report() for node in nodes]), flush=True)
    for node in nodes:
        node.close()
    return 0


class Node:
    """One participant: a daemon's etcd client, lease and watch, and its agent's join path."""

    def __init__(self, i: int, endpoint: str, keys: Keys, spec: JobSpec, watch: bool, publish: bool) -> None:
        self.me = f"node-{i:05d}"
        self.spec = spec
        self.keys = keys
        self.publish = publish
        # A long timeout: a read-only transaction whose client gives up makes etcd < 3.5.5 panic
        # (etcd-io/etcd#14110), and a loaded machine is slow, not gone.
        self.client = CountingClient([endpoint], timeout_s=NODE_TIMEOUT_S)
        self.store = InlineJobStore(self.client, keys, spec.id)
        self.lease = self.client.grant_lease(300)
        self.wake = threading.Event()
        self.rec = AgentRecord(spec, self.me)  # for the agent's wake-up filter (``woken_by``)
        self.joined_at: float | None = None
        self.done_at: float | None = None
        self.closed_at: float | None = None
        self.result_at: float | None = None  # when the watch delivered the result
        self.last_step_cpu_s = 0.0  # the CPU time of the step that read the result
        self.error = ""
        self.events = 0
        self.join_events = 0
        self.read_bytes = 0
        self.written_bytes = 0
        self.watch_bytes = 0
        self.holds: bool = False  # it read its own assignment of the closed round
        self._cancels = (
            self._meter(
                lambda: [
                    self.client.watch_range(a, b, self.on_change, lambda: None) for a, b in keys.watched()
                ]
            )
            if watch
            else []
        )
        self._unwatch_joins: Callable[[], None] | None = None
        self.setup_requests = self.client.requests

    @property
    def leading(self) -> bool:
        return self.rec.leading

    def _meter(self, open_watches: Callable[[], Any]) -> Any:
        return METER.watching(self, open_watches) if METER is not None else open_watches()

    def on_change(self, key: str, deleted: bool) -> None:
        """The manager's watch, routed as ``JobManager.wake`` and ``JobAgent.wake`` do."""
        self.events += 1
        change = self.keys.route(key, deleted)
        if change is None or change.kind in QUIET_KINDS:
            return
        self.join_events += change.kind is KeyKind.JOIN
        if change.kind is KeyKind.RESULT and self.result_at is None:
            self.result_at = time.time()
        if change.job is None or self.rec.woken_by(change):
            self.wake.set()

    def run(self, timeout_s: float) -> None:
        if METER is not None:
            METER.running(self)
        deadline = time.monotonic() + timeout_s
        state: dict[str, Any] = {"seen": (), "last_join_at": time.time()}
        try:
            while time.monotonic() < deadline:
                try:  # as the agent's executor: an etcd error means "try again in a moment"
                    if self.step(state):
                        return
                except EtcdUnavailable:
                    time.sleep(1.0)
        except Exception as exc:  # reported, not hidden: a participant that fails does not finish
            self.error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            self.follow_joins(False)

    def follow_joins(self, leading: bool) -> None:
        """``JoinWatch.follow``: the leader alone watches its round's joins."""
        if leading and self._unwatch_joins is None:
            self._unwatch_joins = self._meter(
                lambda: run_inline(self.store.watch_joins(0, self.on_change, lambda: None))
            )
            self.wake.set()  # read what came before the watch existed
        elif not leading and self._unwatch_joins is not None:
            self._unwatch_joins()
            self._unwatch_joins = None

    def step(self, state: dict[str, Any]) -> bool:
        started = time.thread_time()
        done = self._step(state)
        self.last_step_cpu_s = time.thread_time() - started
        return done

    def _step(self, state: dict[str, Any]) -> bool:
        store, spec = self.store, self.spec
        if self.joined_at is None:
            run_inline(store.join(0, Join(self.me, "127.0.0.1", 29500, 1), self.lease))
            self.joined_at = time.time()
            self.rec = replace(self.rec, joined_round=0)
            if self.publish:  # the agent's Publish: its status, JOINING, under its lease
                status = {
                    "state": "JOINING",
                    "round": -1,
                    "devices": "",
                    "pids": [],
                    "updated_at": time.time(),
                }
                run_inline(store.put_node_status(self.me, status, self.lease))
        self.wake.clear()
        if not self.leading:  # the agent's glance: one small read while someone else leads
            glance = run_inline(store.glance(0, self.me))
            if glance.closed:  # the member reads the job: the round's head and its own assignment
                snap = run_inline(store.snapshot(0, statuses=False, node=self.me, rosters=False))
                self.holds = snap.me(self.me) is not None
                self.done_at = time.time()
                return True
            if glance.quiet(0, self.me):
                self.wake.wait(POLL_S)
                return False
        # As the agent's ReadSnapshot: a leader reads the rounds whole, a member its own assignment.
        snap = run_inline(store.snapshot(statuses=False, node=self.me, rosters=self.leading))
        if snap.closed is not None:
            self.holds = snap.me(self.me) is not None
            self.done_at = time.time()
            return True
        joins = snap.current_joins
        names = tuple(j.node for j in joins)
        if names != state["seen"]:
            state["seen"], state["last_join_at"] = names, time.time()
        self.rec = replace(self.rec, part=self.rec.part.lead(rdzv.leader(joins) == self.me))
        self.follow_joins(self.leading)
        if self.leading and snap.round is not None:
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
                self.closed_at = time.time()  # (the close is sent now; it is written before it returns)
                epoch = next(j.create_revision for j in joins if j.node == self.me)
                run_inline(store.close(rdzv.build_result(0, ordered, self.closed_at, epoch), self.me))
                self.follow_joins(False)
                return False
            time.sleep(LEADER_BATCH_S)
        self.wake.wait(POLL_S)
        return False

    def report(self) -> dict[str, Any]:
        return {
            "node": self.me,
            "joined_at": self.joined_at,
            "done_at": self.done_at,
            "closed_at": self.closed_at,
            "result_at": self.result_at,
            "last_step_cpu_s": self.last_step_cpu_s,
            "requests": self.client.requests - self.setup_requests,
            "leader": self.leading,
            "events": self.events,
            "join_events": self.join_events,
            "read_bytes": self.read_bytes,
            "written_bytes": self.written_bytes,
            "watch_bytes": self.watch_bytes,
            "holds": self.holds,
            "error": self.error,
        }

    def close(self) -> None:
        for cancel in self._cancels:
            cancel()
        with contextlib.suppress(Exception):
            self.client.revoke_lease(self.lease)
        self.client.close()


def _participants(
    endpoint: str, prefix: str, job_id: str, n: int, procs: int, timeout_s: float, watch: str, publish: bool
) -> list[subprocess.Popen[str]]:
    """The processes that play the ``n`` nodes, ``procs`` of them, each ready (a client, a lease and
    a watch per node) and waiting for a ``go`` line."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    per = -(-n // procs)
    children = []
    for first in range(0, n, per):
        argv = [endpoint, prefix, job_id, str(n), str(first), str(min(per, n - first)), str(timeout_s), watch]
        argv.append("1" if publish else "0")
        children.append(
            subprocess.Popen(
                [sys.executable, __file__, "_node", *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    for c in children:  # every node has its client, lease and watch before the clock starts
        assert c.stdout is not None
        c.stdout.readline()
    return children


def _reports(
    children: list[subprocess.Popen[str]], deadline: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every node's report, and the participant processes that failed."""
    reports: list[dict[str, Any]] = []
    errors: list[str] = []
    for c in children:
        try:
            out, _ = c.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:  # counted as not finished, not a crash of the bench
            c.kill()
            out, _ = c.communicate()
        found = [line for line in out.strip().splitlines() if line.startswith("[")]
        if c.returncode != 0 or not found:
            errors.append(f"participant process exited {c.returncode}")
            continue
        try:  # its report is its one JSON line; anything else it printed (a log line) is not
            reports.extend(json.loads(found[-1]))
        except ValueError:
            errors.append("a participant process's report did not read")
    return reports, errors


def _time_the_round(outcome: Outcome, reports: list[dict[str, Any]], t0: float) -> None:
    """A round every node finished: how long it took, and its close and result after the last join."""
    last_join = max(r["joined_at"] for r in reports)
    closed = max(r["done_at"] for r in reports)
    outcome.seconds = closed - t0
    outcome.after_last_join = closed - last_join
    outcome.last_join = last_join - t0
    leader = max((r["closed_at"] for r in reports if r["closed_at"] is not None), default=None)
    outcome.closed = leader - last_join if leader is not None else None
    told = [r for r in reports if r["result_at"] is not None]
    if leader is not None and told:
        outcome.result_event = _median_max([r["result_at"] - leader for r in told])
        outcome.result_read = _median_max([r["done_at"] - r["result_at"] for r in told])
        outcome.result_read_cpu = _median_max([r["last_step_cpu_s"] for r in told])


def run_elasticd(endpoint: str, n: int, procs: int, timeout_s: float, watch: str, publish: bool) -> Outcome:
    prefix = f"/bench/{n}-{time.time_ns()}"
    job_id = f"scale-{n}"
    setup = EtcdClient([endpoint], timeout_s=30)
    assert run_inline(InlineJobStore(setup, Keys(prefix), job_id).create(spec_for(n, job_id)))
    setup.close()
    SCAN_METER[:] = SCAN_METER or [Meter()]
    scan = ScanProbe(endpoint, Keys(prefix), job_id, SCAN_METER[0])
    children = _participants(endpoint, prefix, job_id, n, procs, timeout_s, watch, publish)
    scan.start(timeout_s)
    t0 = time.time()
    for c in children:
        assert c.stdin is not None
        c.stdin.write("go\n")
        c.stdin.flush()
    reports, errors = _reports(children, t0 + timeout_s + 90)
    scan.stop()
    errors += [r["error"] for r in reports if r["error"]]
    errors += [
        f"{r['node']} found no assignment of its own" for r in reports if r["done_at"] and not r["holds"]
    ]
    finished = [r for r in reports if r["done_at"] is not None and r["holds"]]
    requests = sorted(r["requests"] for r in reports if not r["leader"]) or [0]
    outcome = Outcome("elasticd", n, len(finished), None, statistics.median(requests), procs=len(children))
    outcome.requests_max = requests[-1]
    outcome.leader_requests = max((r["requests"] for r in reports if r["leader"]), default=0)
    outcome.events = sum(r["events"] for r in reports)
    outcome.join_events = sum(r["join_events"] for r in reports)
    members = [r for r in reports if not r["leader"]] or reports
    outcome.read_bytes_per_participant = _median_max([r["read_bytes"] for r in members])
    outcome.written_bytes_per_participant = _median_max([r["written_bytes"] for r in members])
    outcome.watch_bytes_per_participant = _median_max([r["watch_bytes"] for r in members])
    outcome.leader_read_bytes = max((r["read_bytes"] for r in reports if r["leader"]), default=0)
    outcome.leader_written_bytes = max((r["written_bytes"] for r in reports if r["leader"]), default=0)
    outcome.scan_read_bytes, outcome.scan_rounds_bytes = scan.read_bytes, scan.rounds_bytes
    if len(finished) == n:
        _time_the_round(outcome, reports, t0)
    outcome.note = f"{len(errors)} errors, first: {errors[0]}" if errors else f"+1 watch stream per {watch}"
    outcome.note += "" if publish else ", no status publish"
    return outcome


NODE_TIMEOUT_S = 600.0  # each participant's etcd client
RATE_READERS = 8  # client threads that read at once while etcd's read rate is measured
RATE_READS = 400  # member reads (glance + its read of the job) they make in all
RATE_MEMBERS = 2400  # assignments written (20 transactions) while the write rate is measured
RATE_WATCHERS = 200  # watch streams one put is sent to while the fan-out is measured


def etcd_rates(endpoint: str) -> dict[str, float]:
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
    pid = _etcd_pid(endpoint)
    cpu0, t0 = _cpu_s(pid), time.perf_counter()
    joins = run_inline(store.snapshot(statuses=False, rosters=True)).current_joins
    joins_read_s = time.perf_counter() - t0
    result = rdzv.build_result(0, joins, time.time(), joins[0].create_revision)
    txns = (
        len(
            roster.batches(
                [(keys.assignment(job_id, 0, a.member.node), a.to_json()) for a in roster.assignments(result)]
            )
        )
        + 1
    )
    cpu1, t1 = _cpu_s(pid), time.perf_counter()
    assert run_inline(store.close(result, joins[0].node))
    close_s, close_cpu = time.perf_counter() - t1, _cpu_s(pid) - cpu1
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
            snap = run_inline(store.snapshot(0, statuses=False, node=node, rosters=False))
            with lock:
                sizes.append(len(json.dumps(snap.assigned.get(0, {}).get(node).to_json())))  # type: ignore[union-attr]

    cpu, t = _cpu_s(pid), time.perf_counter()
    threads = [threading.Thread(target=reader, args=(k,)) for k in range(RATE_READERS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall, cpu = time.perf_counter() - t, _cpu_s(pid) - cpu
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
    cpu, t = _cpu_s(pid), time.perf_counter()
    client.put_json(key, {"at": time.time()})
    for _ in range(RATE_WATCHERS):
        got.acquire(timeout=60)
    wall, cpu = time.perf_counter() - t, _cpu_s(pid) - cpu
    for cancel in cancels:
        cancel()
    client.close()
    return {"event_etcd_cpu_s": cpu / RATE_WATCHERS, "event_s_per_watcher": wall / RATE_WATCHERS}


def _etcd_pid(endpoint: str) -> int | None:
    return ETCD_PID.get(endpoint)


ETCD_PID: dict[str, int | None] = {}


def _median_max(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values)


def _cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _race(participant: Callable[[int], None], n: int, start: threading.Event, timeout_s: float) -> float:
    """Run ``participant(i)`` for each of ``n`` threads, released by ``start`` once every client
    had time to connect; when the clock started (monotonic). Waits for them up to ``timeout_s``."""
    threads = [threading.Thread(target=participant, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # let every client connect before the clock starts
    t0 = time.monotonic()
    start.set()
    for t in threads:
        t.join(max(0.0, t0 + timeout_s - time.monotonic()))
    return t0


def run_torch(n: int, timeout_s: float) -> Outcome:
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # torch does not re-export it
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

    t0 = _race(participant, n, start, timeout_s)
    finished = [d for d in done_at if d is not None]
    seconds = max(finished) - t0 if len(finished) == n else None
    note = errors[0] if errors else ("timed out" if seconds is None else "")
    del server
    outcome = Outcome("torch c10d", n, len(finished), seconds, counter["calls"] / n, note)
    outcome.requests_max = outcome.requests_per_participant  # (a mean: the backend counts all calls)
    return outcome


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sizes", default="64,256,1024")
    p.add_argument("--procs", type=int, default=0, help="participant processes (default: one per 128)")
    p.add_argument(
        "--watch", choices=["node", "process"], default="node",
        help="node: every node its own watch stream, as daemons have (default); process: one per process",
    )  # fmt: skip
    p.add_argument(
        "--no-publish", dest="publish", action="store_false",
        help="leave out the status a joining agent publishes (reports/<job>/<node>, watched by none)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=180.0, help="per side and size, seconds")
    p.add_argument("--torch", action="store_true", help="also run torch's c10d rendezvous (N <= 256)")
    p.add_argument("--json", type=Path)
    p.add_argument("--no-rates", dest="rates", action="store_false", help="leave out etcd's per-op rates")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    outcomes: list[Outcome] = []
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="elasticd-bench-rdzv-") as tmp:
        etcd = EmbeddedEtcd(Path(tmp) / "etcd")
        etcd.start()
        ETCD_PID[etcd.endpoint] = etcd.pid
        try:
            if args.rates:
                rates = etcd_rates(etcd.endpoint)
                print("etcd rates:", json.dumps(rates), flush=True)
            for n in sizes:
                procs = args.procs or max(1, -(-n // 128))
                load = " ".join(f"{x:.2f}" for x in os.getloadavg())
                etcd_cpu, children = _cpu_s(etcd.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
                outcomes.append(
                    run_elasticd(etcd.endpoint, n, min(procs, n), args.timeout, args.watch, args.publish)
                )
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                outcomes[-1].etcd_cpu_s = _cpu_s(etcd.pid) - etcd_cpu
                outcomes[-1].load = load
                outcomes[-1].harness_cpu_s = (after.ru_utime + after.ru_stime) - (
                    children.ru_utime + children.ru_stime
                )
                print(outcomes[-1], flush=True)
                if args.torch and n <= 256:
                    outcomes.append(run_torch(n, args.timeout))
                    print(outcomes[-1], flush=True)
        finally:
            etcd.stop()
    report(outcomes)
    if args.json:
        out = {"outcomes": [o.__dict__ for o in outcomes], "etcd_rates": rates, "cpus": os.cpu_count()}
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def _s(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "-"


def report(outcomes: list[Outcome]) -> None:
    print()
    print(
        f"{'N':>6}  {'side':<11} {'procs':>5} {'last join (s)':>13} {'closed after last join (s)':>27}"
        f" {'(leader)':>8} {'total (s)':>10} {'req/participant med':>20} {'max':>5} {'leader':>6}"
        f" {'events':>8} {'join ev.':>8}  note"
    )
    for o in outcomes:
        total = _s(o.seconds) if o.seconds is not None else f"DNF ({o.finished}/{o.n})"
        print(
            f"{o.n:>6}  {o.side:<11} {o.procs:>5} {_s(o.last_join):>13} {_s(o.after_last_join):>27}"
            f" {_s(o.closed):>8} {total:>10} {o.requests_per_participant:>20.1f} {o.requests_max:>5.0f}"
            f" {o.leader_requests:>6.0f} {o.events:>8} {o.join_events:>8}  {o.note}"
        )
    for o in outcomes:
        if o.side == "elasticd":
            rb, wb, lb = (
                o.read_bytes_per_participant,
                o.written_bytes_per_participant,
                o.watch_bytes_per_participant,
            )
            print(
                f"{o.n:>6}  bytes per participant read {rb[0]:.0f}/{rb[1]:.0f}"
                f" (of which watch {lb[0]:.0f}/{lb[1]:.0f}),"
                f" written {wb[0]:.0f}/{wb[1]:.0f} (median/max); the leader read {o.leader_read_bytes}"
                f" and wrote {o.leader_written_bytes}; load before: {o.load}"
            )
            print(
                f"{o.n:>6}  a daemon's scan read {o.scan_read_bytes} bytes once the round closed"
                f" (jobs/ and notes/ since its last read); rounds/ would add {o.scan_rounds_bytes}"
            )
    for o in outcomes:
        if o.result_event is not None and o.result_read is not None and o.result_read_cpu is not None:
            print(
                f"{o.n:>6}  after the close: result event {o.result_event[0]:.3f}/{o.result_event[1]:.3f} s,"
                f" then read {o.result_read[0]:.3f}/{o.result_read[1]:.3f} s (median/max; CPU"
                f" {o.result_read_cpu[0] * 1000:.0f}/{o.result_read_cpu[1] * 1000:.0f} ms);"
                f" CPU of the run: etcd {o.etcd_cpu_s:.1f} s, participants {o.harness_cpu_s:.1f} s"
            )
    mine = [o for o in outcomes if o.side == "elasticd" and o.seconds is not None]
    if len(mine) > 1:
        flat = max(o.requests_max for o in mine) <= min(o.requests_max for o in mine) + 2
        print(f"O(1) requests per participant (not leading): {'yes' if flat else 'NO'} (max per N: "
              + ", ".join(f"{o.n}: {o.requests_max:.0f}" for o in mine) + ")")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_node":
        sys.exit(_participant_proc(sys.argv[2:]))
    sys.exit(main())

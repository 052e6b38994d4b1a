"""One participant: a node as a daemon is one, running its agent's join path."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from elasticd.agent.executor import LEADER_BATCH_S, POLL_S
from elasticd.agent.record import AgentRecord
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.manager.wakes import QUIET_KINDS
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.glance import Glance
from elasticd.rendezvous.jobread import MemberRead, RostersRead
from elasticd.rendezvous.model import Join, RoundInfo
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.options import EntryKind
from elasticd.terms.spec import JobSpec, NodeRange
from rdzvscale.meter import CountingClient, Meter

NODE_TIMEOUT_S = 600.0  # each participant's etcd client


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


class Node:
    """One participant: a daemon's etcd client, lease and watch, and its agent's join path."""

    def __init__(
        self,
        i: int,
        endpoint: str,
        keys: Keys,
        spec: JobSpec,
        watch: bool,
        publish: bool,
        meter: Meter | None,
    ) -> None:
        self.me = f"node-{i:05d}"
        self.spec = spec
        self.keys = keys
        self.publish = publish
        self.meter = meter
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
        return self.meter.watching(self, open_watches) if self.meter is not None else open_watches()

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
        if self.meter is not None:
            self.meter.running(self)
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
        store = self.store
        joined = self._join() if self.joined_at is None else None  # (its answer is a glance)
        self.wake.clear()
        if not self.leading:  # the agent's glance: one small read while someone else leads
            glance = joined or run_inline(store.glance(0, self.me))
            if glance.closed:  # the member reads the job: the round's head and its own assignment
                member = run_inline(store.read_member(self.me, 0, statuses=False))
                self.holds = member.me(self.me) is not None
                self.done_at = time.time()
                return True
            if glance.quiet(0, self.me):
                self.wake.wait(POLL_S)
                return False
        # As the agent's ReadJob: a leader reads the rounds whole, a member its own assignment.
        read: MemberRead | RostersRead
        if self.leading:
            read = run_inline(store.read_rosters(statuses=False))
        else:
            read = run_inline(store.read_member(self.me, statuses=False))
        if read.closed is not None:
            self.holds = read.me(self.me) is not None
            self.done_at = time.time()
            return True
        joins = read.current_joins
        names = tuple(j.node for j in joins)
        if names != state["seen"]:
            state["seen"], state["last_join_at"] = names, time.time()
        self.rec = replace(self.rec, part=self.rec.part.lead(rdzv.leader(joins) == self.me))
        self.follow_joins(self.leading)
        if self.leading and read.leads.get(0) != self.me:  # as the agent's ClaimLead
            mine = next(j for j in joins if j.node == self.me)
            run_inline(self.store.claim_lead(0, self.me, mine.create_revision, mine.lease))
        if self.leading and read.round is not None:
            if self._close_if_due(read.round, joins, state["last_join_at"]):
                return False
            time.sleep(LEADER_BATCH_S)
        self.wake.wait(POLL_S)
        return False

    def _join(self) -> Glance:
        """The agent's join of round 0, and its Publish: its status, JOINING, under its lease."""
        glance = run_inline(self.store.join(0, Join(self.me, "127.0.0.1", 29500, 1), self.lease))
        self.joined_at = time.time()
        self.rec = replace(self.rec, joined_round=0)
        if self.publish:
            status = {
                "state": "JOINING",
                "round": -1,
                "devices": "",
                "pids": [],
                "updated_at": time.time(),
            }
            run_inline(self.store.put_node_status(self.me, status, self.lease))
        return glance

    def _close_if_due(self, info: RoundInfo, joins: Sequence[Join], last_join_at: float) -> bool:
        """The leader's close, when the decider says now: whether it closed the round."""
        spec = self.spec
        decision = rdzv.decide_close(
            info,
            joins,
            {j.node for j in joins},
            spec.nnodes,
            now=time.time(),
            last_join_at=last_join_at,
            last_call_s=spec.last_call_s,
            join_timeout_s=spec.join_timeout_s,
            expect_grace_s=0.0,
        )
        if decision.verdict is not rdzv.Close.NOW:
            return False
        ordered = rdzv.order_members(joins, None, spec.nnodes.max)
        self.closed_at = time.time()  # (the close is sent now; it is written before it returns)
        epoch = next(j.create_revision for j in joins if j.node == self.me)
        run_inline(self.store.close(rdzv.build_result(0, ordered, self.closed_at, epoch), self.me))
        self.follow_joins(False)
        return True

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

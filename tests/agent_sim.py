"""A deterministic simulation of one job run by several nodes' agents.

Each node runs its own ``AgentRecord`` through ``elasticd.agent.step``; ``Sim._turn`` carries the
actions out as ``elasticd.agent.executor`` does (after a failure the rest of the list is dropped
and the next step gets it in ``Local``), against fake worker groups. Every node's store is an
``InlineJobStore`` over its own ``Link`` to one shared ``MemoryKV``, whose clock is the ``now``
the steps get. Around the agents the sim plays the daemon as ``elasticd.manager`` and
``elasticd.node.registry`` do: admission, the lease's keep-alive and its loss (a fence), the
reaper (it kills multi-node workers at the lease deadline), crash recovery and the janitor's
orphan rule, on the fake clock where those read ``time.time()``.

Timing: a lease lives 2 s and its deadline is 1.6 s after a keep-alive; a tick moves time by at
most 0.5 s and an outage lasts a few requests (a node makes one a tick while failing), so a node
the next round expects is heard from, or past its deadline, before the round's expect grace
(stop grace + 2 s) runs out: the protocol's precondition for "no two rounds run at once".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, assert_never

from elasticd.agent import actions as act
from elasticd.agent.record import AgentRecord, AgentState, Group, Leave, Local, Observed, View
from elasticd.agent.step import step
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.types import Compare, Put
from elasticd.jobs.admission import admit
from elasticd.jobs.decider import GroupOutcome
from elasticd.jobs.spec import JobSpec
from elasticd.jobs.state import EndReason, JobState, SetupFailure, WorkerFailure
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.model import Join, Member, RoundInfo, RoundReason
from elasticd.rendezvous.snapshot import JobSnapshot
from elasticd.rendezvous.store import InlineJobStore, Seen, run_inline

KEYS = Keys("/sim")
T0 = 1_000_000.0
TTL_S = 2  # MemoryKV's shortest lease
MARGIN_S = min(1.0, TTL_S * 0.2)  # NodeRegistry.margin_s: the deadline comes this long before etcd's
MAX_STEPS = 30  # steps a node may take in one turn before it must wait: more is a livelock


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Link:
    """One node's ``KV``: the shared store, unless cut off (a partition) or failing requests."""

    _kv: MemoryKV

    def __init__(self, kv: MemoryKV, clock: FakeClock) -> None:
        self._kv, self._clock = kv, clock
        self.failing = 0  # the next requests that fail
        self.cut_until = 0.0

    def stream(self) -> MemoryKV:
        """What the lease's keep-alive stream reaches: a partition cuts it, failed requests do not."""
        if self._clock.now < self.cut_until:
            raise EtcdUnavailable("cut off from etcd (simulated partition)")
        return self._kv

    def up(self) -> MemoryKV:
        kv = self.stream()
        if self.failing > 0:
            self.failing -= 1
            raise EtcdUnavailable("the request failed (simulated outage)")
        return kv

    def __getattr__(self, name: str) -> Any:
        """Every other ``KV`` call: through ``up``."""

        def call(*args: Any, **kwargs: Any) -> Any:
            return getattr(self.up(), name)(*args, **kwargs)

        return call


@dataclass
class FakeGroup:
    """A node's workers of one round, as ``Workers.observe`` sees them."""

    round: int
    member: Member
    outcome: GroupOutcome = GroupOutcome.RUNNING
    failure: WorkerFailure | None = None

    def observe(self, describe: bool) -> Group:
        return Group(self.outcome, self.failure if describe else None)

    def exit(self, returncode: int) -> bool:
        """Every worker exits with ``returncode``; False if they had already."""
        if self.outcome is not GroupOutcome.RUNNING:
            return False
        self.outcome = GroupOutcome.FAILED if returncode else GroupOutcome.SUCCEEDED
        if returncode:
            m = self.member
            self.failure = WorkerFailure.from_exit(
                node=m.node, attempt=self.round, rank=m.rank_offset, local_rank=0, returncode=returncode,
                message="", tail="",
            )  # fmt: skip
        return True


class Daemon(Enum):
    ABSENT = "absent"  # has not arrived yet
    UP = "up"
    DOWN = "down"  # crashed or stopped


@dataclass
class Agent:
    """An agent: its record and the loop variables of ``JobAgent._run``."""

    rec: AgentRecord
    view: View | None = None
    setup: SetupFailure | None = None
    etcd_error: str | None = None
    peers: tuple[str, ...] = ()


@dataclass(eq=False)
class Node:
    index: int
    name: str
    link: Link
    store: InlineJobStore
    daemon: Daemon = Daemon.ABSENT
    lease: int | None = None
    deadline: float = 0.0  # the registry's (and the reaper's) lease deadline
    agent: Agent | None = None
    group: FakeGroup | None = None
    drained: bool = False
    stopping: bool = False  # the daemon shuts down once its agent has left
    ran_job: bool = False  # the state dir records the job: a restart reports it (recovery)
    broken_setup: bool = False  # starting workers raises SetupFailure


class Checker:
    """Told of every action carried out, and asked after every step (the tests' invariants)."""

    def after(self, node: Node, action: act.Action) -> None:
        pass

    def check(self) -> None:
        pass


class _Exited(Exception):
    pass


class Sim:
    def __init__(self, spec: JobSpec, initial: int, pool: int = 5) -> None:
        self.spec = spec
        self.clock = FakeClock()
        self.kv = MemoryKV(self.clock)
        self.store = InlineJobStore(self.kv, KEYS, spec.id)  # the janitor's (never cut off)
        self.checker = Checker()
        self.spending = 0  # events that may spend a restart: a failure, a node lost, ...
        self.trace: list[str] = []
        self.nodes: list[Node] = []
        for i in range(pool):
            link = Link(self.kv, self.clock)
            self.nodes.append(Node(i, f"n{i}", link, InlineJobStore(link, KEYS, spec.id)))
        for node in self.nodes[:initial]:
            node.daemon = Daemon.UP

    def submit(self) -> None:
        """``JobStore.create``, on the fake clock."""
        k, j, info = KEYS, self.spec.id, RoundInfo(0, RoundReason.START, self.clock.now)
        puts = [Put(k.job_spec(j), self.spec.to_json()), Put(k.job_round(j), info.to_json())]
        assert self.kv.txn([Compare(k.job_spec(j), "create", 0)], [*puts, Put(k.job_restarts(j), 0)])

    def snapshot(self) -> JobSnapshot:
        return run_inline(self.store.snapshot())

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def note(self, text: str) -> None:
        self.trace.append(f"{self.clock.now - T0:6.2f} {text}")

    # -- faults (each a no-op where it does not apply) ----------------------------------------------
    def _up(self, i: int) -> Node | None:
        node = self.nodes[i]
        return node if node.daemon is Daemon.UP else None

    def fail(self, i: int, returncode: int = 1) -> None:
        node = self._up(i)
        if node is not None and node.group is not None and node.group.exit(returncode):
            self.spending += 1
            self.note(f"{node.name}'s workers failed")

    def succeed(self, i: int) -> None:
        node = self._up(i)
        if node is not None and node.group is not None and node.group.exit(0):
            self.note(f"{node.name}'s workers succeeded")

    def crash(self, i: int, revoke: bool = True) -> None:
        """The daemon dies (its workers with it); a peer proves it (``revoke``) or its lease runs out."""
        node = self._up(i)
        if node is None:
            return
        self.note(f"{node.name} crashed")
        self.spending += int(node.agent is not None)
        if revoke and node.lease is not None:
            self.kv.revoke_lease(node.lease)
        node.daemon, node.agent, node.group, node.lease = Daemon.DOWN, None, None, None

    def restart(self, i: int) -> None:
        node = self.nodes[i]
        if node.daemon is not Daemon.DOWN:
            return
        self.note(f"{node.name} restarted")
        node.daemon, node.drained, node.stopping = Daemon.UP, False, False
        node.link.failing, node.link.cut_until = 0, 0.0
        self._register(node)
        self._recover(node)

    def drain(self, i: int, grace_s: float | None = None) -> None:
        node = self._up(i)
        if node is not None:
            self.note(f"{node.name} drained")
            node.drained = True
            self._leave(node, Leave(RoundReason.MEMBER_LEFT, f"node {node.name} drained", grace_s))

    def stop(self, i: int) -> None:
        """The daemon shuts down: it leaves its job, then revokes its lease."""
        node = self._up(i)
        if node is not None:
            self.note(f"{node.name} stops")
            node.drained = node.stopping = True
            self._leave(node, Leave(RoundReason.MEMBER_LEFT, f"elasticd on {node.name} shut down"))
            if node.agent is None:
                self._shut_down(node)

    def outage(self, i: int, requests: int) -> None:
        if (node := self._up(i)) is not None:
            node.link.failing += requests

    def partition(self, i: int, seconds: float) -> None:
        if (node := self._up(i)) is not None:
            node.link.cut_until = max(node.link.cut_until, self.clock.now + seconds)

    def arrive(self) -> None:
        node = next((n for n in self.nodes if n.daemon is Daemon.ABSENT), None)
        if node is not None:
            node.daemon = Daemon.UP

    def break_setup(self, i: int) -> None:
        self.nodes[i].broken_setup = True

    def heal(self) -> None:
        for node in self.nodes:
            node.link.failing, node.link.cut_until = 0, 0.0

    # -- time ---------------------------------------------------------------------------------------
    def advance(self, dt: float) -> None:
        self.clock.now += dt

    def tick(self, order: Iterable[int] | None = None) -> None:
        """Keep-alives and the janitor, then each node in ``order`` steps until it waits."""
        nodes = [self.nodes[i] for i in (range(len(self.nodes)) if order is None else order)]
        for node in nodes:
            if node.daemon is Daemon.UP:
                self._keep_alive(node)
        self._janitor()
        for node in nodes:
            if node.daemon is Daemon.UP:
                self._scan(node)
            if node.daemon is Daemon.UP and node.agent is not None:
                self._turn(node)
        self.checker.check()

    def run(self, ticks: int, dt: float = 0.25) -> None:
        for _ in range(ticks):
            self.tick()
            self.advance(dt)

    # -- the daemon around the agents ---------------------------------------------------------------
    def _keep_alive(self, node: Node) -> None:
        """``NodeRegistry.run`` with a keep-alive each tick; the reaper holds the same deadline."""
        now = self.clock.now
        if node.group is not None and self.spec.nnodes.max > 1 and now >= node.deadline:
            node.group.exit(-9)  # the reaper's SIGKILL, before the lease expires on the server
        if node.lease is not None and now >= node.deadline:
            self._lost(node)
        try:
            if node.lease is None:
                self._register(node)
            elif (remaining := node.link.stream().refresh_lease(node.lease)) <= 0:
                self._lost(node)
                self._register(node)
            else:
                node.deadline = now + remaining - MARGIN_S
        except EtcdUnavailable:
            pass

    def _lost(self, node: Node) -> None:
        self.note(f"{node.name} lost its lease")
        node.lease = None
        if node.agent is not None:
            self.spending += 1
            if node.agent.rec.multi_node:  # JobAgent.fence
                node.agent.rec = replace(node.agent.rec, fenced=True)

    def _register(self, node: Node) -> None:
        lease = node.link.stream().grant_lease(TTL_S)
        node.link.stream().put_json(KEYS.node(node.name), {"node": node.name}, lease)
        node.lease, node.deadline = lease, self.clock.now + TTL_S - MARGIN_S

    def _recover(self, node: Node) -> None:
        """``manager.recovery``: a restarted daemon reports the round its predecessor was in."""
        if not node.ran_job:
            return
        node.ran_job = False
        snap = run_inline(node.store.snapshot())
        if snap.ended or snap.result is None or node.name not in snap.result.nodes:
            return
        expect = rdzv.next_expect(snap.result, self._alive(node))
        self._round_lost(node.store, snap, f"elasticd on {node.name} restarted while the job ran", expect)

    def _round_lost(
        self, store: InlineJobStore, snap: JobSnapshot, why: str, expect: tuple[str, ...]
    ) -> None:
        """Open the next round for a member lost (spending a restart), or end the job."""
        plan = rdzv.plan_bump(RoundReason.MEMBER_LOST, snap.restarts, self.spec.max_restarts, why)
        if plan.fail:
            run_inline(store.finalize(JobState.FAILED, EndReason.NODES_LOST, plan.why))
        else:
            info = RoundInfo(snap.current + 1, RoundReason.MEMBER_LOST, self.clock.now, expect, plan.why)
            run_inline(store.bump(Seen.of(snap), info, plan.spend))

    def _janitor(self) -> None:
        """``Janitor._orphan``: a job that no live member looks after is restarted, or failed."""
        snap, spec = self.snapshot(), self.spec
        if snap.ended or snap.round is None:
            return
        result = snap.result
        if result is None:
            if not snap.current_joins and self.clock.now - snap.round.opened_at > spec.join_timeout_s:
                why = f"only 0 of the {spec.nnodes.min} nodes needed joined"
                run_inline(self.store.finalize(JobState.FAILED, EndReason.JOIN_TIMEOUT, why))
            return
        present = {j.node for j in snap.current_joins} | snap.done.get(snap.current, set())
        if any(n in present for n in result.nodes):
            return
        self._round_lost(self.store, snap, f"every node of round {snap.current} was lost", ())

    def _scan(self, node: Node) -> None:
        """``JobManager.scan``: take part in the job where ``admit`` says there is a seat."""
        if node.agent is not None or node.drained or node.lease is None:
            return
        try:
            snap = run_inline(node.store.snapshot())
        except EtcdUnavailable:
            return
        if snap.spec is not None and not snap.ended and admit(snap, node.name, 8, 8, "CPU slots").join:
            node.agent = Agent(AgentRecord(self.spec, node.name, last_join_at=self.clock.now))
            node.ran_job = True

    def _alive(self, node: Node) -> frozenset[str]:
        """``NodeRegistry.alive``: the nodes whose lease holds their record."""
        return frozenset(KEYS.parse(kv.key).node for kv in node.link.get_prefix(KEYS.nodes()))

    def _leave(self, node: Node, leave: Leave) -> None:
        if node.agent is not None and node.agent.rec.leave is None:  # JobAgent.leave
            node.agent.rec = replace(node.agent.rec, leave=leave)

    def _shut_down(self, node: Node) -> None:
        """``NodeRegistry.stop``: revoke the lease if etcd can be told (else it runs out)."""
        with contextlib.suppress(EtcdUnavailable):
            if node.lease is not None:
                node.link.stream().revoke_lease(node.lease)
        node.daemon, node.lease = Daemon.DOWN, None

    # -- the executor -------------------------------------------------------------------------------
    def _turn(self, node: Node) -> None:
        """``JobAgent._run`` until the node waits (every node is woken every tick)."""
        agent = node.agent
        assert agent is not None
        for _ in range(MAX_STEPS):
            group = node.group.observe(describe=agent.rec.failure is None) if node.group else None
            valid = node.lease is not None and self.clock.now < node.deadline
            local = Local(node.lease, valid, group, agent.setup, agent.etcd_error)
            agent.rec, actions = step(agent.rec, agent.view, local, self.clock.now)
            agent.view, agent.setup, agent.etcd_error = None, None, None
            waited = False
            try:
                for action in actions:
                    waited = isinstance(action, act.Wait)
                    agent.view = self._execute(node, agent, action) or agent.view
                    self.checker.after(node, action)
            except EtcdUnavailable as exc:
                agent.view, agent.etcd_error = None, str(exc)
            except SetupFailure as exc:
                agent.view, agent.setup = None, exc
            except _Exited:
                self._exit(node, agent, unheard=agent.rec.leave is not None and local.etcd_error is not None)
                return
            self.checker.check()
            if waited:
                return
        raise AssertionError(f"{node.name} took {MAX_STEPS} steps without waiting: {agent.rec}")

    def _exit(self, node: Node, agent: Agent, unheard: bool) -> None:
        """``JobAgent._main``'s clean-up; the manager then forgets the agent, and a stopping daemon
        revokes its lease. A node that left without telling anyone (``unheard``) may cost a restart."""
        self.note(f"{node.name} exits ({agent.rec.state.value} in round {agent.rec.round})")
        self.spending += int(unheard)
        node.group = None
        agent.rec = replace(agent.rec, state=AgentState.LEFT)
        with contextlib.suppress(EtcdUnavailable):
            run_inline(node.store.clear_waiting(node.name))
            if agent.rec.joined_round >= 0:
                run_inline(node.store.withdraw(agent.rec.joined_round, node.name))
        node.agent, node.ran_job = None, False
        if node.stopping:
            self._shut_down(node)

    def _execute(self, node: Node, agent: Agent, action: act.Action) -> View | None:
        """``JobAgent._execute``, against fake workers."""
        store, lease, name = node.store, node.lease, node.name
        match action:
            case act.ReadGlance(round_no):
                return run_inline(store.glance(round_no, name))
            case act.ReadSnapshot(counted):
                return Observed(run_inline(store.snapshot(counted)), self._alive(node))
            case act.Exit():
                raise _Exited
            case act.StopWorkers():
                if node.group is not None:
                    self._publish(node, agent, quietly=True)
                    node.group = None
                    self._publish(node, agent, quietly=True)
            case act.StartWorkers(result, member):
                if node.broken_setup:
                    raise SetupFailure(EndReason.SPAWN_FAILED, f"cannot start workers on {name}")
                node.group = FakeGroup(result.round, member)
            case act.Publish():
                self._publish(node, agent)
            case act.Join(round_no) if lease is not None:
                i, nproc = node.index, self.spec.nproc_per_node
                join = Join(name, f"10.0.0.{i + 1}", 29500 + i, nproc, liveness_port=4000 + i)
                run_inline(store.join(round_no, join, lease))
            case act.Withdraw(round_no):
                run_inline(store.withdraw(round_no, name))
            case act.SetWaiting() if lease is not None:
                run_inline(store.set_waiting(name, lease))
            case act.ClearWaiting():
                run_inline(store.clear_waiting(name))
            case act.CloseRound(result):
                if run_inline(store.close(result)):
                    run_inline(store.forget_rounds_before(result.round))
            case act.Bump(seen, info, spend):
                if run_inline(store.bump(seen, info, spend)):
                    self.note(f"{name} opened round {info.round} ({info.reason.value}: {info.detail})")
            case act.Finalize(state, code, reason, failure):
                if run_inline(store.finalize(state, code, reason, failure)):
                    self.note(f"{name} ended the job {state.value} ({code.value}: {reason})")
            case act.MarkDone(round_no):
                run_inline(store.mark_done(round_no, name))
            case act.MarkLeft(round_no):
                run_inline(store.mark_left(round_no, name))
            case act.WatchPeers(_, peers):
                agent.peers = tuple(m.node for m in peers)
            case act.Wait() | act.Join() | act.SetWaiting():
                pass  # (a Join or SetWaiting without a lease writes nothing)
            case _:
                assert_never(action)
        return None

    def _publish(self, node: Node, agent: Agent, quietly: bool = False) -> None:
        """``put_node_status`` of ``JobAgent.local_view``."""
        if node.lease is None:
            return
        rec, group = agent.rec, node.group
        running = group is not None and group.outcome is GroupOutcome.RUNNING
        state = rec.state.value
        if group is not None and rec.state is AgentState.RUNNING and not running:
            state = "DONE" if group.outcome is GroupOutcome.SUCCEEDED else "FAILED"
        failure = rec.failure.to_json() if rec.failure else None
        status = {"state": state, "round": rec.round, "devices": "", "failure": failure}
        status |= {"pids": [100 + node.index] if running else [], "updated_at": self.clock.now}
        try:
            run_inline(node.store.put_node_status(node.name, status, node.lease))
        except EtcdUnavailable:
            if not quietly:
                raise

"""A deterministic simulation of one job run by several nodes' agents.

Each node (``tests.agent_sim_node``) runs the shipped agent (``elasticd.agent.executor.JobAgent``)
over in-memory seams, against fake worker groups. A ``tick`` wakes every node and lets them step in
turn, one step each, until all wait. Every node's store is an ``InlineJobStore`` over its own
``Link`` to one shared ``MemoryKV``, whose clock is the ``now`` the steps get. Around the agents
the sim plays the daemon as ``elasticd.manager`` and ``elasticd.node.registry`` do: admission, the lease's
keep-alive and its loss (a fence), the reaper (it kills the workers of rounds with several
members at the lease deadline), crash recovery, and the janitor (the real ``Janitor.sweep``, on
the fake clock, with a grace for a round's only member longer than any partition).

Wake-ups: with ``wakes``, a node's agent steps only when the daemon's executor would (see
``tests.agent_sim_node``): woken by the manager's watch (which carries no joins), its own join
watch while it leads, its workers, a fence or a leave, or at its deadline or the executor's poll.
Without, every node steps on every tick (more interleavings, and no lost wake-up can show).

Timing: a lease lives 2 s and its deadline is 1.6 s after a keep-alive; a tick moves time by at
most 0.5 s and an outage lasts a few requests (its keep-alive gets through meanwhile). A node the
next round expects may be heard from only after the round's expect grace (stop grace + 2 s): the
leader waits for a previous member until it rejoins, leaves or loses its lease, not for a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from elasticd.agent.record import Leave
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.types import Compare, Put
from elasticd.jobs.admission import admit
from elasticd.manager import janitor as janitors
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.glance import Seen
from elasticd.rendezvous.jobread import RostersRead
from elasticd.rendezvous.model import RoundInfo
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, JobState, RoundReason
from tests.agent_sim_node import KEYS, Checker, Daemon, Link, Node
from tests.fakes import head_of

__all__ = ["KEYS", "T0", "Checker", "Daemon", "Node", "Sim"]

T0 = 1_000_000.0
TTL_S = 2  # MemoryKV's shortest lease
MARGIN_S = min(1.0, TTL_S * 0.2)  # NodeRegistry.margin_s: the deadline comes this long before etcd's
SOLO_GRACE_S = 5 * TTL_S  # the janitor's grace for a round's only member (longer than any partition)
MAX_STEPS = 60  # steps a node may take in a tick before it must wait: more is a livelock (a
# tick can hold two rounds opened and closed, each with the leader's probe and a read after it)


class Sim:
    def __init__(self, spec: JobSpec, initial: int, pool: int = 5, wakes: bool = False) -> None:
        self.spec = spec
        self.wakes = wakes
        self.now = T0  # the fake clock: the MemoryKV's, and every step's ``now``
        self.kv = MemoryKV(lambda: self.now)
        self.store = InlineJobStore(self.kv, KEYS, spec.id)
        self.janitor = janitors.Janitor(
            self.kv,
            KEYS,
            "janitor",
            lambda _job: self.store,
            clock=lambda: self.now,
            solo_grace_s=SOLO_GRACE_S,
        )
        self.checker = Checker()
        self.spending = 0  # events that may spend a restart: a failure, a node lost, ...
        self.unheard: list[str] = []  # nodes that left while the store was unreachable
        self.trace: list[str] = []
        self.cuts: dict[frozenset[str], float] = {}  # peer links cut (not to the store), since when
        self.nodes: list[Node] = []
        for i in range(pool):
            link = Link(self.kv, lambda: self.now)
            store = InlineJobStore(link, KEYS, spec.id)
            node = Node(i, f"n{i}", link, store, lambda: self.now, note=self.note, reaches=self.reaches)
            for start, end in KEYS.watched():  # the manager's watch (the daemon's, once it runs)
                self.kv.watch_range(start, end, node.on_change, lambda: None)
            gone = KEYS.presences(spec.id)  # its ``PresenceWatches`` (it wakes the agent, if any)
            self.kv.watch_range(gone, prefix_end(gone), node.on_presence_gone, lambda: None, True)
            self.nodes.append(node)
        for node in self.nodes[:initial]:
            node.daemon = Daemon.UP

    def submit(self) -> None:
        """``JobStore.create``, on the fake clock."""
        k, j, info = KEYS, self.spec.id, RoundInfo(0, RoundReason.START, self.now)
        puts = [Put(k.job_spec(j), head_of(self.spec).to_json()), Put(k.job_round(j), info.to_json())]
        assert self.kv.txn([Compare(k.job_spec(j), "create", 0)], [*puts, Put(k.job_restarts(j), 0)])

    def read_job(self) -> RostersRead:
        return run_inline(self.store.read_rosters())

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now - T0:6.2f} {text}")

    # -- faults (each a no-op where it does not apply) ----------------------------------------------
    def _up(self, i: int) -> Node | None:
        node = self.nodes[i]
        return node if node.daemon is Daemon.UP else None

    def fail(self, i: int, returncode: int = 1) -> None:
        node = self._up(i)
        if node is not None and node.group is not None and node.group.exit(returncode):
            self.spending += 1
            node.wake()
            self.note(f"{node.name}'s workers failed")

    def succeed(self, i: int) -> None:
        node = self._up(i)
        if node is not None and node.group is not None and node.group.exit(0):
            node.wake()
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
        node.drop_join_watch()
        node.daemon, node.agent, node.lease = Daemon.DOWN, None, None  # its workers go with its agent

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
            self._leave(
                node, Leave(RoundReason.MEMBER_LEFT, f"elasticd on {node.name} shut down", stopping=True)
            )
            if node.agent is None:
                self._shut_down(node)

    def outage(self, i: int, requests: int) -> None:
        if (node := self._up(i)) is not None:
            node.link.failing += requests

    def partition(self, i: int, seconds: float) -> None:
        if (node := self._up(i)) is not None:
            node.link.cut_until = max(node.link.cut_until, self.now + seconds)

    def reaches(self, a: str, b: str) -> bool:
        """The reachability matrix: whether a connect from ``a`` to ``b`` succeeds (not to a
        daemon that is down: nothing listens)."""
        up = self.node(b).daemon is Daemon.UP
        return up and frozenset((a, b)) not in self.cuts

    def cut_peers(self, i: int) -> None:
        """Cut node ``i`` from every other node, not from the store (its lease lives on)."""
        name = self.nodes[i].name
        self.note(f"{name} cut from its peers")
        for other in self.nodes:
            if other.name != name:
                self.cuts.setdefault(frozenset((name, other.name)), self.now)

    def heal_peers(self) -> None:
        self.cuts.clear()

    def arrive(self) -> None:
        node = next((n for n in self.nodes if n.daemon is Daemon.ABSENT), None)
        if node is not None:
            node.daemon = Daemon.UP

    def break_setup(self, i: int) -> None:
        self.nodes[i].broken_setup = True

    def heal(self) -> None:
        self.heal_peers()
        for node in self.nodes:
            node.link.failing, node.link.cut_until = 0, 0.0

    # -- time ---------------------------------------------------------------------------------------
    def advance(self, dt: float) -> None:
        self.now += dt

    def tick(self, order: Iterable[int] | None = None) -> None:
        """Keep-alives, the janitor and admission; then the agents step in ``order``, one step
        each in turn (so that one's read and write can straddle another's), until all wait."""
        nodes = [self.nodes[i] for i in (range(len(self.nodes)) if order is None else order)]
        for node in nodes:
            if node.daemon is Daemon.UP:
                self._keep_alive(node)
        self._sweep()
        for node in nodes:
            if node.daemon is Daemon.UP:
                self._scan(node)
        if not self.wakes:
            for node in nodes:
                node.waiting = False
        for _ in range(MAX_STEPS):
            busy = [n for n in nodes if n.agent is not None and n.runnable(self.now, self.wakes)]
            if not busy:
                return
            for node in busy:
                if node.daemon is Daemon.UP and node.agent is not None:
                    self._step(node)
        raise AssertionError(f"{[n.name for n in busy]} took {MAX_STEPS} steps without waiting")

    def run(self, ticks: int, dt: float = 0.25) -> None:
        for _ in range(ticks):
            self.tick()
            self.advance(dt)

    def _step(self, node: Node) -> bool:
        """A step of the node's agent; once it has left, the manager forgets it (and a stopping
        daemon revokes its lease). One that left without telling anyone may cost a restart."""
        waits = node.step(self.now, self.checker)
        if node.agent is None and node.unheard:
            self.spending += 1
            self.unheard.append(node.name)
        if node.agent is None and node.stopping:
            self._shut_down(node)
        return waits

    # -- the daemon around the agents ---------------------------------------------------------------
    def _keep_alive(self, node: Node) -> None:
        """``NodeRegistry.run`` with a keep-alive each tick; the reaper holds the same deadline."""
        now = self.now
        if node.group is not None and node.group.fenced and now >= node.deadline:
            node.group.exit(-9)  # the reaper's SIGKILL, before the lease expires on the server
            node.wake()
        if node.lease is not None and now >= node.deadline:
            self._lost(node)
        try:
            node.forget_presence()
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
            node.agent.fence()

    def _register(self, node: Node) -> None:
        lease = node.link.stream().grant_lease(TTL_S)
        puts = [Put(KEYS.node(node.name), {"node": node.name}, lease)]
        if node.agent is not None:  # its presence in the job, with its record (``NodeRegistry._register``)
            puts.append(Put(KEYS.presence(self.spec.id, node.name), {}, lease))
        node.link.stream().txn([], puts)
        node.lease, node.deadline = lease, self.now + TTL_S - MARGIN_S
        node.wake()  # NodeRegistry.on_granted: JobManager.wake

    def _recover(self, node: Node) -> None:
        """``manager.recovery``: a restarted daemon reports the round its predecessor was in."""
        read = run_inline(node.store.read_rosters())
        if not node.ran_job or read.ended or read.me(node.name) is None:
            return
        node.ran_job, why = False, f"elasticd on {node.name} restarted while the job ran"
        plan = rdzv.plan_bump(RoundReason.MEMBER_LOST, read.restarts, self.spec.max_restarts, why)
        if plan.fail:
            run_inline(node.store.finalize(JobState.FAILED, EndReason.NODES_LOST, plan.why))
            return
        info = RoundInfo(read.current + 1, RoundReason.MEMBER_LOST, self.now, (), why, expect_members=True)
        run_inline(node.store.bump(Seen.of(read), info, plan.spend))

    def _sweep(self) -> None:
        """The janitor's sweep (the real one, on the fake clock; its node is never cut off)."""
        run_inline(self.janitor.sweep({self.spec.id: self.read_job()}))

    def _scan(self, node: Node) -> None:
        """``JobManager.scan``: take part in the job where ``admit`` says there is a seat."""
        if node.agent is not None or node.drained or node.lease is None:
            return
        try:
            read = run_inline(node.store.read_rosters())
        except EtcdUnavailable:
            return
        if read.head is not None and not read.ended and admit(read, node.name, 8, 8, "CPU slots").join:
            try:  # ``NodeRegistry.enter``, before the agent exists
                node.link.up().put_json(KEYS.presence(self.spec.id, node.name), {}, node.lease)
            except EtcdUnavailable:
                return
            node.presence_stale = False
            node.admit(self.spec)
            node.ran_job, node.waiting = True, False

    def _leave(self, node: Node, leave: Leave) -> None:
        if node.agent is not None:
            node.agent.leave(leave.reason, leave.detail, leave.grace_s, leave.stopping)

    def _shut_down(self, node: Node) -> None:
        """``NodeRegistry.stop``: revoke the lease if etcd can be told (else it runs out)."""
        with contextlib.suppress(EtcdUnavailable):
            if node.lease is not None:
                node.link.stream().revoke_lease(node.lease)
        node.daemon, node.lease = Daemon.DOWN, None

    # -- the executor -------------------------------------------------------------------------------

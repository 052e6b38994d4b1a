"""One simulated node of ``tests.agent_sim``: its link to the shared store, and its agent, the
shipped ``elasticd.agent.executor.JobAgent``, built over in-memory seams (``elasticd.agent.seams``):
its workers are fake groups, its lease and probes the sim's, and its sleep is the sim's tick. The sim
steps it one pass at a time (``JobAgent.once``): after a failure the rest of the list is dropped,
and the next step gets it in ``Local``.

Its wake-ups are the daemon's: the manager's watch (``Keys.watched``: every key but the joins,
the nodes' records and presences, routed as ``JobManager.wake`` does, filtered by
``AgentRecord.woken_by``), the deletions of the job's presences (``PresenceWatches``), the join watch that a
``WatchJoins`` opens, worker exits, fences, leaves and new leases, a ``Wait``'s deadline and the
executor's poll (``POLL_S``). The sim steps only the nodes these wake when it models them
(``Sim(wakes=True)``); otherwise every node steps on every tick.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from elasticd.agent import actions as act
from elasticd.agent.executor import POLL_S, Exited, JobAgent
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.jobs.agentstore import Offer
from elasticd.jobs.attempt import NodeRuntime
from elasticd.jobs.decider import Group, GroupOutcome
from elasticd.manager.wakes import QUIET_KINDS
from elasticd.node.inventory import Inventory
from elasticd.node.registry import parse_presences
from elasticd.progress.goodput import Ledger, Silence
from elasticd.progress.tracker import RankProgress
from elasticd.rendezvous.fitness import CheckTarget
from elasticd.rendezvous.fitness import Link as CheckLink
from elasticd.rendezvous.model import Member, RoundHead
from elasticd.rendezvous.reach import Reach
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, SetupFailure, WorkerFailure

KEYS = Keys("/sim")


class Link:
    """One node's ``KV``: the shared store, unless cut off (a partition) or failing requests."""

    _kv: MemoryKV

    def __init__(self, kv: MemoryKV, clock: Callable[[], float]) -> None:
        self._kv, self._clock = kv, clock
        self.failing = 0  # the next requests that fail
        self.cut_until = 0.0

    def stream(self) -> MemoryKV:
        """What the lease's keep-alive stream reaches: a partition cuts it, failed requests do not."""
        if self._clock() < self.cut_until:
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
    fenced: bool = True  # the reaper kills it at the lease deadline: its round has several members
    pid: int = 100

    def observe(self, describe: bool) -> Group:
        return Group(self.outcome, self.failure if describe else None)

    def pids(self) -> list[int]:
        return [self.pid] if self.outcome is GroupOutcome.RUNNING else []

    def pgids(self) -> list[int]:
        return [self.pid]

    def exits(self) -> set[asyncio.Future[int]]:
        return set()  # (the sim wakes the node when its workers exit)

    def progress(self) -> list[RankProgress]:
        return []

    async def stop(self, grace_s: float) -> list[int]:
        return []

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


class Checker:
    """Told of every action carried out, and asked after every step (the tests' invariants)."""

    def after(self, node: Node, action: act.Action) -> None:
        pass

    def check(self) -> None:
        pass


@dataclass(eq=False)
class Node:
    index: int
    name: str
    link: Link
    store: InlineJobStore
    now: Callable[[], float] = lambda: 0.0  # the sim's clock
    daemon: Daemon = Daemon.ABSENT
    lease: int | None = None
    deadline: float = 0.0  # the registry's (and the reaper's) lease deadline
    agent: JobAgent | None = None
    drained: bool = False
    stopping: bool = False  # the daemon shuts down once its agent has left
    ran_job: bool = False  # the state dir records the job: a restart reports it (recovery)
    broken_setup: bool = False  # starting workers raises SetupFailure
    unheard: bool = False  # its agent left while the store was unreachable
    note: Callable[[str], None] = lambda _text: None  # the sim's trace
    reaches: Callable[[str, str], bool] = lambda _a, _b: True  # the sim's reachability matrix
    notes: list[str | None] = field(default_factory=list)  # the pending notes it published
    # Wake-ups (see the module's docstring):
    woken: bool = False  # something ``JobAgent.wake`` lets through happened since the last step
    waiting: bool = False  # the last step's actions ended in a ``Wait`` (or an exit)
    until: float | None = None  # ... and that Wait's deadline
    stepped_at: float = 0.0
    joins: tuple[int, Callable[[], None]] | None = None  # the join watch: its round, its cancel
    join_events: list[str] = field(default_factory=list)  # joins its join watch told it of
    main_joins: list[str] = field(default_factory=list)  # joins the manager's watch told it of: none
    presence_stale: bool = False  # its agent left, and its presence is still to delete

    @property
    def group(self) -> FakeGroup | None:
        """Its agent's workers."""
        workers = self.agent.workers if self.agent is not None else None
        assert workers is None or isinstance(workers, FakeGroup)
        return workers

    @property
    def reach(self) -> Reach | None:
        """What its agent's last probe found."""
        return self.agent._looks.reach if self.agent is not None else None

    def admit(self, spec: JobSpec) -> None:
        """``JobManager``'s admission: the shipped agent, over this node's seams."""
        i = self.index
        rt = NodeRuntime(self.name, f"10.0.0.{i + 1}", Path("/nonexistent"), Inventory((), 8),
                         SimpleNamespace(), liveness_port=4000 + i)  # type: ignore[arg-type]  # fmt: skip
        self.agent = JobAgent(
            spec, rt, self.store, SimLease(self), (), lambda _agent: None,
            launcher=SimLauncher(self), clock=SimClock(self.now), alarm=SimAlarm(self),
            peers=NoPeers(), joins=SimJoins(self), probe=self.probe,
        )  # fmt: skip

    def wake(self) -> None:
        self.woken = True

    def runnable(self, now: float, wakes: bool) -> bool:
        """Whether the executor would step now: mid-list, or (``wakes``) woken, due or polling."""
        if not self.waiting:
            return True
        due = self.until is not None and now >= self.until
        return wakes and (self.woken or due or now - self.stepped_at >= POLL_S)

    def on_change(self, key: str, deleted: bool) -> None:
        """The manager's watch (``JobManager.watch`` then ``wake``)."""
        change = KEYS.route(key, deleted)
        if change is None or change.kind in QUIET_KINDS:
            return
        if change.kind is KeyKind.JOIN:
            self.main_joins.append(key)
        if change.job is None:
            self.woken = True
        elif self.agent is not None:
            self.agent.wake(change)

    def on_presence_gone(self, key: str, deleted: bool) -> None:
        """The job's presences, deletions only (``PresenceWatches``, then ``JobManager.wake``)."""
        change = KEYS.route(key, deleted)
        if change is not None and self.agent is not None:
            self.agent.wake(change)

    def _on_join(self, key: str, deleted: bool) -> None:
        """The join watch (``JoinWatch``)."""
        self.join_events.append(key)
        change = KEYS.route(key, deleted)
        if change is not None and self.agent is not None:
            self.agent.wake(change)

    def drop_join_watch(self) -> None:
        if self.joins is not None:
            self.joins[1]()
            self.joins = None

    def _join_watch_broke(self) -> None:
        self.drop_join_watch()
        self.woken = True

    def follow_joins(self, round_no: int | None) -> None:
        """``JoinWatch.follow``."""
        if self.joins is not None and self.joins[0] == round_no:
            return
        self.drop_join_watch()
        if round_no is not None:
            cancel = run_inline(self.store.watch_joins(round_no, self._on_join, self._join_watch_broke))
            self.joins = (round_no, cancel)
            self.woken = True  # to read what came before the watch existed

    def alive(self, among: frozenset[str] | None) -> frozenset[str]:
        """``JobLease.alive``: the job's nodes whose lease holds their presence, of ``among``."""
        job = self.store.job_id
        nodes = parse_presences(KEYS, job, self.link.get_prefix(KEYS.presences(job)))
        return nodes if among is None else nodes & among

    async def probe(
        self, targets: Sequence[tuple[str, str, int]], timeout_s: float
    ) -> tuple[frozenset[str], frozenset[str]]:
        """``liveness.probe``, through the sim's reachability matrix."""
        reached = frozenset(t[0] for t in targets if self.reaches(self.name, t[0]))
        return reached, frozenset(t[0] for t in targets) - reached

    def step(self, now: float, checker: Checker) -> bool:
        """One pass of ``JobAgent``'s loop (``once``); True when the agent waits (or has left)."""
        agent = self.agent
        assert agent is not None
        if self.waiting:  # its Wait returned: the executor clears its wake-up then (a wake-up
            self.woken = False  # that comes while it steps makes its next Wait return at once)
        self.stepped_at = now
        failed = agent.etcd_error is not None  # the store failed the last pass
        waited = False

        def told(action: act.Action) -> None:
            nonlocal waited
            waited = isinstance(action, act.Wait)
            if isinstance(action, act.Wait):
                self.until = action.until
            if isinstance(action, act.NotePending) and self.lease is not None:
                self.notes.append(action.note)
            if isinstance(action, act.Bump):
                self.note(f"{self.name} bumps to round {action.info.round} ({action.info.reason.value})")
            checker.after(self, action)

        try:
            run_inline(agent.once(told))
        except Exited:
            self._exit(agent, unheard=agent.rec.leave is not None and failed)
            waited = True
        checker.check()
        self.waiting = waited
        return waited

    def _exit(self, agent: JobAgent, unheard: bool) -> None:
        """``JobAgent.finish``; then the manager forgets the agent (and the state dir the job)."""
        self.note(f"{self.name} exits ({agent.rec.state.value} in round {agent.rec.round})")
        self.unheard = unheard
        run_inline(agent.finish())
        self.agent, self.ran_job = None, False
        self.presence_stale = True  # ``NodeRegistry.leave``: deleted now, or at a keep-alive
        self.forget_presence()

    def forget_presence(self) -> None:
        """``NodeRegistry._forget_stale``."""
        if self.presence_stale and self.agent is None:
            with contextlib.suppress(EtcdUnavailable):
                self.link.up().delete(KEYS.presence(self.store.job_id, self.name))
                self.presence_stale = False


# -- the agent's seams, over the node ---------------------------------------------------------------
class SimClock:
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def time(self) -> float:
        return self._now()


class SimLease:
    """``NodeRegistry`` as the agent sees it: the node's lease, valid until its deadline."""

    def __init__(self, node: Node) -> None:
        self._node = node

    @property
    def lease_id(self) -> int | None:
        return self._node.lease

    def lease_valid(self) -> bool:
        return self._node.lease is not None and self._node.now() < self._node.deadline

    async def alive(self, among: frozenset[str] | None = None) -> frozenset[str]:
        return self._node.alive(among)


class SimAlarm:
    """The agent's sleep: the sim's tick sleeps for it (``Node.runnable``); a ring wakes the node."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def ring(self) -> None:
        self._node.woken = True

    async def pause(self, seconds: float) -> None:
        pass

    async def sleep(self, timeout_s: float, exits: set[asyncio.Future[Any]]) -> None:
        pass


class NoPeers:
    """Peers are proven dead by ``Sim.crash`` (a revoked lease), not by a watch."""

    def follow(self, round_no: int, peers: tuple[Member, ...]) -> None:
        pass

    def close(self) -> None:
        pass


class SimJoins:
    """``JoinWatch`` over the node's watch of the shared store (its callbacks come inline)."""

    def __init__(self, node: Node) -> None:
        self._node = node

    @property
    def round(self) -> int | None:
        return self._node.joins[0] if self._node.joins is not None else None

    async def follow(self, round_no: int | None) -> None:
        self._node.follow_joins(round_no)

    def close(self) -> None:
        self._node.drop_join_watch()


class SimLauncher:
    """Fake worker groups; the node's join names its (fake) port."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def prepare(self, spec: JobSpec) -> None:
        pass

    async def offer(self, round_no: int) -> Offer:
        return Offer(29500 + self._node.index, False)

    async def check_links(self, targets: tuple[CheckTarget, ...]) -> dict[str, CheckLink]:
        return {}  # (the simulated jobs check no nodes)

    def goodput(self) -> Ledger | None:
        return None

    async def close(self) -> None:
        pass

    async def start(
        self,
        spec: JobSpec,
        result: RoundHead,
        member: Member,
        restarts: int,
        slots: tuple[int, ...],
        silence: Silence | None = None,
    ) -> FakeGroup:
        node = self._node
        if node.broken_setup:
            raise SetupFailure(EndReason.SPAWN_FAILED, f"cannot start workers on {node.name}")
        return FakeGroup(result.round, member, fenced=result.size > 1, pid=100 + node.index)

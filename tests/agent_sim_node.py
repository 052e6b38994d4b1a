"""One simulated node of ``tests.agent_sim``: its link to the shared store, its fake workers, and
its agent, stepped by an executor that carries the actions out as ``elasticd.agent.executor``
does: after a failure the rest of the list is dropped, and the next step gets it in ``Local``.

Its wake-ups are the daemon's: the manager's watch (``Keys.watched``: every key but the joins,
the nodes' records and presences, routed as ``JobManager.wake`` does, filtered by
``AgentRecord.woken_by``), the deletions of the job's presences (``PresenceWatches``), the join watch that a
``WatchJoins`` opens, worker exits, fences, leaves and new leases, a ``Wait``'s deadline and the
executor's poll (``POLL_S``). The sim steps only the nodes these wake when it models them
(``Sim(wakes=True)``); otherwise every node steps on every tick.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, assert_never

from elasticd.agent import actions as act
from elasticd.agent.executor import POLL_S
from elasticd.agent.record import AgentRecord, AgentState, Local, Observed, View, presence_asked
from elasticd.agent.step import step
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.jobs.decider import Group, GroupOutcome
from elasticd.manager.wakes import QUIET_KINDS
from elasticd.node.registry import parse_presences
from elasticd.rendezvous.glance import Glance
from elasticd.rendezvous.model import Join, Member
from elasticd.rendezvous.reach import Reach
from elasticd.rendezvous.store import InlineJobStore, run_inline
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


class Checker:
    """Told of every action carried out, and asked after every step (the tests' invariants)."""

    def after(self, node: Node, action: act.Action) -> None:
        pass

    def check(self) -> None:
        pass


class _Exited(Exception):
    pass


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
    unheard: bool = False  # its agent left while the store was unreachable
    note: Callable[[str], None] = lambda _text: None  # the sim's trace
    reaches: Callable[[str, str], bool] = lambda _a, _b: True  # the sim's reachability matrix
    reach: Reach | None = None  # what its agent's last probe found (``JobAgent._reach``)
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
        if change.job is None or (self.agent is not None and self.agent.rec.woken_by(change)):
            self.woken = True

    def on_presence_gone(self, key: str, deleted: bool) -> None:
        """The job's presences, deletions only (``PresenceWatches``, then ``JobManager.wake``)."""
        change = KEYS.route(key, deleted)
        if change is not None and self.agent is not None and self.agent.rec.woken_by(change):
            self.woken = True

    def _on_join(self, key: str, deleted: bool) -> None:
        """The join watch (``JoinWatch``)."""
        self.join_events.append(key)
        change = KEYS.route(key, deleted)
        if change is not None and self.agent is not None and self.agent.rec.woken_by(change):
            self.woken = True

    def drop_join_watch(self) -> None:
        if self.joins is not None:
            self.joins[1]()
            self.joins = None

    def _join_watch_broke(self) -> None:
        self.drop_join_watch()
        self.woken = True

    def _follow_joins(self, round_no: int | None) -> None:
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

    def step(self, now: float, checker: Checker) -> bool:
        """One pass of ``JobAgent._run``'s loop; True when the agent waits (or has left)."""
        agent = self.agent
        assert agent is not None
        group = self.group.observe(describe=agent.rec.failure is None) if self.group else None
        valid = self.lease is not None and now < self.deadline
        followed = self.joins[0] if self.joins is not None else None
        local = Local(self.lease, valid, group, agent.setup, agent.etcd_error, followed, self.reach)
        if self.waiting:  # its Wait returned: the executor clears its wake-up then (a wake-up
            self.woken = False  # that comes while it steps makes its next Wait return at once)
        self.stepped_at = now
        agent.rec, actions = step(agent.rec, agent.view, local, now)
        agent.view, agent.setup, agent.etcd_error = None, None, None
        waited = False
        try:
            for action in actions:
                waited = isinstance(action, act.Wait)
                if isinstance(action, act.Wait):
                    self.until = action.until
                agent.view = self._execute(agent, action, now) or agent.view
                checker.after(self, action)
        except EtcdUnavailable as exc:
            agent.view, agent.etcd_error = None, str(exc)
        except SetupFailure as exc:
            agent.view, agent.setup = None, exc
        except _Exited:
            self._exit(agent, unheard=agent.rec.leave is not None and local.etcd_error is not None)
            waited = True
        checker.check()
        self.waiting = waited
        return waited

    def _exit(self, agent: Agent, unheard: bool) -> None:
        """``JobAgent._main``'s clean-up; then the manager forgets the agent (and the state dir the job)."""
        self.note(f"{self.name} exits ({agent.rec.state.value} in round {agent.rec.round})")
        self.unheard = unheard
        self.group = None
        self.drop_join_watch()
        agent.rec = replace(agent.rec, state=AgentState.LEFT)
        with contextlib.suppress(EtcdUnavailable):
            run_inline(self.store.clear_waiting(self.name))
            if agent.rec.joined_round >= 0:
                run_inline(self.store.withdraw(agent.rec.joined_round, self.name))
        self.agent, self.ran_job = None, False
        self.presence_stale = True  # ``NodeRegistry.leave``: deleted now, or at a keep-alive
        self.forget_presence()

    def forget_presence(self) -> None:
        """``NodeRegistry._forget_stale``."""
        if self.presence_stale and self.agent is None:
            with contextlib.suppress(EtcdUnavailable):
                self.link.up().delete(KEYS.presence(self.store.job_id, self.name))
                self.presence_stale = False

    def _execute(self, agent: Agent, action: act.Action, now: float) -> View | None:
        """``JobAgent._execute``, against fake workers."""
        match action:
            case act.ReadGlance(round_no):
                return run_inline(self.store.glance(round_no, self.name))
            case act.ReadSnapshot(counted, rosters):
                snap = run_inline(
                    self.store.snapshot(counted, statuses=False, node=self.name, rosters=rosters)
                )
                return Observed(snap, self.alive(presence_asked(snap)))
            case act.Exit():
                raise _Exited
            case act.StopWorkers() | act.StartWorkers() | act.Publish() | act.Probe() | act.WatchJoins():
                self._act_here(agent, action, now)
            case act.Join() | act.Reassert() | act.SetWaiting() | act.NotePending():
                return self._put_under_lease(agent, action)
            case (
                act.Withdraw()
                | act.ClaimLead()
                | act.ClearWaiting()
                | act.CloseRound()
                | act.Bump()
                | act.Amend()
                | act.Finalize()
                | act.MarkDone()
                | act.MarkLeft()
            ):
                self._write(action)
            case act.Wait() | act.WatchPeers() | act.CheckNodes():
                pass  # (peers are proven dead by Crash; the simulated jobs check no nodes)
            case _:
                assert_never(action)
        return None

    def _act_here(
        self,
        agent: Agent,
        action: act.StopWorkers | act.StartWorkers | act.Publish | act.Probe | act.WatchJoins,
        now: float,
    ) -> None:
        """The actions on this node itself: its fake workers, its status, its probes, its watch."""
        match action:
            case act.StopWorkers():
                if self.group is not None:
                    self._publish(agent, now, quietly=True)
                    self.group = None
                    self._publish(agent, now, quietly=True)
            case act.StartWorkers(result, member):
                if self.broken_setup:
                    raise SetupFailure(EndReason.SPAWN_FAILED, f"cannot start workers on {self.name}")
                self.group = FakeGroup(result.round, member, fenced=result.size > 1)
            case act.Publish():
                self._publish(agent, now)
            case act.Probe(round_no, targets):
                reached = frozenset(t[0] for t in targets if self.reaches(self.name, t[0]))
                self.reach = Reach(round_no, reached, frozenset(t[0] for t in targets) - reached, now)
            case act.WatchJoins(round_no):
                self._follow_joins(round_no)

    def _put_under_lease(
        self, agent: Agent, action: act.Join | act.Reassert | act.SetWaiting | act.NotePending
    ) -> Glance | None:
        """The keys put under this node's lease; without a lease, nothing. A join answers with
        a glance."""
        store, lease, name = self.store, self.lease, self.name
        if lease is None:
            return None
        match action:
            case act.Join(round_no):
                i, nproc = self.index, agent.rec.spec.nproc_per_node
                join = Join(name, f"10.0.0.{i + 1}", 29500 + i, nproc, liveness_port=4000 + i)
                return run_inline(store.join(round_no, join, lease))
            case act.Reassert(round_no, join):
                run_inline(store.join(round_no, join, lease))
            case act.SetWaiting():
                run_inline(store.set_waiting(name, lease))
            case act.NotePending(text):
                run_inline(store.note_pending(name, text, lease))
                self.notes.append(text)
        return None

    def _write(
        self,
        action: act.Withdraw
        | act.ClaimLead
        | act.ClearWaiting
        | act.CloseRound
        | act.Bump
        | act.Amend
        | act.Finalize
        | act.MarkDone
        | act.MarkLeft,
    ) -> None:
        """The job's records this node writes, lease or not."""
        store, name = self.store, self.name
        match action:
            case act.Withdraw(round_no):
                run_inline(store.withdraw(round_no, name))
            case act.ClaimLead(round_no, epoch, lease):
                run_inline(store.claim_lead(round_no, name, epoch, lease))
            case act.ClearWaiting():
                run_inline(store.clear_waiting(name))
            case act.MarkDone(round_no):
                run_inline(store.mark_done(round_no, name))
            case act.MarkLeft(round_no):
                run_inline(store.mark_left(round_no, name))
            case act.CloseRound() | act.Bump() | act.Amend() | act.Finalize():
                self._swap(action)

    def _swap(self, action: act.CloseRound | act.Bump | act.Amend | act.Finalize) -> None:
        """The compare-and-swap writes of the round's and the job's records."""
        store, name = self.store, self.name
        match action:
            case act.CloseRound(result):
                if run_inline(store.close(result, name)):
                    run_inline(store.forget_rounds_before(result.round))
            case act.Bump(seen, info, spend):
                if run_inline(store.bump(seen, info, spend)):
                    self.note(f"{name} opened round {info.round} ({info.reason.value}: {info.detail})")
            case act.Amend(seen_mod, record):
                if run_inline(store.amend(seen_mod, record)):
                    self.note(f"{name} amended the record to name its own failure first")
            case act.Finalize(state, code, reason, failure):
                if run_inline(store.finalize(state, code, reason, failure)):
                    self.note(f"{name} ended the job {state.value} ({code.value}: {reason})")

    def _publish(self, agent: Agent, now: float, quietly: bool = False) -> None:
        """``put_node_status`` of ``JobAgent.local_view``."""
        if self.lease is None:
            return
        rec, group = agent.rec, self.group
        running = group is not None and group.outcome is GroupOutcome.RUNNING
        state = rec.state.value
        if group is not None and rec.state is AgentState.RUNNING and not running:
            state = "DONE" if group.outcome is GroupOutcome.SUCCEEDED else "FAILED"
        failure = rec.failure.to_json() if rec.failure else None
        status = {"state": state, "round": rec.round, "devices": "", "failure": failure}
        status |= {"pids": [100 + self.index] if running else [], "updated_at": now}
        try:
            run_inline(self.store.put_node_status(self.name, status, self.lease))
        except EtcdUnavailable:
            if not quietly:
                raise

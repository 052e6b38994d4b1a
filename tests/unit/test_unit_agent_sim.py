"""Several nodes' agents, each stepped by its own executor, sharing one store: random faults, and
the protocol's invariants checked after every step (the simulator is ``tests.agent_sim``).

1. One result per round: a round's result, once written, never changes (and is the current
   round's, with MIN..MAX members).
2. No two rounds with live workers at once: every RUNNING fake group belongs to one round.
3. Budget spent once per event: each round moves ``restarts`` by one exactly when its reason
   spends, never past ``max_restarts``, never more in all than the events that may spend (a
   failure, a node lost, a node that left without being heard), and a failure opens one round.
4. Ranks stable: survivors of the previous result come first, in their old order; ranks are
   contiguous from 0 (``RoundResult`` refuses anything else).
5. Reachability: no round takes in two nodes whose link had been cut for longer than a probe
   stays fresh when it closed (a cut during the rendezvous is the hang timeout's).
6. At rest: after the faults, with no more of them, the job ends (and no agent is left) or runs
   its current round on every member, each agent in a state the store agrees with.

Scenarios at the end, each a failure the simulation can find: A, a drained node that could not reach
the store left unheard; B, a joiner that left raced the leader's close, and its absence spent a
restart; C, the janitor took a round whose members were all done or lost for one looked after;
D, a round closed at its expect grace while a member whose requests failed still ran its workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from elasticd.agent import actions as act
from elasticd.agent.executor import POLL_S
from elasticd.agent.record import AgentState
from elasticd.etcd.keyref import KeyKind
from elasticd.jobs.decider import GroupOutcome
from elasticd.rendezvous import roster
from elasticd.rendezvous.model import Assignment, FinalRecord, RoundHead, RoundInfo, RoundResult
from elasticd.rendezvous.reach import PROBE_FRESH_S
from elasticd.terms.spec import JobSpec, NodeRange
from elasticd.terms.state import JobState, RoundReason
from tests import fakes
from tests.agent_sim import KEYS, Checker, Daemon, Node, Sim


def make_spec(nnodes: tuple[int, int] = (2, 4), max_restarts: int = 3) -> JobSpec:
    return fakes.make_spec(
        nnodes=NodeRange(*nnodes), max_restarts=max_restarts, stop_grace_s=1.0, last_call_s=0.5,
        join_timeout_s=5.0,
    )  # fmt: skip


class Invariants(Checker):
    """Invariants 1-4: every write of the job (a watch on its prefix) and every start of workers,
    checked as they come. Watch callbacks must not raise (MemoryKV logs and drops what they
    raise): violations are kept, and raised after the step."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.rounds: dict[int, RoundInfo] = {}
        self.results: dict[int, RoundResult] = {}
        self.restarts = 0
        self.spent = 0
        self.final: FinalRecord | None = None
        self.failures: set[tuple[str, int]] = set()
        self.violations: list[str] = []
        self.hooks: list[Callable[[Node, act.Action], None]] = []
        sim.checker = self
        sim.kv.watch_prefix(KEYS.job(sim.spec.id), self._on_change, lambda: None)

    def bad(self, text: str) -> None:
        self.violations.append(text)
        self.sim.note(f"VIOLATION {text}")

    def check(self) -> None:
        if self.violations:
            raise AssertionError("; ".join(self.violations) + "\n" + "\n".join(self.sim.trace))

    def after(self, node: Node, action: act.Action) -> None:
        for hook in self.hooks:
            hook(node, action)
        if not isinstance(action, act.StartWorkers):
            return
        head = action.result
        stored = self.results.get(head.round)
        if stored is None or stored.head() != head or stored.member(node.name) != action.member:
            self.bad(f"{node.name} started workers of {head} as {action.member}, not of the stored result")
        running = {
            n.name: n.group.round
            for n in self.sim.nodes
            if n.group and n.group.outcome is GroupOutcome.RUNNING
        }
        if len(set(running.values())) > 1:
            self.bad(f"workers of two rounds run at once: {running}")

    def _on_change(self, key: str, deleted: bool) -> None:
        kv = None if deleted else self.sim.kv.get(key)
        try:
            kind = KEYS.parse(key).kind
            if kv is not None and kind is KeyKind.ROUND:
                self._round(RoundInfo.from_json(kv.json()))
            elif kv is not None and kind is KeyKind.RESULT:  # written last: every assignment is there
                head = RoundHead.from_json(kv.json())
                found = self.sim.kv.get_prefix(KEYS.assignments(KEYS.parse(key).job, head.round))
                self._result(roster.assemble(head, [Assignment.from_json(a.json()) for a in found]))
            elif kv is not None and kind is KeyKind.FINAL:
                self._final(FinalRecord.from_json(kv.json()))
            elif kv is not None and kind is KeyKind.RESTARTS and kv.json() != self.restarts:
                self.bad(f"restarts written as {kv.json()} apart from a round (at {self.restarts})")
        except Exception as exc:  # a record that does not read back is a violation too
            self.bad(f"{key}: {exc!r}")

    def _round(self, info: RoundInfo) -> None:
        spec, r = self.sim.spec, info.round
        stored = self.sim.kv.get(KEYS.job_restarts(spec.id))
        now = stored.json() if stored is not None else -1
        if r in self.rounds or (r > 0 and r - 1 not in self.rounds):
            self.bad(f"round {r} opened after rounds {sorted(self.rounds)}")
        if now - self.restarts != int(info.reason.spends_budget):
            self.bad(f"round {r} ({info.reason.value}) moved restarts from {self.restarts} to {now}")
        self.spent += max(0, now - self.restarts)
        self.restarts = now
        if now > spec.max_restarts:
            self.bad(f"restarts {now} > max_restarts {spec.max_restarts}")
        if self.spent > self.sim.spending:
            self.bad(f"{self.spent} restarts spent for {self.sim.spending} events that may spend")
        if info.reason is RoundReason.WORKER_FAILED and info.failure is not None:
            failed = (str(info.failure["node"]), int(info.failure["attempt"]))
            if failed in self.failures:
                self.bad(f"the failure {failed} opened two rounds")
            self.failures.add(failed)
        self.rounds[r] = info
        self.sim.note(f"round {r} opened: {info.reason.value}, restarts {now}, expect {list(info.expect)}")

    def _result(self, result: RoundResult) -> None:
        r, nnodes = result.round, self.sim.spec.nnodes
        old = self.results.get(r)
        if old is not None and old != result:
            self.bad(f"the result of round {r} changed from {old} to {result}")
        if old is not None:
            return
        if r != max(self.rounds):
            self.bad(f"round {r} closed while round {max(self.rounds)} is current")
        cut = [
            sorted(pair)
            for pair, since in self.sim.cuts.items()
            if pair <= set(result.nodes) and result.closed_at >= since + PROBE_FRESH_S
        ]
        if cut:
            self.bad(f"round {r} closed with {list(result.nodes)}, across cut links {cut}")
        if not nnodes.min <= len(result.members) <= nnodes.max:
            self.bad(f"round {r} closed with {len(result.members)} members ({nnodes})")
        prev = max((k for k in self.results if k < r), default=None)
        survivors = [n for n in self.results[prev].nodes if n in result.nodes] if prev is not None else []
        if list(result.nodes[: len(survivors)]) != survivors:
            self.bad(f"round {r}'s ranks {result.nodes} do not keep the survivors' order {survivors}")
        self.results[r] = result
        self.sim.note(f"round {r} closed: {list(result.nodes)}")

    def _final(self, final: FinalRecord) -> None:
        if self.final is not None and self.final != final:
            self.bad(f"the final record changed from {self.final} to {final}")
        self.final = final
        self.sim.note(f"final: {final.state.value} {final.code.value}: {final.reason}")
        if final.code.setup and not any(n.broken_setup for n in self.sim.nodes):
            self.bad(f"the job ended {final.code.value} with no setup failure")
        if final.state is JobState.SUCCEEDED:
            read = self.sim.read_job()
            done = read.done_in(read.current)
            if read.result is None or not set(read.result.nodes) <= done:
                self.bad(f"SUCCEEDED with round {read.current}'s members not all done ({done})")


def new_sim(spec: JobSpec, initial: int = 3, pool: int = 5, wakes: bool = False) -> tuple[Sim, Invariants]:
    sim = Sim(spec, initial, pool, wakes)
    checks = Invariants(sim)
    sim.submit()
    return sim, checks


# -- invariant 6 ------------------------------------------------------------------------------------
def unsettled(sim: Sim) -> str | None:
    """None if the job is at rest and every agent agrees with the store; else what is not."""
    read = sim.read_job()
    if any(n.group is not None and n.agent is None for n in sim.nodes):
        return "workers run without an agent"
    if read.ended:
        busy = [n.name for n in sim.nodes if n.agent is not None]
        return f"the job ended but {busy} still take part" if busy else None
    result = read.result
    if result is None:
        return f"round {read.current} is still open"
    done = read.done_in(read.current)
    for node in sim.nodes:
        agent, group, member = node.agent, node.group, node.name in result.nodes
        if member and (agent is None or node.daemon is not Daemon.UP) and node.name not in done:
            return f"member {node.name} of round {read.current} has no agent"
        if agent is None:
            continue
        rec = agent.rec
        if not member and (rec.state is not AgentState.WAITING or node.name not in read.waiting):
            return f"{node.name} is {rec.state.value} outside round {read.current}"
        if not member:
            continue
        want = GroupOutcome.SUCCEEDED if rec.state is AgentState.DONE else GroupOutcome.RUNNING
        if rec.state not in (AgentState.RUNNING, AgentState.DONE) or rec.round != read.current:
            return f"member {node.name} is {rec.state.value} in round {rec.round}, not {read.current}"
        if group is None or group.round != read.current or group.outcome is not want:
            return f"member {node.name} ({rec.state.value}) has workers {group}"
        if node.name not in done and node.name not in {j.node for j in read.current_joins}:
            return f"member {node.name} runs round {read.current} without its join"
    return None


class Unsettled(AssertionError):
    pass


def settle(sim: Sim, ticks: int = 80) -> None:
    """Heal every link, then tick with no faults until the job is at rest for two ticks."""
    sim.heal()
    calm = 0
    for _ in range(ticks):
        sim.tick()
        calm = calm + 1 if unsettled(sim) is None else 0
        if calm >= 2:
            return
        sim.advance(0.5)
    raise Unsettled(f"the job never came to rest: {unsettled(sim)}\n" + "\n".join(sim.trace))


# -- the property -----------------------------------------------------------------------------------
POOL = 5
NODE = st.integers(0, POOL - 1)
ARGS: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "fail": st.tuples(NODE, st.sampled_from([1, -9])),
    "succeed": st.tuples(NODE),
    "crash": st.tuples(NODE, st.booleans()),
    "restart": st.tuples(NODE),
    "drain": st.tuples(NODE, st.sampled_from([None, 1.0, 2.0])),
    "stop": st.tuples(NODE),
    "outage": st.tuples(NODE, st.integers(1, 4)),
    "partition": st.tuples(NODE, st.sampled_from([0.5, 1.0, 2.0, 3.0])),
    "cut_peers": st.tuples(NODE),
    "heal_peers": st.tuples(),
    "arrive": st.tuples(),
    "advance": st.just((0.0,)),  # nothing happens but time
}
KINDS = [*ARGS] * 2 + ["advance"] * 8 + ["fail"] * 4 + ["arrive", "restart"]
EVENTS = st.sampled_from(KINDS).flatmap(lambda kind: ARGS[kind].map(lambda args: (kind, *args)))
TICKS = st.tuples(EVENTS, st.sampled_from([0.0, 0.1, 0.25, 0.5]), st.permutations(range(POOL)))
Tick = tuple[tuple[Any, ...], float, list[int]]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nnodes=st.sampled_from([(1, 3), (2, 4), (2, 3)]),
    max_restarts=st.integers(2, 4),
    initial=st.integers(1, 4),
    ticks=st.lists(TICKS, min_size=8, max_size=40),
    broken=st.sampled_from([None] * 15 + list(range(POOL))),  # from halfway, its workers cannot start
    wakes=st.booleans(),
)
def test_random_faults_keep_the_invariants(
    nnodes: tuple[int, int],
    max_restarts: int,
    initial: int,
    ticks: list[Tick],
    broken: int | None,
    wakes: bool,
) -> None:
    """Each tick: one event (or none), every node steps (in the drawn order) until it waits, then
    time moves on. Then quiet ticks until the job is at rest (invariant 6). With ``wakes``, a node
    steps only when something wakes it, as a daemon's agent does (the joins reach only leaders)."""
    sim, checks = new_sim(make_spec(nnodes, max_restarts), initial, POOL, wakes)
    for k, ((name, *args), dt, order) in enumerate(ticks):
        if broken is not None and k == len(ticks) // 2:
            sim.break_setup(broken)
        sim.note(f"{name} {args}")
        getattr(sim, name)(*args)
        sim.tick(order)
        sim.advance(dt)
    settle(sim)
    assert not any(n.main_joins for n in sim.nodes)  # the manager's watch carries no join
    event(f"ended {checks.final.code.value}" if checks.final else "runs")
    event(f"rounds: {min(len(checks.rounds), 5)}{'+' if len(checks.rounds) >= 5 else ''}")


# -- scenarios ----------------------------------------------------------------------------------------
def running(nnodes: tuple[int, int] = (2, 4), nodes: int = 3) -> tuple[Sim, Invariants]:
    """A job whose first round runs on ``nodes`` nodes (n0 leads it)."""
    sim, checks = new_sim(make_spec(nnodes), nodes)
    settle(sim)
    assert checks.results[0].nodes == tuple(f"n{i}" for i in range(nodes))
    return sim, checks


def test_a_failure_on_every_node_opens_one_round() -> None:
    sim, checks = running()
    for i in range(3):  # a collective failure: every member sees its own workers fail
        sim.fail(i)
    sim.tick()
    assert len(checks.rounds) == 2 and checks.restarts == 1
    settle(sim)
    assert checks.results[1].nodes == ("n0", "n1", "n2") and checks.restarts == 1


def test_a_member_lost_while_the_round_closes_is_spent_once() -> None:
    """n1 crashes between the leader's read and its close: round 0 closes with it, and its loss,
    seen by both survivors, opens one round (one restart) in which they keep their order."""
    sim, checks = new_sim(make_spec((2, 4)), 3)
    sim.tick()  # every node joins; the leader waits for the last call

    def crash_n1(node: Node, action: act.Action) -> None:
        # (the read after its probe of the joiners: the last before it closes)
        if node.name == "n0" and isinstance(action, act.ReadJob) and node.reach is not None:
            sim.crash(1)

    checks.hooks.append(crash_n1)
    sim.advance(0.5)
    settle(sim)
    assert checks.results[0].nodes == ("n0", "n1", "n2")
    assert [checks.rounds[1].reason, checks.results[1].nodes] == [RoundReason.MEMBER_LOST, ("n0", "n2")]
    assert checks.restarts == 1 and sim.spending == 1


@pytest.mark.parametrize(("order", "restarts"), [([0, 1, 2], 1), ([1, 0, 2], 0)])
def test_a_drain_during_a_bump_spends_nothing(order: list[int], restarts: int) -> None:
    """n0's workers fail as n1 is drained: whichever bump wins, the drain spends nothing, and the
    failure at most once (not at all if the drain's round overtook it: its workers restart anyway)."""
    sim, checks = running()
    sim.fail(0)
    sim.drain(1)
    sim.tick(order)
    settle(sim)
    assert [len(checks.rounds), checks.restarts] == [2, restarts]
    assert checks.results[1].nodes == ("n0", "n2") and sim.node("n1").agent is None


def test_a_partitioned_member_is_fenced_then_rejoins_as_a_newcomer() -> None:
    sim, checks = running()
    sim.partition(1, 3.0)
    for _ in range(12):
        sim.tick()
        node = sim.node("n1")
        if node.lease is None:  # past its deadline: the reaper killed its workers, the fence stopped them
            assert node.group is None or node.group.outcome is GroupOutcome.FAILED
        sim.advance(0.25)
    assert [checks.rounds[1].reason, checks.results[1].nodes] == [RoundReason.MEMBER_LOST, ("n0", "n2")]
    settle(sim)  # back: it stops what the reaper killed, and joins the job again (a scale-up)
    assert checks.rounds[max(checks.rounds)].reason is RoundReason.SCALE_UP
    assert checks.results[max(checks.results)].nodes == ("n0", "n2", "n1") and checks.restarts == 1


# -- failures the simulation can find (each a regression test) -------------------------------------------
def test_a_drained_member_that_cannot_reach_the_store_is_still_heard() -> None:
    sim, checks = running()
    sim.outage(1, 4)  # the read, both quiet publishes of the stop, and the clear_waiting
    sim.drain(1)
    sim.tick()
    settle(sim)
    assert checks.results[max(checks.results)].nodes == ("n0", "n2") and checks.restarts == 0


def test_a_joiner_that_leaves_while_the_round_closes_spends_nothing() -> None:
    sim, checks = new_sim(make_spec((2, 4)), 3)
    sim.tick()  # every node joins; n0 leads and waits for the last call
    sim.advance(0.5)
    sim.drain(1)
    sim.tick([1, 0, 2])  # n1 and n0 read; n1 leaves; n0 closes with what it read
    settle(sim)
    assert checks.results[max(checks.results)].nodes == ("n0", "n2") and checks.restarts == 0


def test_a_round_with_only_done_and_lost_members_is_restarted() -> None:
    sim, checks = running((2, 3), 2)
    sim.succeed(1)
    sim.tick()  # n1 marks itself done
    sim.crash(1)
    sim.crash(0)
    sim.arrive()
    sim.arrive()
    settle(sim)
    assert checks.results[max(checks.results)].nodes == ("n2", "n3")


def test_a_member_whose_requests_fail_past_the_expect_grace_is_waited_for() -> None:
    """D: n3's requests fail (its lease lives: the keep-alive gets through) as n2's workers fail;
    its agent retries once a second, so it hears of round 1 only after the round's expect grace
    (stop grace + 2 s), while n4, a newcomer, fills the round. The round waits for n3 to stop its
    workers and rejoin: closing at the grace ran round 1's workers beside n3's of round 0."""
    sim, checks = new_sim(make_spec((2, 4), 2), 4, wakes=True)
    settle(sim)
    # Its reads of round 1 fail, one a second from 0.5 s: it hears of the round at 4.5 s, past the
    # grace (3 s) and within the join timeout (5 s).
    sim.outage(3, 4)
    sim.fail(2)
    sim.tick()
    opened = checks.rounds[1].opened_at
    sim.arrive()
    sim.run(24)
    result = checks.results[1]
    assert result.nodes == ("n0", "n1", "n2", "n3") and result.closed_at >= opened + 3.0
    assert checks.restarts == 1
    settle(sim)


# -- joins reach only a round's leader (agents woken as a daemon's are) ---------------------------------
def test_the_next_oldest_join_takes_over_a_round_whose_leader_died() -> None:
    """n0 leads round 0 (2..3 nodes, a long last call) and crashes before it closes. n1, now the
    oldest join, is told by the job's presence watch (n0's presence went with its lease; that
    watch carries no join, and n1 had no join watch: no join event reached it), reads the job and
    follows the joins from then on: the join that makes the round full wakes it, and it closes
    the round at once (nothing else would wake it before its poll)."""
    spec = fakes.make_spec(nnodes=NodeRange(2, 3), stop_grace_s=1.0, last_call_s=30.0, join_timeout_s=60.0)
    sim, checks = new_sim(spec, 2, wakes=True)
    sim.tick()  # n0 and n1 join; n0 leads, waiting for a third node or the last call
    assert sim.node("n0").joins is not None and sim.node("n1").joins is None
    took_over: list[list[str]] = []

    def first_watch(node: Node, action: act.Action) -> None:
        if node.name == "n1" and action == act.WatchJoins(0) and not took_over:
            took_over.append(list(node.join_events))

    checks.hooks.append(first_watch)
    sim.crash(0)
    sim.tick()
    assert took_over == [[]]  # n1 leads, told of no join
    sim.arrive()  # n2 joins: n1 reads it (its watch woke it) and waits on
    sim.tick()
    assert 0 not in checks.results
    sim.arrive()  # n3 joins: the round is full, and only n1's join watch says so
    sim.tick()
    n1 = sim.node("n1")
    assert checks.results[0].nodes == ("n1", "n2", "n3")
    assert n1.join_events == [KEYS.join(spec.id, 0, n) for n in ("n2", "n3")] and n1.joins is None
    assert not any(n.main_joins for n in sim.nodes) and not sim.node("n2").join_events


def test_a_leader_that_leaves_a_filling_round_hands_it_on_at_once() -> None:
    """n0 leads round 0 and is drained before it closes: it withdraws its join before it writes
    ``left``, so the nodes ``left`` wakes see n1 lead (no join event tells them), and n1 closes.
    They step as soon as ``left`` is written, before n0 is done leaving (its exit withdraws too)."""
    sim, checks = new_sim(make_spec((2, 4)), 3, wakes=True)
    sim.tick()

    def others_step_at_once(node: Node, action: act.Action) -> None:
        if node.name == "n0" and isinstance(action, act.MarkLeft):
            for other in (sim.node("n1"), sim.node("n2")):
                while other.runnable(sim.now, wakes=True):
                    other.step(sim.now, checks)

    checks.hooks.append(others_step_at_once)
    drained = sim.now
    sim.drain(0)
    sim.tick()
    assert sim.node("n0").agent is None and sim.node("n1").joins is not None
    for _ in range(10):
        sim.advance(0.1)
        sim.tick()
    assert checks.results[0].nodes == ("n1", "n2") and sim.now - drained < POLL_S

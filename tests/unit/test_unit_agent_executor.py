"""The agent's executor against its seams' in-memory fakes: an in-memory store (``MemoryKV``),
fake worker groups, a fake lease. No process, no etcd, no sleep: every wait is on an event."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from elasticd.agent import actions as act
from elasticd.agent import executor
from elasticd.agent.executor import JobAgent
from elasticd.agent.record import AgentState
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.memory import MemoryKV
from elasticd.jobs.agentstore import Offer
from elasticd.jobs.attempt import NodeRuntime
from elasticd.jobs.decider import Group, GroupOutcome, group_outcome
from elasticd.node.inventory import Inventory
from elasticd.node.liveness import LivenessServer
from elasticd.progress.goodput import Ledger, Silence, opened
from elasticd.progress.tracker import RankProgress
from elasticd.rendezvous.fitness import CheckTarget, Link
from elasticd.rendezvous.jobread import MemberRead, RostersRead
from elasticd.rendezvous.model import Join, Member, RoundHead
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.spec import JobSpec, NodeRange
from elasticd.terms.state import EndReason, JobState, SetupFailure, WorkerFailure
from tests.fakes import JOB, make_spec

pytestmark = pytest.mark.timeout(30)
KEYS = Keys("/x")


class FakeWorkers:
    """A group of ``n`` workers whose exits the test decides."""

    def __init__(self, round_no: int, n: int) -> None:
        self.round = round_no
        self.exited: list[asyncio.Future[int]] = [
            asyncio.get_running_loop().create_future() for _ in range(n)
        ]
        self.stopped: float | None = None

    def pids(self) -> list[int]:
        return [100 + i for i, f in enumerate(self.exited) if not f.done()]

    def pgids(self) -> list[int]:
        return [100 + i for i in range(len(self.exited))]

    def exits(self) -> set[asyncio.Future[int]]:
        return {f for f in self.exited if not f.done()}

    def progress(self) -> list[RankProgress]:
        return []

    def observe(self, describe: bool) -> Group:
        codes = [f.result() for f in self.exited if f.done()]
        outcome = group_outcome(codes, len(self.exits()))
        if outcome is GroupOutcome.FAILED and describe:
            rank = next(i for i, f in enumerate(self.exited) if f.done() and f.result() != 0)
            failure = WorkerFailure.from_exit(node="n1", attempt=self.round, rank=rank, local_rank=rank,
                                              returncode=codes[0] or 1, message="boom", tail="")  # fmt: skip
            return Group(outcome, failure)
        return Group(outcome)

    async def stop(self, grace_s: float) -> list[int]:
        self.stopped = grace_s
        for f in self.exited:
            if not f.done():
                f.set_result(-15)
        return []

    def finish(self, *codes: int) -> None:
        for f, code in zip(self.exited, codes, strict=False):
            f.set_result(code)


class FakeLauncher:
    def __init__(self, failure: SetupFailure | None = None) -> None:
        self.groups: list[FakeWorkers] = []
        self.started = asyncio.Event()
        self.failure = failure
        self.prepared: list[str] = []
        self.closed = 0

    def prepare(self, spec: JobSpec) -> None:
        self.prepared.append(spec.id)

    async def close(self) -> None:
        self.closed += 1

    async def offer(self, round_no: int) -> Offer:
        return Offer(29500, False)

    def goodput(self) -> Ledger | None:
        return opened(0.0)

    async def check_links(self, targets: tuple[CheckTarget, ...]) -> dict[str, Link]:
        return {}

    async def start(self, spec: JobSpec, result: RoundHead, member: Member, restarts: int,
                    slots: tuple[int, ...], silence: Silence | None = None) -> FakeWorkers:  # fmt: skip
        if self.failure is not None:
            raise self.failure
        group = FakeWorkers(result.round, member.local_world_size)
        self.groups.append(group)
        self.started.set()
        return group


class FakeLease:
    def __init__(self, kv: MemoryKV) -> None:
        self.lease_id: int | None = kv.grant_lease(30)

    def lease_valid(self) -> bool:
        return True

    async def alive(self, among: frozenset[str] | None = None) -> frozenset[str]:
        return frozenset({"n1"}) if among is None else frozenset({"n1"}) & among


async def until(what: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """Wait for ``what()`` to be true, checking after each turn of the loop."""
    async with asyncio.timeout(timeout_s):
        while not (value := what()):
            await asyncio.sleep(0.01)
        return value


def scenario(body: Callable[[JobAgent, FakeLauncher, InlineJobStore, MemoryKV], Awaitable[None]],
             spec: JobSpec | None = None, launcher_failure: SetupFailure | None = None,
             invalid: list[int] | None = None,
             before: Callable[[MemoryKV], None] = lambda _kv: None) -> None:  # fmt: skip
    async def main() -> None:
        kv = MemoryKV()
        store = InlineJobStore(kv, KEYS, JOB)
        job = spec or make_spec(nnodes=NodeRange(1, 1), nproc_per_node=2, max_restarts=2, last_call_s=0.0)
        assert run_inline(store.create(job))
        before(kv)
        rt = NodeRuntime("n1", "127.0.0.1", Path("/nonexistent"), Inventory((), 2), SimpleNamespace())  # type: ignore[arg-type]
        launcher = FakeLauncher(launcher_failure)
        changes: list[AgentState] = []
        agent = JobAgent(job, rt, store, FakeLease(kv), (0, 1), lambda a: changes.append(a.state),
                         launcher=launcher,
                         on_invalid=None if invalid is None else lambda: invalid.append(1))  # fmt: skip
        loop = asyncio.get_running_loop()

        joins: list[str] = []  # joins the manager's watch carried: none, ever

        def on_change(key: str, deleted: bool) -> None:  # what ``JobManager.watch`` routes
            change = KEYS.route(key, deleted)
            if change is not None and change.kind is KeyKind.JOIN:
                joins.append(key)
            loop.call_soon(agent.wake, change)

        for start, end in KEYS.watched():  # the manager's watch: everything but the joins
            kv.watch_range(start, end, on_change, lambda: None)
        gone = KEYS.presences(JOB)  # the manager's ``PresenceWatches``: the job's nodes that go
        kv.watch_range(gone, prefix_end(gone), on_change, lambda: None, deletes_only=True)
        agent.start()
        try:
            await body(agent, launcher, store, kv)
            await asyncio.wait_for(agent.wait(), 10)
        finally:
            if agent.task is not None:
                agent.task.cancel()
        assert changes[-1] is AgentState.LEFT and joins == []

    asyncio.run(main())


def test_a_single_node_job_runs_to_success() -> None:
    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        assert agent.state is AgentState.RUNNING
        launcher.groups[0].finish(0, 0)
        read = await until(lambda: (s := run_inline(store.read_rosters())).final and s)
        assert read.final.state is JobState.SUCCEEDED and read.done == {0: {"n1"}}

    scenario(body)


def test_a_failed_worker_restarts_the_job_once_then_it_succeeds() -> None:
    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        launcher.groups[0].finish(1)  # rank 0 fails: the group is stopped, the round bumped
        await until(lambda: len(launcher.groups) == 2)
        assert launcher.groups[0].stopped is not None  # stopped before the next round started
        read = run_inline(store.read_rosters())
        assert read.restarts == 1 and read.current == 1 and read.round is not None
        assert read.round.failure is not None and read.round.failure["rank"] == 0
        launcher.groups[1].finish(0, 0)
        final = await until(lambda: run_inline(store.read_rosters()).final)
        assert final.state is JobState.SUCCEEDED

    scenario(body)


def test_a_failure_with_no_restart_left_fails_the_job_with_its_summary() -> None:
    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        launcher.groups[0].finish(0, 3)
        final = await until(lambda: run_inline(store.read_rosters()).final)
        assert final.state is JobState.FAILED and final.code is EndReason.WORKER_FAILED
        assert "no restarts left" in final.reason and final.failure is not None

    scenario(body, spec=make_spec(nnodes=NodeRange(1, 1), nproc_per_node=2, max_restarts=0, last_call_s=0.0))


def test_a_setup_failure_ends_the_job_with_its_own_code_and_spends_nothing() -> None:
    failure = SetupFailure(EndReason.ENTRY_UNAVAILABLE, "script missing or not accessible to u")

    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        read = await until(lambda: (s := run_inline(store.read_rosters())).final and s)
        assert read.final.code is EndReason.ENTRY_UNAVAILABLE and read.restarts == 0

    scenario(body, launcher_failure=failure)


def test_workers_keep_running_through_a_store_outage_and_report_when_it_is_back() -> None:
    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        kv.available = False
        launcher.groups[0].finish(0, 0)  # they end while the store is unreachable
        await until(lambda: agent.rec.etcd_down_since is not None)
        assert (
            launcher.groups[0].stopped is None and agent.state is AgentState.DONE
        ) or agent.workers is not None
        kv.available = True
        final = await until(lambda: run_inline(store.read_rosters()).final)
        assert final.state is JobState.SUCCEEDED and agent.rec.etcd_down_since is None

    scenario(body)


def test_a_leave_request_marks_left_and_spends_no_restart() -> None:
    from elasticd.terms.state import RoundReason

    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        agent.leave(RoundReason.MEMBER_LEFT, "node n1 drained", 0.5)
        await asyncio.wait_for(agent.wait(), 10)
        read = run_inline(store.read_rosters())
        assert launcher.groups[0].stopped == 0.5 and read.restarts == 0
        assert read.current == 1 and read.left == {1: {"n1"}} and read.final is None

    scenario(body)


def test_an_invalid_record_tells_the_manager_at_once_and_the_agent_acts_on_nothing_until_it_ends() -> None:
    """The janitor ends a job with an invalid record; the agent that reads one wakes the janitor's
    scan instead of leaving the job to its next poll, and changes nothing meanwhile."""
    told: list[int] = []

    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        kv.put_json(KEYS.job_restarts(JOB), "not a count")
        await until(lambda: told)
        read = run_inline(store.read_rosters())
        assert read.final is None and read.restarts == 0  # nothing acted on meanwhile
        assert run_inline(store.fail_invalid(read))  # what the janitor does

    scenario(body, invalid=told)


def _other_node(kv: MemoryKV, node: str, daemon: bool = True) -> int:
    """Another node's join of round 0 under its lease, and (``daemon``) its presence in the job:
    without it, the join is the only key that changes."""
    lease = kv.grant_lease(30)
    if daemon:
        kv.put_json(KEYS.presence(JOB, node), {}, lease)
    kv.put_json(KEYS.join(JOB, 0, node), Join(node, f"h-{node}", 29500, 2).to_json(), lease)
    return lease


class Reads:
    """Counts the agent's reads of the job, and where the count was when a join watch opened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.at_watch: list[int] = []
        self.statuses: list[bool] = []  # whether each read asked for the nodes' statuses
        member, rosters = InlineJobStore.read_member, InlineJobStore.read_rosters
        watch_joins = InlineJobStore.watch_joins

        async def counted_member(
            store: InlineJobStore, node: str, counted_of: int | None = None, statuses: bool = True
        ) -> MemberRead:
            self.count += 1
            self.statuses.append(statuses)
            return await member(store, node, counted_of, statuses)

        async def counted_rosters(
            store: InlineJobStore, counted_of: int | None = None, statuses: bool = True
        ) -> RostersRead:
            self.count += 1
            self.statuses.append(statuses)
            return await rosters(store, counted_of, statuses)

        async def watched(store: InlineJobStore, round_no: int, *args: Any) -> Callable[[], None]:
            self.at_watch.append(self.count)
            return await watch_joins(store, round_no, *args)

        monkeypatch.setattr(InlineJobStore, "read_member", counted_member)
        monkeypatch.setattr(InlineJobStore, "read_rosters", counted_rosters)
        monkeypatch.setattr(InlineJobStore, "watch_joins", watched)

    def after_watch(self) -> bool:
        """The agent read the job again since its join watch opened: it has seen every join
        that came before the watch, and waits for the watch (or the poll) to tell it of more."""
        return bool(self.at_watch) and self.count > self.at_watch[-1]


TWO_NODES = make_spec(nnodes=NodeRange(2, 2), nproc_per_node=2, max_restarts=2, last_call_s=0.0)


def test_the_leader_is_woken_by_each_join_through_its_own_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """No poll: the manager's watch carries no join, so only the leader's join watch can tell it
    that the round is full. Once closed, the round's joins are not followed any more."""
    monkeypatch.setattr(executor, "POLL_S", 3600.0)
    reads = Reads(monkeypatch)

    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(reads.after_watch)
        assert agent.rec.leading and agent.state is AgentState.JOINING and agent._joins.round == 0
        assert reads.statuses and not any(reads.statuses)  # an agent never reads them (no decider does)
        _other_node(kv, "n2", daemon=False)
        await until(lambda: launcher.groups)
        assert run_inline(store.read_rosters()).result.nodes == ("n1", "n2")  # type: ignore[union-attr]
        await until(lambda: agent._joins.round is None)
        run_inline(store.finalize(JobState.KILLED, EndReason.KILLED, "killed"))

    scenario(body, spec=TWO_NODES)


def test_the_next_oldest_join_takes_over_a_round_whose_leader_died(monkeypatch: pytest.MonkeyPatch) -> None:
    """n2 leads round 0 and dies: its presence in the job goes with its lease (the manager's
    presence watch says so), n1 now holds the oldest join, reads the job, starts following the
    joins, and closes when n3 joins. No join event reached n1 before it led, and nothing polled."""
    monkeypatch.setattr(executor, "POLL_S", 3600.0)
    reads = Reads(monkeypatch)
    leader: list[int] = []

    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: agent.state is AgentState.JOINING and agent.rec.joined_round == 0)
        await until(lambda: run_inline(store.glance(0, "n1")).joined)
        assert not agent.rec.leading and agent._joins.round is None
        kv.revoke_lease(leader[0])  # n2 dies
        await until(reads.after_watch)
        assert agent.rec.leading and agent._joins.round == 0 and not launcher.groups
        _other_node(kv, "n3", daemon=False)
        await until(lambda: launcher.groups)
        assert run_inline(store.read_rosters()).result.nodes == ("n1", "n3")
        run_inline(store.finalize(JobState.KILLED, EndReason.KILLED, "killed"))

    scenario(body, spec=TWO_NODES, before=lambda kv: leader.append(_other_node(kv, "n2")))


@pytest.mark.parametrize("listening", [True, False], ids=["reached", "refused"])
def test_the_leader_probes_a_joiners_liveness_port_before_it_closes(listening: bool) -> None:
    """n2's join names a liveness port on loopback: a daemon that listens there is taken in; one
    that cannot be reached (nothing listens) is left out of the round, which MIN 1 allows."""

    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        server = LivenessServer("127.0.0.1")
        await server.start()
        port = server.port
        if not listening:
            await server.close()
        try:
            await until(lambda: agent.rec.leading)
            join = Join("n2", "127.0.0.1", 29500, 2, liveness_port=port)
            kv.put_json(KEYS.join(JOB, 0, "n2"), join.to_json(), kv.grant_lease(30))
            await until(lambda: launcher.groups)
            result = run_inline(store.read_rosters()).result
            assert result is not None and result.nodes == (("n1", "n2") if listening else ("n1",))
            reach = agent._looks.reach
            assert reach is not None and reach.unreached == (set() if listening else {"n2"})
            run_inline(store.finalize(JobState.KILLED, EndReason.KILLED, "killed"))
        finally:
            await server.close()

    spec = make_spec(nnodes=NodeRange(1, 2), nproc_per_node=2, max_restarts=2, last_call_s=5.0)
    scenario(body, spec=spec)


def test_a_write_asked_for_without_a_lease_is_dropped_and_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(executor, "_log", SimpleNamespace(info=lambda event, **kw: said.append((event, kw))))

    async def main() -> None:
        kv = MemoryKV()
        store = InlineJobStore(kv, KEYS, JOB)
        job = make_spec(nnodes=NodeRange(1, 1), nproc_per_node=2)
        assert run_inline(store.create(job))
        rt = NodeRuntime("n1", "127.0.0.1", Path("/nonexistent"), Inventory((), 2), SimpleNamespace())  # type: ignore[arg-type]
        lease = FakeLease(kv)
        lease.lease_id = None  # lost between the step and the write
        agent = JobAgent(job, rt, store, lease, (0, 1), lambda a: None, launcher=FakeLauncher(None))
        for action in (act.Publish(), act.SetWaiting(), act.NotePending("why")):
            assert await agent._execute(action) is None
        written = (KEYS.node_status(JOB, "n1"), KEYS.waiting(JOB, "n1"), KEYS.pending_note(JOB, "n1"))
        assert [kv.get(key) for key in written] == [None, None, None]

    asyncio.run(main())
    assert [(e, kw["action"]) for e, kw in said] == [
        ("agent.dropped", "Publish"),
        ("agent.dropped", "SetWaiting"),
        ("agent.dropped", "NotePending"),
    ]
    assert all("no lease" in kw["why"] for _, kw in said)

"""The agent's executor against its seams' in-memory fakes: an in-memory store (``MemoryKV``),
fake worker groups, a fake lease. No process, no etcd, no sleep: every wait is on an event."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from elasticd.agent.executor import JobAgent
from elasticd.agent.record import AgentState, Group
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.jobs.decider import GroupOutcome, group_outcome
from elasticd.jobs.launch import NodeRuntime
from elasticd.jobs.spec import JobSpec, NodeRange
from elasticd.jobs.state import EndReason, JobState, SetupFailure, WorkerFailure
from elasticd.node.inventory import Inventory
from elasticd.progress.tracker import RankProgress
from elasticd.rendezvous.model import Member, RoundResult
from elasticd.rendezvous.store import InlineJobStore, run_inline
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

    async def start(self, spec: JobSpec, result: RoundResult, member: Member, restarts: int,
                    slots: tuple[int, ...]) -> FakeWorkers:  # fmt: skip
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

    async def alive(self) -> frozenset[str]:
        return frozenset({"n1"})


async def until(what: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """Wait for ``what()`` to be true, checking after each turn of the loop."""
    async with asyncio.timeout(timeout_s):
        while not (value := what()):
            await asyncio.sleep(0.01)
        return value


def scenario(body: Callable[[JobAgent, FakeLauncher, InlineJobStore, MemoryKV], Awaitable[None]],
             spec: JobSpec | None = None, launcher_failure: SetupFailure | None = None,
             invalid: list[int] | None = None) -> None:  # fmt: skip
    async def main() -> None:
        kv = MemoryKV()
        store = InlineJobStore(kv, KEYS, JOB)
        job = spec or make_spec(nnodes=NodeRange(1, 1), nproc_per_node=2, max_restarts=2, last_call_s=0.0)
        assert run_inline(store.create(job))
        rt = NodeRuntime("n1", "127.0.0.1", Path("/nonexistent"), Inventory((), 2), SimpleNamespace())  # type: ignore[arg-type]
        launcher = FakeLauncher(launcher_failure)
        changes: list[AgentState] = []
        agent = JobAgent(job, rt, store, FakeLease(kv), (0, 1), lambda a: changes.append(a.state),
                         launcher=launcher,
                         on_invalid=None if invalid is None else lambda: invalid.append(1))  # fmt: skip
        loop = asyncio.get_running_loop()

        def on_change(key: str, deleted: bool) -> None:
            loop.call_soon(agent.wake, KEYS.route(key, deleted))

        kv.watch_prefix(KEYS.prefix + "/", on_change, lambda: None)
        agent.start()
        try:
            await body(agent, launcher, store, kv)
            await asyncio.wait_for(agent.wait(), 10)
        finally:
            if agent.task is not None:
                agent.task.cancel()
        assert changes[-1] is AgentState.LEFT

    asyncio.run(main())


def test_a_single_node_job_runs_to_success() -> None:
    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        assert agent.state is AgentState.RUNNING
        launcher.groups[0].finish(0, 0)
        snap = await until(lambda: (s := run_inline(store.snapshot())).final and s)
        assert snap.final.state is JobState.SUCCEEDED and snap.done == {0: {"n1"}}

    scenario(body)


def test_a_failed_worker_restarts_the_job_once_then_it_succeeds() -> None:
    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        launcher.groups[0].finish(1)  # rank 0 fails: the group is stopped, the round bumped
        await until(lambda: len(launcher.groups) == 2)
        assert launcher.groups[0].stopped is not None  # stopped before the next round started
        snap = run_inline(store.snapshot())
        assert snap.restarts == 1 and snap.current == 1 and snap.round is not None
        assert snap.round.failure is not None and snap.round.failure["rank"] == 0
        launcher.groups[1].finish(0, 0)
        final = await until(lambda: run_inline(store.snapshot()).final)
        assert final.state is JobState.SUCCEEDED

    scenario(body)


def test_a_failure_with_no_restart_left_fails_the_job_with_its_summary() -> None:
    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        launcher.groups[0].finish(0, 3)
        final = await until(lambda: run_inline(store.snapshot()).final)
        assert final.state is JobState.FAILED and final.code is EndReason.WORKER_FAILED
        assert "no restarts left" in final.reason and final.failure is not None

    scenario(body, spec=make_spec(nnodes=NodeRange(1, 1), nproc_per_node=2, max_restarts=0, last_call_s=0.0))


def test_a_setup_failure_ends_the_job_with_its_own_code_and_spends_nothing() -> None:
    failure = SetupFailure(EndReason.ENTRY_UNAVAILABLE, "script missing or not accessible to u")

    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        snap = await until(lambda: (s := run_inline(store.snapshot())).final and s)
        assert snap.final.code is EndReason.ENTRY_UNAVAILABLE and snap.restarts == 0

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
        final = await until(lambda: run_inline(store.snapshot()).final)
        assert final.state is JobState.SUCCEEDED and agent.rec.etcd_down_since is None

    scenario(body)


def test_a_leave_request_marks_left_and_spends_no_restart() -> None:
    from elasticd.rendezvous.model import RoundReason

    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        agent.leave(RoundReason.MEMBER_LEFT, "node n1 drained", 0.5)
        await asyncio.wait_for(agent.wait(), 10)
        snap = run_inline(store.snapshot())
        assert launcher.groups[0].stopped == 0.5 and snap.restarts == 0
        assert snap.current == 1 and snap.left == {1: {"n1"}} and snap.final is None

    scenario(body)


def test_an_invalid_record_tells_the_manager_at_once_and_the_agent_acts_on_nothing_until_it_ends() -> None:
    """The janitor ends a job with an invalid record; the agent that reads one wakes the janitor's
    scan instead of leaving the job to its next poll, and changes nothing meanwhile."""
    told: list[int] = []

    async def body(agent: JobAgent, launcher: FakeLauncher, store: InlineJobStore, kv: MemoryKV) -> None:
        await until(lambda: launcher.groups)
        kv.put_json(KEYS.job_restarts(JOB), "not a count")
        await until(lambda: told)
        snap = run_inline(store.snapshot())
        assert snap.final is None and snap.restarts == 0  # nothing acted on meanwhile
        assert run_inline(store.fail_invalid(snap))  # what the janitor does

    scenario(body, invalid=told)

"""The agent's executor: it asks ``step`` what to do and carries the actions out.

One ``JobAgent`` per job this node takes part in, on the daemon's event loop. All decisions are
in ``elasticd.agent.step``; this module only reads, writes, starts and stops, logs, and sleeps.
After an action fails (the store is unreachable, workers cannot be set up), the rest of the list
is dropped and the failure is the next step's input.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from elasticd import log
from elasticd.agent import actions as act
from elasticd.agent.joinwatch import JoinWatch
from elasticd.agent.record import AgentRecord, AgentState, Leave, Local, Observed, View
from elasticd.agent.seams import Clock, Launcher, Lease, SystemClock, Workers
from elasticd.agent.step import step
from elasticd.decode import DecodeError, decode
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Change
from elasticd.happenings.bus import publish
from elasticd.happenings.records import (
    JobFailed,
    JobSetupFailed,
    JobSucceeded,
    RootCauseAmended,
    RoundBumped,
    RoundComplete,
    WorkerFailed,
)
from elasticd.jobs.decider import GroupOutcome
from elasticd.jobs.launch import NodeRuntime, master_port
from elasticd.jobs.launcher import ProcessLauncher
from elasticd.node import liveness
from elasticd.node.peers import PeerWatch
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.reach import PROBE_TIMEOUT_S, Reach
from elasticd.rendezvous.store import JobStore
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import FailureKind, JobState, RoundReason, SetupFailure, WorkerFailure

_log = log.get("elasticd.agent")

# Safety net under the watch. Everything the agent acts on wakes it at once: the job's keys and
# the nodes' (the manager's watch; a round's joins: its leader's ``JoinWatch``), its workers' exits
# and hangs (futures), a fence or a leave (``wake``), a peer's death (``PeerWatch``), a decision's
# deadline (``Wait.until``); progress is published when due (below). This only bounds how long a
# wake-up lost to a silently stalled watch could go unseen.
POLL_S = 5.0
PROGRESS_PUBLISH_S = 5.0  # running workers' progress reaches etcd at most this often, when it changed
LEADER_BATCH_S = 0.05


def _root_cause(failure: dict[str, Any] | None) -> tuple[FailureKind, str] | tuple[None, None]:
    """A final failure's cause and summary, for the record of the job's end."""
    if failure is None:
        return None, None
    try:
        found = decode(WorkerFailure, failure)
    except DecodeError:
        return None, None
    return found.kind, found.summary()


class _Exited(Exception):
    """The step said ``Exit``."""


class JobAgent:
    def __init__(
        self,
        spec: JobSpec,
        rt: NodeRuntime,
        store: JobStore,
        lease: Lease,
        slots: tuple[int, ...],
        on_change: Callable[[JobAgent], None],
        *,
        launcher: Launcher | None = None,
        clock: Clock | None = None,
        on_invalid: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.slots = slots
        self.first_rank: int | None = None  # the global rank of our local rank 0, while workers run
        self._rt = rt
        self._store = store
        self._lease = lease
        self._on_change = on_change  # told when workers start and when the agent has left
        self._on_invalid = on_invalid  # told when a read shows an invalid record the janitor must end
        self._launcher = launcher or ProcessLauncher(rt)
        self._clock = clock or SystemClock()
        self.rec = AgentRecord(spec, rt.node_id, last_join_at=self._clock.time())
        self.workers: Workers | None = None
        self._peers = PeerWatch(spec.id, store, self.wake)
        self._joins = JoinWatch(store, self.wake)
        self._wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._progress_at = 0.0  # when progress was last published (our clock)
        self._progress_sent: list[dict[str, Any]] = []
        self._reach: Reach | None = None  # what the last probe found (an input to ``step``)

    @property
    def node(self) -> str:
        return self._rt.node_id

    @property
    def state(self) -> AgentState:
        return self.rec.state

    # -- control from the manager ---------------------------------------------------------------
    def start(self) -> None:
        self._launcher.prepare(self.spec)
        self.task = asyncio.create_task(self._main(), name=f"agent-{self.spec.id}")

    def wake(self, change: Change | None = None) -> None:
        """A key of the job changed (None: anything may have: look)."""
        if change is None or self.rec.woken_by(change):
            self._wake.set()

    def fence(self) -> None:
        """Our lease is gone: stop multi-node workers before anything else, rejoin as a newcomer.
        (A round whose only member is this node runs on: ``step`` re-asserts it under the new lease.)"""
        if self.rec.fenceable:
            self.rec = replace(self.rec, fenced=True)
            self.wake()

    def leave(
        self, reason: RoundReason, detail: str, grace_s: float | None = None, stopping: bool = False
    ) -> None:
        """Leave the job on purpose (``stopping``: the daemon stops; else a drain)."""
        if self.rec.leave is None:
            self.rec = replace(self.rec, leave=Leave(reason, detail, grace_s, stopping))
            self.wake()

    async def wait(self) -> None:
        if self.task is not None:
            await asyncio.shield(self.task)

    def local_view(self) -> dict[str, Any]:
        """This node's part as it knows it, even when the store cannot be asked."""
        rec, workers = self.rec, self.workers
        state = rec.state.value
        if workers is not None and rec.state is AgentState.RUNNING and not workers.pids():
            outcome = workers.observe(describe=False).outcome
            state = AgentState.DONE.value if outcome is GroupOutcome.SUCCEEDED else JobState.FAILED.value
        return {
            "state": state,
            "round": rec.round,
            "devices": self._rt.inventory.visible_devices(self.slots),
            "pids": workers.pids() if workers is not None else [],
            "failure": rec.failure.to_json() if rec.failure else None,
            "updated_at": self._clock.time(),
            "progress": [p.to_json() for p in workers.progress()] if workers is not None else [],
        }

    # -- the loop ---------------------------------------------------------------------------------
    async def _main(self) -> None:
        try:
            await self._run()
        except _Exited:
            pass
        except Exception:
            _log.exception("agent.crashed", job=self.spec.id, node=self.node)
        finally:
            self._peers.close()
            self._joins.close()
            if self.workers is not None:
                workers, self.workers = self.workers, None
                await workers.stop(0)
            await self._launcher.close()
            self._transition(self.rec, replace(self.rec, state=AgentState.LEFT))
            with contextlib.suppress(EtcdUnavailable):
                await self._store.clear_waiting(self.node)
                if self.rec.note is not None and self._lease.lease_id is not None:
                    await self._store.note_pending(self.node, None, self._lease.lease_id)
                if self.rec.joined_round >= 0:
                    await self._store.withdraw(self.rec.joined_round, self.node)
            self._on_change(self)

    async def _run(self) -> None:
        view: View | None = None
        setup: SetupFailure | None = None
        etcd_error: str | None = None
        while True:
            workers = self.workers
            group = workers.observe(describe=self.rec.failure is None) if workers is not None else None
            local = Local(
                self._lease.lease_id,
                self._lease.lease_valid(),
                group,
                setup,
                etcd_error,
                self._joins.round,
                self._reach,
            )
            rec, actions = step(self.rec, view, local, self._clock.time())
            self._transition(self.rec, rec)
            view, setup, etcd_error = None, None, None
            try:
                for action in actions:
                    view = await self._execute(action) or view
            except EtcdUnavailable as exc:
                if self.rec.etcd_down_since is None:
                    _log.warning("agent.etcd_unavailable", job=self.spec.id, error=str(exc))
                view, etcd_error = None, str(exc)
            except SetupFailure as exc:
                view, setup = None, exc

    def _transition(self, old: AgentRecord, new: AgentRecord) -> None:
        """Adopt ``new`` and log what changed."""
        self.rec = new
        job, node = self.spec.id, self.node
        if new.state is not old.state:
            _log.info("agent.state", job=job, node=node, state=new.state.value, round=new.round)
        if new.failure is not None and old.failure is None:
            publish(WorkerFailed(job, node, new.round, new.failure.kind, new.failure.summary()))
        if new.ending is not None and old.ending is None:
            publish(JobSetupFailed(job, node, new.ending.reason, new.ending.message))
        if old.fenced and not new.fenced:
            _log.warning("agent.fenced_rejoin", job=job, node=node, round=new.fenced_round)
        if old.etcd_down_since is not None and new.etcd_down_since is None:
            _log.info("agent.etcd_back", job=job, after_s=round(self._clock.time() - old.etcd_down_since, 1))

    async def _execute(self, action: act.Action) -> View | None:
        store, node, lease = self._store, self.node, self._lease.lease_id
        match action:
            case act.ReadGlance(round_no):
                return await store.glance(round_no, node)
            case act.ReadSnapshot(counted):
                snap = await store.snapshot(counted, statuses=False)  # no decider reads them
                if snap.invalid and snap.final is None and self._on_invalid is not None:
                    self._on_invalid()  # the janitor ends the job: now, not at its next poll
                return Observed(snap, await self._lease.alive())
            case act.Wait(until, on_exits, batch):
                await self._publish_progress()
                if batch:
                    await asyncio.sleep(LEADER_BATCH_S)  # joins arriving together are then read together
                await self._sleep(until, on_exits)
            case act.Exit(why, event):
                _log.info(event, job=self.spec.id, node=node, round=self.rec.round, why=why)
                raise _Exited
            case act.StopWorkers(grace_s):
                await self._stop_workers(grace_s)
            case act.StartWorkers():
                await self._start_workers(action)
            case act.Publish():
                if lease is not None:
                    await store.put_node_status(node, self.local_view(), lease)
            case act.Join(round_no):
                if lease is not None:
                    rt = self._rt
                    join = Join(
                        node,
                        rt.address,
                        master_port(rt),
                        self.spec.nproc_per_node,
                        liveness_port=rt.liveness_port,
                    )
                    await store.join(round_no, join, lease)
            case act.Reassert(round_no, join):
                if lease is not None:
                    await store.join(round_no, join, lease)
                    _log.info("agent.reasserted", job=self.spec.id, node=node, round=round_no, lease=lease)
            case act.Withdraw(round_no):
                await store.withdraw(round_no, node)
            case act.SetWaiting():
                if lease is not None:
                    await store.set_waiting(node, lease)
            case act.ClearWaiting():
                await store.clear_waiting(node)
            case act.Probe(round_no, targets):
                reached, unreached = await liveness.probe(targets, PROBE_TIMEOUT_S)
                before = self._reach.unreached if self._reach is not None else frozenset()
                self._reach = Reach(round_no, reached, unreached, self._clock.time())
                if unreached != before:  # once per change: a cut node probes every few seconds
                    say = _log.warning if unreached else _log.info
                    say("peer.reach", job=self.spec.id, round=round_no, unreached=sorted(unreached))
            case act.NotePending(note):
                if lease is not None:
                    await store.note_pending(node, note, lease)
            case act.CloseRound(result, why, opened):
                if await store.close(result):
                    publish(
                        RoundComplete(
                            job=self.spec.id,
                            round=result.round,
                            world_size=result.world_size,
                            members=tuple(result.nodes),
                            why=why,
                            reason=opened.reason if opened else None,
                            rendezvous_s=round(result.closed_at - opened.opened_at, 3) if opened else None,
                        )
                    )
                    await store.forget_rounds_before(result.round)
            case act.Bump(seen, info, spend):
                if await store.bump(seen, info, spend):
                    publish(
                        RoundBumped(
                            job=self.spec.id,
                            round=info.round,
                            reason=info.reason,
                            spend=spend,
                            restarts=seen.restarts + int(spend),
                            detail=info.detail,
                        )
                    )
            case act.Amend(seen_mod, record):
                if await store.amend(seen_mod, record):
                    publish(RootCauseAmended(self.spec.id, node, type(record).__name__))
            case act.Finalize(state, code, reason, failure):
                if await store.finalize(state, code, reason, failure):
                    ended = JobSucceeded if state is JobState.SUCCEEDED else JobFailed
                    cause, summary = _root_cause(failure)
                    at = self.rec.round
                    publish(ended(self.spec.id, code, reason, round=at, cause=cause, root_cause=summary))
            case act.MarkDone(round_no):
                await store.mark_done(round_no, node)
            case act.MarkLeft(round_no):
                await store.mark_left(round_no, node)
            case act.WatchPeers(round_no, peers):
                self._peers.follow(round_no, peers)
            case act.WatchJoins(round_no):
                await self._joins.follow(round_no)
        return None

    async def _sleep(self, until: float | None, on_exits: bool) -> None:
        """Wait for a wake-up, a worker exit (``on_exits``), or ``until`` (wall clock), at most POLL_S,
        and while workers run, at most until their progress is next due to be published."""
        now = self._clock.time()
        timeout = POLL_S if until is None else max(0.0, min(POLL_S, until - now))
        if self.workers is not None and self.rec.state is AgentState.RUNNING:
            timeout = min(timeout, max(0.0, self._progress_at + PROGRESS_PUBLISH_S - now) + 0.01)
        waiter: asyncio.Future[Any] = asyncio.ensure_future(self._wake.wait())
        futures: set[asyncio.Future[Any]] = {waiter}
        if on_exits and self.workers is not None:
            futures |= self.workers.exits()
        try:
            await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        self._wake.clear()

    async def _start_workers(self, action: act.StartWorkers) -> None:
        result, member = action.result, action.member
        self.first_rank = member.group_rank * self.spec.nproc_per_node
        self.workers = await self._launcher.start(self.spec, result, member, action.restarts, self.slots)
        self._on_change(self)
        _log.info(
            "attempt.started",
            job=self.spec.id,
            round=result.round,
            group_rank=member.group_rank,
            world_size=result.world_size,
            master=f"{result.master_addr}:{result.master_port}",
            pids=self.workers.pgids(),
        )

    async def _stop_workers(self, grace_s: float) -> None:
        workers, self.workers = self.workers, None
        if workers is None:
            return
        await self._publish_quietly()
        stuck = await workers.stop(grace_s)
        if stuck:
            _log.error("attempt.unkillable", job=self.spec.id, pids=stuck)
        _log.info("attempt.stopped", job=self.spec.id, round=self.rec.round)
        await self._publish_quietly()

    async def _publish_progress(self) -> None:
        """While our workers run, publish their progress: every ``PROGRESS_PUBLISH_S``, when it
        changed, so a stepping job costs etcd one small put per node that often (and a change is
        published at most that long after it happened)."""
        workers, lease = self.workers, self._lease.lease_id
        if workers is None or lease is None or self.rec.state is not AgentState.RUNNING:
            return
        now = self._clock.time()
        if now - self._progress_at < PROGRESS_PUBLISH_S:
            return
        self._progress_at = now  # checked: the next check is due PROGRESS_PUBLISH_S from now
        view = self.local_view()
        if view["progress"] == self._progress_sent:
            return
        with contextlib.suppress(EtcdUnavailable):
            await self._store.put_node_status(self.node, view, lease)
            self._progress_sent = view["progress"]

    async def _publish_quietly(self) -> None:
        lease = self._lease.lease_id
        if lease is not None:
            with contextlib.suppress(EtcdUnavailable):
                await self._store.put_node_status(self.node, self.local_view(), lease)

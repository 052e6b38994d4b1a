"""The agent's executor: it asks ``step`` what to do and carries the actions out.

One ``JobAgent`` per job this node takes part in, on the daemon's event loop. All decisions are
in ``elasticd.agent.step`` and, for the executor's own rules (the lease gate, the state shown,
progress pacing, the writes on leaving), ``elasticd.agent.conduct``; this module only reads
(``agent.reads``), writes (``agent.writes``, and its own under the lease), starts and stops, logs,
and sleeps. What this node reports of itself is ``agent.report``'s.
After an action fails (the store is unreachable, workers cannot be set up), the rest of the list
is dropped and the failure is the next step's input.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any, assert_never

from elasticd import log
from elasticd.agent import actions as act
from elasticd.agent import conduct, portrules, reads, writes
from elasticd.agent.joinwatch import JoinWatch
from elasticd.agent.looks import Looks
from elasticd.agent.record import AgentRecord, AgentState, Leave, Local, View
from elasticd.agent.report import Reporter
from elasticd.agent.seams import (
    Alarm,
    Clock,
    EventAlarm,
    Joins,
    Launcher,
    Lease,
    Peers,
    Prober,
    SystemClock,
    Workers,
)
from elasticd.agent.step import step
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keyref import Change
from elasticd.happenings.bus import publish
from elasticd.happenings.records import JobSetupFailed, WorkerFailed
from elasticd.jobs.attempt import NodeRuntime
from elasticd.jobs.launcher import ProcessLauncher
from elasticd.node import liveness
from elasticd.node.peers import PeerWatch
from elasticd.progress.goodput import Tally
from elasticd.rendezvous.glance import Glance
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import Join
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import RoundReason, SetupFailure

_log = log.get("elasticd.agent")

# Safety net under the watch. Everything the agent acts on wakes it at once: the job's keys and
# the nodes' (the manager's watch; a round's joins: its leader's ``JoinWatch``), its workers' exits
# and hangs (futures), a fence or a leave (``wake``), a peer's death (``PeerWatch``), a decision's
# deadline (``Wait.until``); progress is published when due (``conduct.progress_due``). This only
# bounds how long a wake-up lost to a silently stalled watch could go unseen.
POLL_S = 5.0
LEADER_BATCH_S = 0.05


class Exited(Exception):
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
        alarm: Alarm | None = None,
        peers: Peers | None = None,
        joins: Joins | None = None,
        probe: Prober = liveness.probe,
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
        self._peers = peers or PeerWatch(spec.id, store, self.wake)
        self._joins = joins or JoinWatch(store, self.wake)
        self._alarm = alarm or EventAlarm()
        self.task: asyncio.Task[None] | None = None
        self._report = Reporter(spec, rt, store, slots, self._launcher, self._clock)
        self._looks = Looks(spec.id, self._launcher, self._clock, probe)  # what admission measured
        # What the last pass leaves the next step: its read, or the failure that ended it.
        self._view: View | None = None
        self._setup: SetupFailure | None = None
        self.etcd_error: str | None = None

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
            self._alarm.ring()

    def fence(self) -> None:
        """Our lease is gone: stop multi-node workers before anything else, rejoin as a newcomer.
        (A round whose only member is this node runs on: ``step`` re-asserts it under the new lease.)"""
        if self.rec.fenceable:
            self.rec = replace(self.rec, part=self.rec.part.fence())
            self.wake()

    def leave(
        self, reason: RoundReason, detail: str, grace_s: float | None = None, stopping: bool = False
    ) -> None:
        """Leave the job on purpose (``stopping``: the daemon stops; else a drain)."""
        if self.rec.leave is None:
            self.rec = replace(self.rec, leave=Leave(reason, detail, grace_s, stopping))
            self.wake()

    def straggler_scores(self) -> dict[int, float]:
        """Every rank's slowness score in the round we judge (empty unless we are its group rank 0)."""
        return self._report.straggler_scores()

    def goodput(self) -> tuple[Tally, Tally] | None:
        """Where the job's time went here: as of now, and the part no later event moves."""
        return self._report.goodput()

    async def wait(self) -> None:
        if self.task is not None:
            await asyncio.shield(self.task)

    def local_view(self) -> dict[str, Any]:
        """This node's part as it knows it, even when the store cannot be asked (``report``)."""
        return self._report.view(self.rec, self.workers)

    # -- the loop ---------------------------------------------------------------------------------
    async def _main(self) -> None:
        try:
            while True:
                await self.once()
        except Exited:
            pass
        except Exception:
            _log.exception("agent.crashed", job=self.spec.id, node=self.node)
        finally:
            await self.finish()

    async def finish(self) -> None:
        """The agent has left: close what it opened, stop its workers, say goodbye in the store."""
        self._peers.close()
        self._joins.close()
        self._report.stop_judging()
        if self.workers is not None:
            workers, self.workers = self.workers, None
            await workers.stop(0)
        await self._launcher.close()
        self._transition(self.rec, replace(self.rec, state=AgentState.LEFT))
        with contextlib.suppress(EtcdUnavailable):
            for action in conduct.farewell(self.rec):
                await self._execute(action)
        self._on_change(self)

    async def once(self, told: Callable[[act.Action], None] = lambda _action: None) -> None:
        """One pass of the loop: observe, ``step``, carry the actions out in order, each told to
        ``told`` once carried out; ``Exited`` when the step said ``Exit``. A failure drops the rest
        of the list and is the next pass's input."""
        workers = self.workers
        group = workers.observe(describe=self.rec.failure is None) if workers is not None else None
        local = Local(
            self._lease.lease_id,
            self._lease.lease_valid(),
            group,
            self._setup,
            self.etcd_error,
            self._joins.round,
            self._looks.reach,
            self._looks.checked,
        )
        rec, actions = step(self.rec, self._view, local, self._clock.time())
        self._transition(self.rec, rec)
        self._view, self._setup, self.etcd_error = None, None, None
        try:
            for action in actions:
                self._view = await self._execute(action) or self._view
                told(action)
        except EtcdUnavailable as exc:
            if self.rec.etcd_down_since is None:
                _log.warning("agent.etcd_unavailable", job=self.spec.id, error=str(exc))
            self._view, self.etcd_error = None, str(exc)
        except SetupFailure as exc:
            self._view, self._setup = None, exc

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
        """Carry ``action`` out: the one place where step's actions meet the store, the workers
        and the clock (the lease gate decides first which writes can be made: ``conduct.gate``)."""
        carried = conduct.gate(action, self._lease.lease_id)
        match carried:
            case conduct.Dropped(dropped, why):
                _log.info("agent.dropped", job=self.spec.id, action=type(dropped).__name__, why=why)
            case conduct.Leased(leased, lease):
                return await self._leased(leased, lease)
            case act.ReadGlance() | act.ReadJob() as asked:
                return await reads.read(self._store, self._lease, self.node, asked, self._on_invalid)
            case act.Wait(until, on_exits, batch):
                await self._wait(until, on_exits, batch)
            case act.Exit(why, event):
                _log.info(event, job=self.spec.id, node=self.node, round=self.rec.round, why=why)
                raise Exited
            case act.StopWorkers(grace_s):
                await self._stop_workers(grace_s)
            case act.StartWorkers() as start:
                await self._start_workers(start)
            case act.Probe() | act.CheckNodes() as look:
                await self._looks.look(look)
            case act.WatchPeers() | act.WatchJoins() as watch:
                await self._follow(watch)
            case (
                act.Withdraw() | act.ClaimLead() | act.ClearWaiting() | act.MarkDone() | act.MarkLeft()
            ) as mark:
                await writes.mark(self._store, self.node, mark)
            case act.CloseRound() | act.Bump() | act.Amend() | act.Finalize() as record:
                await writes.swap(self._store, self.node, self.rec.round, record)
            case _:
                assert_never(carried)
        return None

    async def _follow(self, action: act.WatchPeers | act.WatchJoins) -> None:
        if isinstance(action, act.WatchPeers):
            self._peers.follow(action.round, action.peers)
        else:
            await self._joins.follow(action.round)

    async def _wait(self, until: float | None, on_exits: bool, batch: bool) -> None:
        await self._report.publish_progress(self.rec, self.workers, self._running(), self._lease.lease_id)
        if batch:
            await self._alarm.pause(LEADER_BATCH_S)  # joins arriving together are then read together
        await self._sleep(until, on_exits)

    async def _leased(self, action: conduct.LeasedAction, lease: int) -> Glance | None:
        """A write under our lease (``conduct.gate`` found one); a join answers with a glance."""
        store, node = self._store, self.node
        match action:
            case act.Publish():
                await store.put_node_status(node, self.local_view(), lease)
            case act.Join(round_no):
                rt = self._rt
                offer = await self._launcher.offer(round_no)
                join = Join(
                    node,
                    rt.address,
                    offer.port,
                    self.spec.nproc_per_node,
                    liveness_port=rt.liveness_port,
                    store=offer.store,
                    check_port=offer.check_port,
                    compute=offer.compute,
                )
                return await store.join(round_no, join, lease)
            case act.Reassert(round_no, join):
                await store.join(round_no, join, lease)
                _log.info("agent.reasserted", job=self.spec.id, node=node, round=round_no, lease=lease)
            case act.SetWaiting():
                await store.set_waiting(node, lease)
            case act.NotePending(note):
                await store.note_pending(node, note, lease)
        return None

    async def _sleep(self, until: float | None, on_exits: bool) -> None:
        """Wait for a wake-up, a worker exit (``on_exits``), or ``until`` (wall clock), at most POLL_S,
        and while workers run, at most until their progress is next due to be published."""
        timeout = conduct.sleep_s(self._clock.time(), until, self._report.sent, self._running(), POLL_S)
        exits = self.workers.exits() if on_exits and self.workers is not None else set()
        await self._alarm.sleep(timeout, set(exits))

    async def _start_workers(self, action: act.StartWorkers) -> None:
        result, member, restarts, silence = action.result, action.member, action.restarts, action.silence
        self.first_rank = member.group_rank * self.spec.nproc_per_node
        await portrules.follow_round(self._rt, self._store, self.spec, result, member)
        self.workers = await self._launcher.start(self.spec, result, member, restarts, self.slots, silence)
        self._report.judge(result, member)
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
        self._report.stop_judging()
        if workers is None:
            return
        await self._publish_quietly()
        stuck = await workers.stop(grace_s)
        if stuck:
            _log.error("attempt.unkillable", job=self.spec.id, pids=stuck)
        _log.info("attempt.stopped", job=self.spec.id, round=self.rec.round)
        await self._publish_quietly()

    def _running(self) -> bool:
        return self.workers is not None and self.rec.state is AgentState.RUNNING

    async def _publish_quietly(self) -> None:
        """``Publish`` around stopping workers, whether or not the store can be reached."""
        with contextlib.suppress(EtcdUnavailable):
            await self._execute(act.Publish())

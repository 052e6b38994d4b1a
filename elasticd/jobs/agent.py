"""This node's part in one job: join rounds, run the round's workers, react to what happens.

One ``JobAgent`` per job this node takes part in. It reads the job's state from etcd as a
snapshot (woken by a watch, with a slow poll as a safety net), asks the pure deciders what to do,
and carries it out: join, close the round (when it leads), start or stop workers, bump the round,
end the job. The rendezvous invariants are in ``elasticd.rendezvous``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from elasticd import log
from elasticd.errors import EtcdUnavailable
from elasticd.jobs.decider import GroupOutcome, group_outcome
from elasticd.jobs.launch import NodeRuntime, describe_failure, layout_for, start_group
from elasticd.jobs.logdir import disk_full, log_disk_full
from elasticd.jobs.pathcheck import check_paths
from elasticd.jobs.spec import JobSpec
from elasticd.jobs.state import EndReason, JobState, SetupFailure, WorkerFailure
from elasticd.netaddr import free_port
from elasticd.node.liveness import LivenessMonitor
from elasticd.node.registry import NodeRegistry
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.model import Join, RoundInfo, RoundReason, RoundResult
from elasticd.rendezvous.store import Glance, JobSnapshot, JobStore
from elasticd.workers.group import WorkerGroup

_log = log.get("elasticd.agent")

POLL_S = 1.0  # safety net under the watch
ETCD_RETRY_S = 1.0
LEADER_BATCH_S = 0.05


class AgentState(StrEnum):
    """This node's part in a job.

    JOINING  -> RUNNING   selected in the round's result
    JOINING  -> WAITING   the round closed without us and the job can grow
    JOINING  -> LEFT      the round closed without us and the job is full
    RUNNING  -> DONE      our workers all exited 0; waiting for the other members
    RUNNING  -> STOPPING  the round moved on, the job ended, we were fenced or are leaving
    DONE     -> STOPPING  (as RUNNING)
    STOPPING -> JOINING   the next round
    STOPPING -> LEFT      the job ended, or we left
    WAITING  -> JOINING   a round opened (scale-up)
    WAITING  -> LEFT      the job ended
    """

    JOINING = "JOINING"
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    DONE = "DONE"
    STOPPING = "STOPPING"
    LEFT = "LEFT"


class JobAgent:
    def __init__(
        self,
        spec: JobSpec,
        rt: NodeRuntime,
        store: JobStore,
        registry: NodeRegistry,
        slots: tuple[int, ...],
        on_change: Callable[[JobAgent], None],
    ) -> None:
        self.spec = spec
        self._rt = rt
        self._store = store
        self._registry = registry
        self.slots = slots
        self._on_change = on_change  # told when workers start and when the agent has left
        self.state = AgentState.JOINING
        self.group: WorkerGroup | None = None
        self.round = -1  # the round whose workers we run (or ran)
        self.failure: WorkerFailure | None = None
        self._wake = asyncio.Event()
        self._fenced = False
        self._leave: tuple[RoundReason, str, float | None] | None = None  # set when leaving on purpose
        self._joined_round = -1
        self._fenced_round = -1  # the round whose workers a fence stopped: report it once back
        self._leading = False  # whether we lead the round being filled
        self._monitor = LivenessMonitor(self._peer_dead)
        self._last_snap: JobSnapshot | None = None
        self._glance: Glance | None = None
        self._seen_joins: tuple[str, ...] = ()
        self._last_join_at = time.time()
        self.task: asyncio.Task[None] | None = None

    @property
    def node(self) -> str:
        return self._rt.node_id

    @property
    def multi_node(self) -> bool:
        return self.spec.nnodes.max > 1

    # -- control from the manager ---------------------------------------------------------------
    def start(self) -> None:
        self.task = asyncio.create_task(self._main(), name=f"agent-{self.spec.id}")

    def wake(self, leaf: str | None = None, deleted: bool = False) -> None:
        """A key below ``jobs/<job>/`` changed. While a round fills up, each join would wake every
        joiner; only the leader needs those (the others wait for the result), which keeps a
        round's cost per participant constant instead of linear in the number of nodes."""
        if leaf is not None and (
            leaf.startswith(("nodes/", "pending/")) or self._ignores_join(leaf, deleted)
        ):
            return
        self._wake.set()

    def _ignores_join(self, leaf: str, deleted: bool) -> bool:
        """A non-leader filling a round needs no news of joins, only of a leaving one (it may lead)."""
        return self.state is AgentState.JOINING and not self._leading and "/join/" in leaf and not deleted

    def fence(self) -> None:
        """Our lease is gone: stop multi-node workers before anything else, rejoin as a newcomer."""
        if self.multi_node:
            self._fenced = True
            self.wake()

    def leave(self, reason: RoundReason, detail: str, grace_s: float | None = None) -> None:
        """Leave the job on purpose (daemon stop, drain)."""
        if self._leave is None:
            self._leave = (reason, detail, grace_s)
            self.wake()

    async def wait(self) -> None:
        if self.task is not None:
            await asyncio.shield(self.task)

    def local_view(self) -> dict[str, Any]:
        """This node's part as it knows it, even when etcd cannot be asked."""
        state = self.state.value
        if self.group is not None and self.state is AgentState.RUNNING and not self.group.running:
            codes = [w.exited.result() for w in self.group.workers]
            outcome = group_outcome(codes, 0)
            state = AgentState.DONE.value if outcome is GroupOutcome.SUCCEEDED else "FAILED"
        return {
            "state": state,
            "round": self.round,
            "devices": self._rt.inventory.visible_devices(self.slots),
            "pids": [w.pid for w in self.group.running] if self.group else [],
            "failure": self.failure.to_json() if self.failure else None,
            "updated_at": time.time(),
        }

    # -- helpers ----------------------------------------------------------------------------------
    def _set(self, state: AgentState) -> None:
        if state is not self.state:
            _log.info("agent.state", job=self.spec.id, node=self.node, state=state.value, round=self.round)
        self.state = state

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def _snapshot(self) -> tuple[JobSnapshot, set[str]]:
        # A running member, or a joiner whose round just closed, needs how many joined, not who.
        counted = None
        if self.state in (AgentState.RUNNING, AgentState.DONE) and self.round >= 0:
            counted = self.round
        elif self._glance is not None and self._glance.closed and self._glance.round == self._joined_round:
            counted = self._joined_round
        snap = await self._io(self._store.snapshot, counted)
        alive = await self._io(self._alive_nodes)
        return snap, alive

    def _alive_nodes(self) -> set[str]:
        return set(self._registry.live_nodes())

    async def _publish(self) -> None:
        if self._registry.lease_id is not None:
            await self._io(self._store.put_node_status, self.node, self.local_view(), self._registry.lease_id)

    async def _sleep(self, until: float | None = None, extra: set[asyncio.Future[Any]] | None = None) -> None:
        """Wait for a wake-up, a worker exit (``extra``), or ``until`` (wall clock), at most POLL_S."""
        timeout = POLL_S if until is None else max(0.0, min(POLL_S, until - time.time()))
        waiter = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait(
                {waiter, *(extra or set())}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        self._wake.clear()

    # -- the loop ---------------------------------------------------------------------------------
    async def _main(self) -> None:
        try:
            await self._loop()
        except Exception:
            _log.exception("agent.crashed", job=self.spec.id, node=self.node)
        finally:
            self._monitor.close()
            if self.group is not None:
                await self.group.stop(0)
            self._set(AgentState.LEFT)
            with contextlib.suppress(EtcdUnavailable):
                await self._io(self._cleanup_keys)
            self._on_change(self)

    def _cleanup_keys(self) -> None:
        self._store.clear_waiting(self.node)
        if self._joined_round >= 0:
            self._store.withdraw(self._joined_round, self.node)

    async def _loop(self) -> None:
        etcd_down_since: float | None = None
        while True:
            try:
                if await self._step():
                    return
                if etcd_down_since is not None:
                    _log.info(
                        "agent.etcd_back", job=self.spec.id, after_s=round(time.time() - etcd_down_since, 1)
                    )
                    etcd_down_since = None
            except EtcdUnavailable as exc:
                if etcd_down_since is None:
                    etcd_down_since = time.time()
                    _log.warning("agent.etcd_unavailable", job=self.spec.id, error=str(exc))
                if self._leave is not None:  # nobody to tell: peers will see our lease expire
                    await self._stop_workers(self.spec.stop_grace_s)
                    return
                # Workers keep running; what they do is noted and acted on once etcd is back.
                await self._sleep(time.time() + ETCD_RETRY_S)

    def _exit_futures(self) -> set[asyncio.Future[Any]]:
        return {w.exited for w in self.group.running} if self.group else set()

    async def _step(self) -> bool:
        """One pass: read the job, act once. True when this node is done with the job."""
        if self._fenced:
            if self.group is not None:
                self._fenced_round = self.round
            await self._stop_workers(grace_s=0.0)
            if not self._registry.lease_valid():
                await self._sleep()
                return False
            self._fenced = False
            _log.warning("agent.fenced_rejoin", job=self.spec.id, node=self.node, round=self._fenced_round)
        if await self._waiting_quietly():
            return False
        snap, alive = await self._snapshot()
        self._last_snap = snap
        self._follow_peers(snap)
        if snap.final is None and snap.invalid:
            # A bad record: the manager fails the job naming it. Act on nothing meanwhile (no
            # publish, no cleanup), so that the evidence stays until the final record is written.
            await self._sleep()
            return False
        if snap.ended:
            await self._stop_workers(self.spec.stop_grace_s)
            return True
        if self._leave is not None:
            return await self._leave_job(snap, alive)
        result = snap.result
        if result is None:
            await self._stop_workers(self._grace(snap))  # the round moved on: stop before joining
            await self._take_part_in_open_round(snap, alive)
            return False
        me = result.member(self.node)
        if me is None:
            return await self._outside_running_round(snap, result)
        if self._fenced_round == snap.current:
            # Our workers of this round were fenced: the round cannot go on without them.
            self._fenced_round = -1
            await self._event(
                snap, result, alive, RoundReason.MEMBER_LOST, f"node {self.node} was fenced", None
            )
            return False
        if self.round != snap.current:
            if self.group is not None or self.state is AgentState.DONE:
                await self._stop_workers(self._grace(snap))
            if not await self._launch(snap, result):
                return False
        await self._supervise(snap, result, alive)
        return False

    # -- peers ---------------------------------------------------------------------------------------
    def _follow_peers(self, snap: JobSnapshot) -> None:
        """While our workers run, watch our ring neighbours' daemons for a death (liveness)."""
        result = snap.result
        running = self.group is not None and result is not None and self.node in result.nodes
        peers = {}
        if running and not snap.ended and result is not None:
            peers = {m.node: (m.address, m.liveness_port) for m in rdzv.ring_neighbours(result, self.node)}
        self._monitor.watch(peers)

    async def _peer_dead(self, node: str) -> None:
        snap = self._last_snap
        join = await self._io(self._store.join_of, snap.current, node) if snap else None
        if join is None or not join.lease:
            return
        try:
            await self._io(self._store.revoke, join.lease)
            _log.warning("peer.lease_revoked", job=self.spec.id, node=node, lease=join.lease)
        except EtcdUnavailable as exc:
            _log.warning("peer.revoke_failed", job=self.spec.id, node=node, error=str(exc))
        self.wake()

    async def _waiting_quietly(self) -> bool:
        """A node that joined an open round it does not lead only waits: it glances (one small
        read) instead of reading the whole job, which would cost O(N) per node per wake-up."""
        self._glance = None
        if self.state is not AgentState.JOINING or self._leading or self._joined_round < 0 or self._leave:
            return False
        glance = self._glance = await self._io(self._store.glance, self._joined_round, self.node)
        if not glance.quiet(self._joined_round, self.node):
            return False
        await self._sleep()
        return True

    # -- open round ---------------------------------------------------------------------------------
    async def _take_part_in_open_round(self, snap: JobSnapshot, alive: set[str]) -> None:
        assert snap.round is not None
        info = snap.round
        lease = self._registry.lease_id
        if lease is None:
            await self._sleep()
            return
        joins = snap.current_joins
        if self.node not in {j.node for j in joins}:
            self._set(AgentState.JOINING)
            await self._io(self._store.clear_waiting, self.node)
            join = Join(
                self.node,
                self._rt.address,
                free_port("0.0.0.0"),  # torch's TCPStore on rank 0 listens on every address
                self.spec.nproc_per_node,
                liveness_port=self._rt.liveness_port,
            )
            await self._io(self._store.join, info.round, join, lease)
            self._joined_round = info.round
            await self._publish()
            return
        names = tuple(j.node for j in joins)
        if names != self._seen_joins:
            self._seen_joins, self._last_join_at = names, time.time()
        self._leading = rdzv.leader(joins) == self.node
        if not self._leading:
            await self._sleep()
            return
        decision = rdzv.decide_close(
            info,
            joins,
            alive,
            self.spec.nnodes,
            now=time.time(),
            last_join_at=self._last_join_at,
            last_call_s=self.spec.last_call_s,
            join_timeout_s=self.spec.join_timeout_s,
            expect_grace_s=self._grace(snap) + 2.0,
            left=snap.left.get(info.round, set()),
        )
        if decision.verdict is rdzv.Close.NOW:
            ordered = rdzv.order_members(joins, snap.previous_result, self.spec.nnodes.max)
            result = rdzv.build_result(info.round, ordered, time.time())
            if await self._io(self._store.close, result):
                _log.info(
                    "round.complete",
                    job=self.spec.id,
                    round=info.round,
                    world_size=result.world_size,
                    members=list(result.nodes),
                    why=decision.why,
                )
                await self._io(self._store.forget_rounds_before, info.round)
        elif decision.verdict is rdzv.Close.FAIL:
            if await self._io(self._store.finalize, JobState.FAILED, EndReason.JOIN_TIMEOUT, decision.why):
                _log.warning("job.failed", job=self.spec.id, reason=decision.why)
        else:
            await asyncio.sleep(LEADER_BATCH_S)  # joins arriving together are then read together
            await self._sleep(decision.recheck_at)

    # -- running round without us --------------------------------------------------------------------
    async def _outside_running_round(self, snap: JobSnapshot, result: RoundResult) -> bool:
        """The round runs without us: wait to join at the next one if the job can grow."""
        await self._stop_workers(self._grace(snap))
        if snap.current in snap.joins and self.node in {j.node for j in snap.current_joins}:
            await self._io(self._store.withdraw, snap.current, self.node)
        if len(result.members) >= self.spec.nnodes.max:
            _log.info("agent.not_needed", job=self.spec.id, node=self.node, round=snap.current)
            return True
        lease = self._registry.lease_id
        if lease is not None and self.node not in snap.waiting:
            self._set(AgentState.WAITING)
            await self._io(self._store.set_waiting, self.node, lease)
            await self._publish()
        await self._sleep()
        return False

    # -- our round ---------------------------------------------------------------------------------
    async def _launch(self, snap: JobSnapshot, result: RoundResult) -> bool:
        """Start our workers of this round; False if this node cannot (the job then ends)."""
        me = result.member(self.node)
        assert me is not None
        self.round = snap.current
        self.failure = None
        try:
            problem = await self._io(check_paths, self.spec)  # as the submitter, as exec will see them
            if problem is not None:
                raise problem.to_setup_failure(self.node)
            self.group = start_group(
                self._rt,
                self.spec,
                layout_for(result, me),
                attempt=snap.current,
                restart_count=snap.restarts,
                slots=self.slots,
                fence=self.multi_node,
            )
        except SetupFailure as exc:
            await self._setup_failed(exc)
            return False
        self._set(AgentState.RUNNING)
        self._on_change(self)
        _log.info(
            "attempt.started",
            job=self.spec.id,
            round=snap.current,
            group_rank=me.group_rank,
            world_size=result.world_size,
            master=f"{result.master_addr}:{result.master_port}",
            pids=[w.pid for w in self.group.workers],
        )
        await self._publish()
        return True

    async def _setup_failed(self, exc: SetupFailure) -> None:
        """Not the job's fault, and no restart could fix it: end the job with its own reason
        instead of spending the restart budget in a loop."""
        _log.error(
            "job.setup_failed", job=self.spec.id, node=self.node, code=exc.reason.value, why=exc.message
        )
        await self._io(self._store.finalize, JobState.FAILED, exc.reason, exc.message)

    async def _supervise(self, snap: JobSnapshot, result: RoundResult, alive: set[str]) -> None:
        """Act on our workers' exits and on the other members. Idempotent: every etcd write it
        makes is safe to repeat, so a pass cut short by an etcd outage is simply done again."""
        done = snap.done.get(snap.current, set())
        group = self.group
        if group is not None and self.state is not AgentState.STOPPING:
            exited = [w for w in group.workers if not w.running]
            outcome = group_outcome([w.exited.result() for w in exited], len(group.running))
            if outcome is GroupOutcome.FAILED and self.multi_node and not self._registry.lease_valid():
                self._fenced = True  # killed by the reaper's fence, not a failure of theirs
                return
            if outcome is GroupOutcome.FAILED:
                if self.failure is None:
                    failed = [w for w in exited if w.exited.result() != 0]
                    first = min(failed, key=lambda w: w.launch.rank)
                    self.failure = describe_failure(self.node, snap.current, first)
                    _log.warning("worker.failed", job=self.spec.id, summary=self.failure.summary())
                    await self._publish()
                if log_disk_full(self._rt.log_dir):  # the likely cause, and a restart cannot help
                    await self._setup_failed(disk_full(self._rt.log_dir, self.node))
                    return
                summary = self.failure.summary()
                await self._event(
                    snap, result, alive, RoundReason.WORKER_FAILED, summary, self.failure.to_json()
                )
                return
            if outcome is GroupOutcome.SUCCEEDED:
                self._set(AgentState.DONE)
                if self.node not in done:
                    await self._io(self._store.mark_done, snap.current, self.node)
                    await self._publish()
                    return
        if set(result.nodes) <= done:
            if await self._io(self._store.finalize, JobState.SUCCEEDED, EndReason.SUCCEEDED, ""):
                _log.info("job.succeeded", job=self.spec.id, round=snap.current, restarts=snap.restarts)
            return
        counted = snap.join_counts.get(snap.current)
        if counted is None or counted < len(result.nodes):  # a member's key may be gone
            if counted is not None:  # read the joins to know whose
                fresh = await self._io(self._store.snapshot)
                if fresh.round_mod != snap.round_mod or fresh.ended:
                    return  # the round moved meanwhile: the next step acts on the new one
                snap = fresh
            present = {j.node for j in snap.current_joins}
            lost = [n for n in result.nodes if n not in present and n not in done and n != self.node]
            if lost:
                detail = f"lost node(s) {', '.join(lost)}"
                await self._event(snap, result, alive, RoundReason.MEMBER_LOST, detail, None)
                return
        newcomers = [n for n in snap.waiting if n in alive and n not in result.nodes]
        if newcomers and not done and len(result.members) < self.spec.nnodes.max:
            await self._event(
                snap,
                result,
                alive,
                RoundReason.SCALE_UP,
                f"node(s) {', '.join(newcomers)} waiting",
                None,
                extra=newcomers,
            )
            return
        await self._sleep(extra=self._exit_futures())

    async def _event(
        self,
        snap: JobSnapshot,
        result: RoundResult | None,
        alive: set[str],
        reason: RoundReason,
        detail: str,
        failure: dict[str, Any] | None,
        extra: list[str] | None = None,
        grace_s: float | None = None,
    ) -> None:
        """Open the next round for ``reason`` (once, whoever sees it first) or end the job."""
        plan = rdzv.plan_bump(reason, snap.restarts, self.spec.max_restarts, detail)
        if plan.fail:
            code = EndReason.NODES_LOST
            if reason is RoundReason.WORKER_FAILED:
                code = EndReason.OOM if failure and failure.get("oom") else EndReason.WORKER_FAILED
            if await self._io(self._store.finalize, JobState.FAILED, code, plan.why, failure):
                _log.warning("job.failed", job=self.spec.id, reason=plan.why)
            return
        expect = rdzv.next_expect(result, alive, extra or ())
        info = RoundInfo(snap.current + 1, reason, time.time(), expect, detail, failure, grace_s)
        if await self._io(self._store.bump, snap, info, plan.spend):
            _log.info(
                "round.bumped",
                job=self.spec.id,
                round=info.round,
                reason=reason.value,
                spend=plan.spend,
                restarts=snap.restarts + int(plan.spend),
                detail=detail,
            )

    async def _leave_job(self, snap: JobSnapshot, alive: set[str]) -> bool:
        """Leave on purpose: open the next round without us (no restart is spent), then stop our
        workers with everyone else's, gracefully. Below MIN, the next round waits for a node
        (up to the join timeout); a single-node job resumes when its node comes back."""
        assert self._leave is not None
        reason, detail, grace = self._leave
        result = snap.result
        next_round = snap.current + 1
        if result is not None and self.node in result.nodes and self.round == snap.current:
            await self._event(snap, result, alive, reason, detail, None, grace_s=grace)
        elif result is None:
            next_round = snap.current  # the round is still filling: it must not wait for us
        await self._stop_workers(grace if grace is not None else self.spec.stop_grace_s)
        await self._io(self._store.mark_left, next_round, self.node)
        return True

    def _grace(self, snap: JobSnapshot) -> float:
        """How long workers get between SIGTERM and SIGKILL when the round moves on."""
        if snap.round is not None and snap.round.grace_s is not None:
            return snap.round.grace_s
        return self.spec.stop_grace_s

    async def _stop_workers(self, grace_s: float) -> None:
        group, self.group = self.group, None
        if group is None:
            if self.state is AgentState.DONE:
                self._set(AgentState.STOPPING)
            return
        self._set(AgentState.STOPPING)
        await self._publish_quietly()
        stuck = await group.stop(grace_s)
        if stuck:
            _log.error("attempt.unkillable", job=self.spec.id, pids=stuck)
        _log.info("attempt.stopped", job=self.spec.id, round=self.round)
        await self._publish_quietly()

    async def _publish_quietly(self) -> None:
        with contextlib.suppress(EtcdUnavailable):
            await self._publish()

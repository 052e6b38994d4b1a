"""Turning a round's result into this node's worker group, and watching it run.

Log files are created through ``jobs.logdir`` only: the workers run as the submitter, and anything
under the log directory that a job could have touched must never be opened by path as root (a
failed worker's report is read by ``jobs.failurereport``).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from elasticd import log
from elasticd.gpu.binding import Host, memory_nodes
from elasticd.jobs import logdir, stackfile
from elasticd.jobs.affinity import rank_cpus
from elasticd.jobs.decider import Exited, Group, Judgement, judge, report, settle_left
from elasticd.jobs.env import WorldLayout, worker_env
from elasticd.jobs.failurereport import describe_failure
from elasticd.jobs.identity import switch_to
from elasticd.netaddr import NoFreePort, PortRange, pick_port
from elasticd.node.inventory import Inventory
from elasticd.node.snapshotbound import BoundSource
from elasticd.portfilter.guard import PortFilter
from elasticd.progress.accounts import Accounts, Books
from elasticd.progress.channel import ProgressChannel
from elasticd.progress.protocol import HEARTBEAT_FILE_ENV, PROGRESS_FD_ENV
from elasticd.progress.timeouts import HangPolicy
from elasticd.progress.tracker import RankProgress
from elasticd.progress.watch import HangWatch, WatchedRank
from elasticd.rendezvous.model import Member, RoundHead
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, SetupFailure, WorkerFailure
from elasticd.workers.cgroups.limits import LimitBackend, LimitError, Placement, ResourceLimits, RlimitBackend
from elasticd.workers.cgroups.tracking import NoTracker, Tracker
from elasticd.workers.group import ColdSpawner, Launch, Spawner, Worker, WorkerGroup, wall_clock
from elasticd.workers.proctree.reaper import Reaper
from elasticd.workers.proctree.spawn import Identity
from elasticd.workers.snapshot_program.protocol import SOCKET_ENV as SNAPSHOT_SOCKET_ENV
from elasticd.workers.warm.pool import ZygotePool
from elasticd.workers.warm.spawner import WarmSpawner
from elasticd.workers.warm.zygote import Zygote

_log = log.get("elasticd.launch")


@dataclass(frozen=True)
class NodeRuntime:
    """What every job on this node shares."""

    node_id: str
    address: str
    log_dir: Path
    inventory: Inventory
    reaper: Reaper
    liveness_port: int = 0  # see elasticd.node.liveness
    limits: LimitBackend = field(default_factory=RlimitBackend)  # cgroups where allowed (limits.detect)
    log_gid: int | None = None  # the operator's log_group: job logs 0640 to it (logdir.log_group_gid)
    worker_ports: PortRange | None = None  # the operator's worker_ports: MASTER_PORT comes from there
    single_host_only: bool = False  # address left at loopback with an external etcd (Settings)
    tracking: Tracker = field(default_factory=NoTracker)  # a cgroup per job where allowed (tracking.detect)
    zygotes: ZygotePool = field(default_factory=ZygotePool.disabled)  # parked for the next identical job
    numa: Host | None = None  # the host's NUMA layout (node/numa.py), for --numa-binding
    snapshot_bytes: int = 0  # a job's snapshot keeper's bound here (0: none; workers.warm.snapshotkeeper)
    snapshot_source: BoundSource = BoundSource.SET  # the operator's, or derived (node/snapshotbound.py)
    straggler_grace_s: float = 60.0  # named this long, a straggler's node is drained (--stragglers drain)
    shrink_interval_s: float = 300.0  # an elastic job lends nodes at most this often (jobs.room)
    books: Books = field(default_factory=Books)  # each job's goodput here, across its agents
    ports: PortFilter = field(default_factory=PortFilter.disabled)  # who reaches the jobs' ports (nftables)


def master_port(rt: NodeRuntime) -> int:
    """The port this node offers for MASTER_PORT when it joins a round (used if it leads).

    torch's TCPStore on rank 0 listens on every address, so that is what is tried.
    """
    try:
        return pick_port("0.0.0.0", rt.worker_ports)
    except NoFreePort as exc:
        raise SetupFailure(
            EndReason.SPAWN_FAILED, f"on node {rt.node_id}: {exc}; widen worker_ports or free some"
        ) from exc


def layout_for(result: RoundHead, me: Member, master_addr: str | None = None) -> WorldLayout:
    """This node's place in ``result``'s round; ``master_addr`` replaces the round's (group rank
    0's address) where the store is served on loopback (``agentstore.store_address``)."""
    return WorldLayout(
        round=result.round,
        group_rank=me.group_rank,
        group_world_size=result.size,
        rank_offset=me.rank_offset,
        world_size=result.world_size,
        local_world_size=me.local_world_size,
        master_addr=master_addr or result.master_addr,
        master_port=result.master_port,
    )


def _place(rt: NodeRuntime, spec: JobSpec, rank: int) -> Placement | None:
    """This worker's cgroups and rlimits, prepared by the daemon (the child only joins them)."""
    limits = ResourceLimits.from_spec(spec.memory_limit_bytes, spec.cpu_limit, spec.nofile)
    if limits.empty:
        return None
    try:
        return rt.limits.place(spec.id, rank, limits)
    except LimitError as exc:
        raise SetupFailure(EndReason.SPAWN_FAILED, f"on node {rt.node_id}: {exc.message}") from exc


def hang_policy(spec: JobSpec) -> HangPolicy | None:
    if spec.hang_timeout_auto:
        return HangPolicy(None)
    return HangPolicy(spec.hang_timeout_s) if spec.hang_timeout_s is not None else None


async def start_group(
    rt: NodeRuntime,
    spec: JobSpec,
    layout: WorldLayout,
    attempt: int,
    restart_count: int,
    slots: tuple[int, ...],
    fence: bool,
    zygote: Zygote | None = None,
    snapshots: str | None = None,
    agent_store: bool = False,
    accounts: Accounts | None = None,
) -> tuple[WorkerGroup, HangWatch]:
    """Spawn this node's workers for one round (on the event-loop thread), each with its progress
    pipe, and the watch that reads them (and judges hangs, when the job asks).

    ``snapshots``: the job's snapshot keeper's socket, which the workers are told of; the keeper,
    like the zygote, outlives the attempt, and so does its cgroup leaf. ``agent_store``: what
    ``TORCHELASTIC_USE_AGENT_STORE`` says (``jobs.agentstore``).

    Raises ``SetupFailure`` (LOG_DIR_UNSAFE, LOG_DISK_FULL) when the attempt's logs cannot be
    created safely: the caller ends the job with that reason instead of spending restarts.
    """
    identity = switch_to(spec)
    owner = logdir.Owner.of(
        identity.uid if identity else os.geteuid(), identity.gid if identity else os.getegid(), rt.log_gid
    )
    ranks = [layout.rank_offset + local_rank for local_rank in range(layout.local_world_size)]
    files = logdir.create_attempt(rt.log_dir, spec.id, attempt, ranks, owner, rt.node_id)
    at = _Attempt(layout, restart_count, slots, identity, snapshots, agent_store)
    launches, channels = _prepare(rt, spec, at, files)
    watch = HangWatch(
        [WatchedRank(ln.rank, ln.local_rank, ch) for ln, ch in zip(launches, channels, strict=True)],
        hang_policy(spec),
        identity,
        spec.id,
        rt.node_id,
        attempt,
        functools.partial(_write_stacks, rt, spec.id, attempt, owner),
        wall_clock,
        elsewhere=layout.local_world_size < layout.world_size,
        accounts=accounts,
    )
    tracked = rt.tracking.job(spec.id)
    spawner: Spawner = ColdSpawner()
    if zygote is not None:  # it outlives the attempt, and so does its cgroup
        spawner, tracked = WarmSpawner(zygote, spawner), tracked.ranks()
    if snapshots is not None:
        tracked = tracked.ranks()
    group = WorkerGroup(
        launches, rt.reaper, spec.stop_grace_s, fence=fence, tracking=tracked, spawner=spawner
    )
    try:
        await group.start()  # closes every log fd
    finally:
        for channel in channels:  # the workers have theirs: ours would hide their end
            channel.close_write()
    watch.attach([(w.pid, _runs(w)) for w in group.workers])
    return group, watch


@dataclass(frozen=True)
class _Attempt:
    """What every rank's launch of one attempt on this node shares."""

    layout: WorldLayout
    restart_count: int
    slots: tuple[int, ...]
    identity: Identity | None
    snapshots: str | None  # the job's snapshot keeper's socket, which every rank is told of
    agent_store: bool = False  # the ranks are clients of the job's store host


def _prepare(
    rt: NodeRuntime, spec: JobSpec, at: _Attempt, files: Sequence[logdir.RankFiles]
) -> tuple[list[Launch], list[ProgressChannel]]:
    """Each rank's launch and progress pipe; on any error, every fd and placement made so far is
    released (the log fds too: ``WorkerGroup.start`` would have closed them)."""
    launches: list[Launch] = []
    channels: list[ProgressChannel] = []
    try:
        visible = rt.inventory.visible_devices(at.slots)
        pins = rt.limits.name == "rlimit"
        cpus = rank_cpus(spec.numa_binding, rt.numa, rt.inventory, at.slots, len(files), spec.cpu_limit, pins)
        for local_rank, f in enumerate(files):
            channel = ProgressChannel((at.identity.uid, at.identity.gid) if at.identity else None)
            channels.append(channel)
            launches.append(_launch(rt, spec, at, (visible, cpus[local_rank]), local_rank, f, channel))
    except BaseException:
        for f in files:
            os.close(f.log_fd)
        for launch in launches:
            if launch.limits is not None:
                launch.limits.close()
        for channel in channels:
            channel.close()
        raise
    return launches, channels


def _launch(
    rt: NodeRuntime,
    spec: JobSpec,
    at: _Attempt,
    devices: tuple[str, frozenset[int] | None],
    local_rank: int,
    f: logdir.RankFiles,
    channel: ProgressChannel,
) -> Launch:
    """One rank's launch; ``devices``: the GPUs it sees (``CUDA_VISIBLE_DEVICES``) and the CPUs it
    is bound to (None: not bound)."""
    visible, cpus = devices
    env = worker_env(
        base=spec.env,
        layout=at.layout,
        local_rank=local_rank,
        run_id=spec.id,
        restart_count=at.restart_count,
        max_restarts=spec.max_restarts,
        visible_devices=visible,
        error_file=str(f.error_path),
        owner=rt.node_id,
        agent_store=at.agent_store,
    )
    env[PROGRESS_FD_ENV] = str(channel.write_fd)
    env[HEARTBEAT_FILE_ENV] = f"/dev/fd/{channel.write_fd}"
    if at.snapshots is not None:
        env[SNAPSHOT_SOCKET_ENV] = at.snapshots
    return Launch(
        local_rank=local_rank,
        rank=f.rank,
        argv=tuple(spec.argv),
        env=env,
        cwd=spec.cwd,
        log_fd=f.log_fd,
        log_path=f.log_path,
        error_file=f.error_path,
        identity=at.identity,
        limits=_place(rt, spec, f.rank),
        progress_fd=channel.write_fd,
        cpus=cpus,
        mems=memory_nodes(rt.numa, cpus) if rt.numa is not None else None,
    )


def _runs(worker: Worker) -> Callable[[], bool]:
    return lambda: worker.running


def _write_stacks(
    rt: NodeRuntime, job_id: str, attempt: int, owner: logdir.Owner, rank: int, text: str
) -> None:
    stackfile.write_stacks(rt.log_dir, job_id, attempt, rank, text, owner, rt.node_id)


def _timer(delay_s: float) -> asyncio.Future[int]:
    """A future that completes ``delay_s`` from now (on the running loop)."""
    loop = asyncio.get_running_loop()
    timer: asyncio.Future[int] = loop.create_future()

    def ring() -> None:
        if not timer.done():
            timer.set_result(0)

    loop.call_later(delay_s, ring)
    return timer


class ProcessWorkers:
    """A started ``WorkerGroup`` as the agent sees it (``elasticd.agent.seams.Workers``).

    It gathers the facts (exits, a named hang, the time) and reads what the decider asks for; the
    settle window, hang-versus-exit precedence and the full-disk ending are ``jobs.decider``'s.
    """

    def __init__(
        self,
        group: WorkerGroup,
        rt: NodeRuntime,
        attempt: int,
        watch: HangWatch | None = None,
        stopped: Callable[[], None] | None = None,
        accounts: Accounts | None = None,
    ) -> None:
        self._group = group
        self._accounts = accounts  # the job's goodput here: told the stop, and whether we failed
        self._rt = rt
        self._attempt = attempt
        self._watch = watch
        self._stopped = stopped  # told once every worker is gone (the snapshot keeper writes behind)
        self._started_at = wall_clock()
        self._settled: asyncio.Future[int] | None = None
        self._told = False  # the job's ledger here was told the stop

    def pids(self) -> list[int]:
        return [w.pid for w in self._group.running if w.pid]

    def pgids(self) -> list[int]:
        return [w.pid for w in self._group.workers if w.pid]

    def _exited(self) -> list[Worker]:
        return [w for w in self._group.workers if not w.running]

    def _facts(self) -> tuple[list[Exited], int]:
        """The exits so far (code, when) and how many workers still run: the decider's input."""
        exited = [Exited(w.exited.result(), w.exited_at) for w in self._exited()]
        return exited, len(self._group.running)

    def exits(self) -> set[asyncio.Future[int]]:
        """The running workers' exits, the end of a failure's settling time, and a hang."""
        futures = {w.exited for w in self._group.running}
        if self._watch is not None and not self._watch.hung.done():
            futures.add(self._watch.hung)
        left = settle_left(*self._facts(), wall_clock())
        if left > 0:
            if self._settled is None:
                self._settled = _timer(left + 0.01)
            futures.add(self._settled)
        return futures

    def observe(self, describe: bool) -> Group:
        """The group as the decider judges it (``jobs.decider.judge``), with what it asked read."""
        if not self._group.running:
            self._tell_stop()
        hang = self._watch.failure if self._watch is not None else None
        got = judge(*self._facts(), hang is not None, wall_clock(), describe)
        return report(got.verdict, self._failure(got, hang), self._disk_full(got))

    def _failure(self, got: Judgement, hang: WorkerFailure | None) -> WorkerFailure | None:
        if got.describe_hang and hang is not None:
            return self._with_progress(hang)
        if not got.describe_exits:
            return None
        failed = [w for w in self._exited() if w.exited.result() != 0]
        described = describe_failure(self._rt.node_id, self._attempt, failed, self._started_at)
        return self._with_progress(described)

    def _disk_full(self, got: Judgement) -> SetupFailure | None:
        if not got.check_disk or not logdir.log_disk_full(self._rt.log_dir):
            return None
        return logdir.disk_full(self._rt.log_dir, self._rt.node_id)

    def _with_progress(self, failure: WorkerFailure) -> WorkerFailure:
        """``failure`` with how far the attempt got: its furthest reported step and run time (to
        tell a failure that repeats itself with no progress, see ``jobs.rootcause.same_way``)."""
        steps = [p.step for p in self.progress() if p.step is not None]
        ran = failure.ran_s if failure.ran_s is not None else max(0.0, wall_clock() - self._started_at)
        return replace(failure, step=max(steps, default=None), ran_s=ran)

    def progress(self) -> list[RankProgress]:
        """Each local rank's progress, as its reports say."""
        return self._watch.progress() if self._watch is not None else []

    def _tell_stop(self) -> None:
        """Tell the job's ledger here that the workers stopped, and whether ours failed, once: as of
        the last exit when every worker has exited (what is reported from then on, the outcome
        included, books the time after the last step as a stop's, not as a step in flight), now
        when they are being stopped."""
        if self._accounts is None or self._told:
            return
        self._told = True
        gone = not self._group.running
        if gone and self._watch is not None:
            self._watch.drain()  # their last reports first
        hung = self._watch is not None and self._watch.failure is not None
        failed = hung or any(w.exited.result() != 0 for w in self._exited())
        exits = [at for w in self._exited() if (at := w.exited_at) is not None]
        self._accounts.stopped(failed, max(exits) if gone and exits else None)

    async def stop(self, grace_s: float) -> list[int]:
        self._tell_stop()
        if self._watch is not None:
            self._watch.close()
        stuck = await self._group.stop(grace_s)
        if self._stopped is not None:
            self._stopped()
        return stuck

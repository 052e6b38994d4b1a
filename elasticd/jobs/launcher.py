"""One job's workers on this node, attempt after attempt (``elasticd.agent.seams.Launcher``), and
the job's zygote: adopted from the node's pool or started when the job is admitted, offered back
to the pool when the agent leaves (``elasticd.workers.warm.pool``)."""

from __future__ import annotations

import asyncio

from elasticd import log
from elasticd.jobs import agentstore
from elasticd.jobs.agentstore import Offer
from elasticd.jobs.attempt import NodeRuntime, ProcessWorkers, layout_for, master_port, start_group
from elasticd.jobs.env import zygote_env
from elasticd.jobs.identity import switch_to
from elasticd.jobs.nodecheck import NodeChecks, Runner
from elasticd.jobs.pathcheck import check_paths
from elasticd.jobs.portguard import guard_of
from elasticd.netaddr import listen_error
from elasticd.progress.accounts import Accounts
from elasticd.progress.goodput import Ledger, Silence
from elasticd.rendezvous.fitness import CheckTarget, Link
from elasticd.rendezvous.model import Member, RoundHead
from elasticd.terms.options import EntryKind
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, SetupFailure
from elasticd.workers.cgroups.limits import ResourceLimits
from elasticd.workers.group import wall_clock
from elasticd.workers.warm import storehost
from elasticd.workers.warm.snapshotkeeper import KeeperSetup, SnapshotKeeper
from elasticd.workers.warm.spawn import ZygoteSetup
from elasticd.workers.warm.storehost import StoreError, StoreHost
from elasticd.workers.warm.zygote import Zygote, ZygoteState

_log = log.get("elasticd.launch")


def zygote_setup(rt: NodeRuntime, spec: JobSpec) -> ZygoteSetup | str:
    """What the job's zygote is started with, or why the job has none here."""
    if not spec.warm:
        return "off (--no-warm)"
    if spec.entry_kind is EntryKind.EXEC:
        return "not a python entry point (--no-python)"
    if not ResourceLimits.from_spec(spec.memory_limit_bytes, spec.cpu_limit, spec.nofile).empty:
        return "resource limits are applied to each worker as root before it starts"
    return ZygoteSetup(
        job_id=spec.id,
        python=spec.python,
        kind="module" if spec.entry_kind is EntryKind.MODULE else "script",
        entry=spec.entry,
        cwd=spec.cwd,
        env=zygote_env(spec.env, spec.id, rt.node_id),
        identity=switch_to(spec),
        preload=spec.preload,
        uid=spec.uid,
    )


def keeper_setup(rt: NodeRuntime, spec: JobSpec) -> KeeperSetup | str:
    """What the job's snapshot keeper is started with, or why the job has none here."""
    if rt.snapshot_bytes <= 0:
        return f"off (snapshot_bytes is 0, {rt.snapshot_source.value})"
    if spec.entry_kind is EntryKind.EXEC:
        return "not a python entry point (--no-python)"
    return KeeperSetup(
        job_id=spec.id,
        python=spec.python,
        cwd=spec.cwd,
        env=zygote_env(spec.env, spec.id, rt.node_id),
        identity=switch_to(spec),
        bound=rt.snapshot_bytes,
        address=rt.address,
    )


MAX_REPLACED = 10  # zygotes a job starts again on a node after losing one
CHECK_PYTHON = "/usr/bin/python3"  # runs the node check of a job that has no interpreter (--no-python)


class ProcessLauncher:
    """Starts worker process trees as the submitter (``elasticd.agent.seams.Launcher``), one job's on
    this node: forked from the job's zygote while there is one (``prepare`` adopts a parked one or
    starts it, ``close`` offers it back to the pool or stops it), cold otherwise."""

    def __init__(self, rt: NodeRuntime) -> None:
        self._rt = rt
        self._zygote: asyncio.Task[Zygote] | None = None
        self._keeper: SnapshotKeeper | None = None
        self._store: StoreHost | None = None  # the job's store host here (``jobs.agentstore``)
        self._cold = ""  # why the job has no zygote here
        self._job = ""
        self._uid = 0  # the submitter's: whose sockets the port filter keeps to the job's members
        self._bind = rt.address  # where the store host listens here (``agentstore.store_address``)
        self._named: int | None = None  # the port the user named for MASTER_PORT (--master-port)
        self._accounts: Accounts | None = None  # the job's goodput here, across its rounds
        self._checks: NodeChecks | None = None  # with --node-check (``rendezvous.fitness``)
        self._replaced = 0  # zygotes started again after one was lost (``_replace_zygote``)

    def prepare(self, spec: JobSpec) -> None:
        """The job was admitted here: get its zygote now, so its imports overlap the rendezvous."""
        if self._zygote is not None or self._keeper is not None:
            return
        self._job = spec.id
        self._named = spec.master_port
        self._uid = spec.uid
        self._bind = agentstore.store_address(self._rt.address, spec.nnodes.max)
        self._accounts = self._rt.books.of(spec.id, spec.submitted_at, wall_clock)
        if spec.node_check:
            python = spec.python if spec.entry_kind is not EntryKind.EXEC and spec.python else CHECK_PYTHON
            runner = Runner(python, switch_to(spec), spec.cwd)
            self._checks = NodeChecks(runner, self._rt.address, spec.join_timeout_s)
        self._start_keeper(spec)
        setup = zygote_setup(self._rt, spec)
        if isinstance(setup, str):
            _log.info("zygote.none", job=spec.id, reason=setup)
            self._cold = setup
            return
        self._zygote = asyncio.ensure_future(self._obtain(setup))

    def _start_keeper(self, spec: JobSpec) -> None:
        setup = keeper_setup(self._rt, spec)
        if isinstance(setup, str):
            _log.debug("snapshots.none", job=spec.id, reason=setup)
            return
        try:
            procs_fd = self._rt.tracking.job(spec.id).join_snapshots()
        except OSError as exc:
            _log.error("tracking.join_failed", job=spec.id, rank="snapshots", error=str(exc))
            procs_fd = None
        self._keeper = SnapshotKeeper(setup, self._rt.reaper, procs_fd)
        self._keeper.spawn()

    def _replace_zygote(self, spec: JobSpec) -> None:
        """The job's zygote was lost (killed with the job's processes when the node was fenced, or
        it misbehaved): start another for the next attempts, which would all start cold (no warm
        fork, no store host) for the rest of the job. At most ``MAX_REPLACED`` times a job here: a
        zygote that keeps dying is not started forever."""
        if self._replaced >= MAX_REPLACED:
            return
        setup = zygote_setup(self._rt, spec)
        if isinstance(setup, str):
            return
        self._replaced += 1
        _log.info("zygote.replaced", job=spec.id, times=self._replaced, of=MAX_REPLACED)
        self._zygote = asyncio.ensure_future(self._obtain(setup))

    async def _obtain(self, setup: ZygoteSetup) -> Zygote:
        """A parked zygote identical to the one ``setup`` starts, or a new one (spawned on the event
        loop's thread: its parent-death signal is tied to that thread)."""
        tracking = self._rt.tracking.job(setup.job_id)
        try:
            adopted = await self._rt.zygotes.take(setup, tracking)
        except Exception as exc:  # a bug of the pool's must not cost the job its zygote
            _log.exception("zygote.take_failed", job=setup.job_id, error=str(exc))
            adopted = None
        if adopted is not None:
            return adopted
        try:
            procs_fd = tracking.join_zygote()
        except OSError as exc:
            _log.error("tracking.join_failed", job=setup.job_id, rank="zygote", error=str(exc))
            procs_fd = None
        zygote = Zygote(setup, self._rt.reaper, procs_fd)
        zygote.spawn()
        return zygote

    async def start(
        self,
        spec: JobSpec,
        result: RoundHead,
        member: Member,
        restarts: int,
        slots: tuple[int, ...],
        silence: Silence | None = None,
    ) -> ProcessWorkers:
        if self._checks is not None:
            await self._checks.stop()  # the round closed: its checks are done
        problem = await asyncio.to_thread(check_paths, spec)  # as the submitter, as exec will see them
        if problem is not None:
            raise problem.to_setup_failure(self._rt.node_id)
        zygote = await self._zygote if self._zygote is not None else None
        if zygote is not None and not await zygote.ready():
            _log.info(
                "zygote.cold", job=spec.id, round=result.round, state=zygote.state.value, why=zygote.reason
            )
            if zygote.state is ZygoteState.LOST:
                self._replace_zygote(spec)
            zygote = None
        agent_store = await self._agent_store(result, member, zygote)
        if self._accounts is not None:
            self._accounts.launched(restarts, silence)
        group, watch = await start_group(
            self._rt,
            spec,
            layout_for(result, member, self._loopback()),
            attempt=result.round,
            restart_count=restarts,
            slots=slots,
            fence=result.size > 1,  # a one-member round has no peers to fence it from
            zygote=zygote,
            snapshots=await self._snapshots(),
            agent_store=agent_store,
            accounts=self._accounts,
        )
        stopped = self._keeper.persist if self._keeper is not None else None
        return ProcessWorkers(group, self._rt, result.round, watch, stopped, self._accounts)

    def goodput(self) -> Ledger | None:
        return self._accounts.ledger if self._accounts is not None else None

    async def offer(self, round_no: int) -> Offer:
        """What this node puts in its join to ``round_no``: ``MASTER_PORT`` should it lead, and
        whether the job's store host listens there. Kept across rounds, emptied here of the
        previous attempt's keys: this node's ranks have stopped, and no rank of ``round_no`` can
        reach it before this join is written (an emptying at the start would race the other nodes'
        ranks, which connect as soon as their node starts them). One that served a round of several
        nodes is replaced (``agentstore.offered_again``). Started here when the zygote is ready now
        (a join never waits for its imports: the round's join timeout runs meanwhile)."""
        zygote, cold = self._zygote_now()
        host = await self._kept(round_no)
        failed = None
        if host is None:
            host, failed = await self._fresh(zygote)
        choice = agentstore.at_join(cold if host is None else None, failed)
        if host is not None:  # its listener is known before any answer; the members, at the start
            await self._rt.ports.listen(guard_of(self._job, self._uid, (), self._bind, (host.port,)))
        _log.info("store.offer", job=self._job, agent_store=choice.agent_store, why=choice.why)
        check_port, compute = await self._checks.offer(self._job) if self._checks is not None else (0, None)
        if host is not None:
            return Offer(host.port, True, check_port, compute)
        return Offer(self._port(), False, check_port, compute)

    async def check_links(self, targets: tuple[CheckTarget, ...]) -> dict[str, Link]:
        """As a round's leader: this node's link to each joiner's check server."""
        return await self._checks.links(targets) if self._checks is not None else {}

    def _port(self) -> int:
        """The port this node offers: the one the user named, else a free one."""
        return self._named if self._named is not None else master_port(self._rt)

    async def _kept(self, round_no: int) -> StoreHost | None:
        """The store host of the previous round, emptied for ``round_no``, if it may serve it."""
        host = self._store
        if host is None or not agentstore.offered_again(host.alive, host.served_peers):
            return None
        try:
            await host.clear(round_no)
        except StoreError as exc:
            _log.warning("store.clear_failed", job=self._job, pid=host.pid, error=str(exc))
            return None
        return host

    async def _fresh(self, zygote: Zygote | None) -> tuple[StoreHost | None, str | None]:
        """A new store host from ``zygote`` (None and why when none starts), the old one stopped.
        It stops after the new one listens, so the new port is another than the old one's; on a
        port the user named there is one port only, so it stops first."""
        if self._named is not None:
            await self._stop_store()
        fresh, failed = None, None
        if zygote is not None:
            try:
                fresh = await storehost.start(zygote, self._bind, self._port())
            except StoreError as exc:
                failed = str(exc)
        await self._stop_store()
        self._store = fresh
        return fresh, failed

    def _loopback(self) -> str | None:
        """``MASTER_ADDR`` for a job of one node for life, whose store is served on loopback (None:
        the round's, group rank 0's address)."""
        return self._bind if self._bind != self._rt.address else None

    def _zygote_now(self) -> tuple[Zygote | None, str]:
        """The job's zygote if it is ready now, or None and why not."""
        if self._zygote is None:
            return None, f"no warm parent ({self._cold or 'none'})"
        zygote = self._zygote.result() if self._zygote.done() else None
        if zygote is None or zygote.state is ZygoteState.STARTING:
            return None, "the warm parent's imports run on"
        if not zygote.usable:
            return None, f"no warm parent ({zygote.state.value}: {zygote.reason})"
        return zygote, ""

    async def _agent_store(self, result: RoundHead, member: Member, zygote: Zygote | None) -> bool:
        """What the round's workers here are told (``agentstore.at_start``). A round of this node
        alone decides here (a store host started now if its join could not offer one yet); in a
        round of several nodes, the leader checks that the host it offered still serves, and
        starts another on its port if it died since the join (the other nodes' ranks were told
        that port, and connect to whatever listens there)."""
        leads, one_node = member.group_rank == 0, result.size == 1
        serving = None
        if one_node or (leads and result.agent_store):
            serving = await self._serving(result, zygote)
        choice = agentstore.at_start(result.agent_store, leads, one_node, serving)
        # A cold job, or a script that cannot use torch's store: rank 0 hosts, as planned.
        expected = serving is None or self._zygote is None or serving == storehost.NO_TORCH
        say = _log.info if expected else _log.error if choice.agent_store else _log.warning
        say("store.chosen", job=self._job, round=result.round, agent_store=choice.agent_store, why=choice.why)
        if serving is not None:
            await self._stop_store()  # rank 0 may host on the port; the next join starts another
        await self._check_named(leads, choice, serving, result.master_port)
        return choice.agent_store

    async def _check_named(
        self, leads: bool, choice: agentstore.Choice, serving: str | None, port: int
    ) -> None:
        """Refuse the job at once when nothing can listen on the port its user named
        (``agentstore.named_port_refusal``); raises ``SetupFailure``."""
        listen = None
        if self._named is not None and leads and not choice.agent_store:
            listen = await asyncio.to_thread(listen_error, port)  # rank 0 is to listen there itself
        refusal = agentstore.named_port_refusal(self._named, leads, choice, serving, listen)
        if refusal is not None:
            raise SetupFailure(EndReason.SPAWN_FAILED, f"on node {self._rt.node_id}: {refusal}")

    async def _serving(self, result: RoundHead, zygote: Zygote | None) -> str | None:
        """Why the store host cannot serve ``result``'s round (None: it can; it was emptied at
        the join, or is new); one is started on the round's port from ``zygote`` when none listens
        there."""
        host = self._store
        if (host is None or not host.alive or host.port != result.master_port) and zygote is not None:
            await self._stop_store()
            try:
                host = self._store = await storehost.start(zygote, self._bind, result.master_port)
            except StoreError as exc:
                return str(exc)
        if host is None or not host.alive:
            if host is not None:
                return "it has ended"
            return f"no warm parent ({self._cold})" if self._cold else "no usable warm parent"
        if host.port != result.master_port:
            return f"it listens on {host.port}, not {result.master_port}"
        host.served_peers = result.size > 1
        return None

    async def _stop_store(self) -> None:
        host, self._store = self._store, None
        if host is not None:
            await host.close()

    async def _snapshots(self) -> str | None:
        """What the workers' ``ELASTICD_SNAPSHOT_SOCKET`` says: the keeper's socket, "" when this
        node keeps snapshots but its keeper is unavailable (the ranks' restore is a collective: every
        rank of the job must take part, each saying what it holds), None when it keeps none."""
        if self._keeper is None:
            return None
        return await self._keeper.ready() or ""

    async def close(self) -> None:
        """The job ended on this node, or this node left it: its workers are stopped. Its zygote
        goes to the node's pool if it takes it (moved out of the job's cgroup first), else stops.
        Its snapshot keeper stops, and its snapshots with it; its store host stops first."""
        try:
            await self._stop_store()
            await self._rt.ports.release(self._job)
            if self._checks is not None:
                await self._checks.stop()
        except Exception as exc:  # the agent is leaving: say so, never stop it from leaving
            _log.error("store.close_failed", job=self._job, error=str(exc))
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            try:
                await keeper.close()
                await asyncio.to_thread(self._rt.tracking.job(self._job).drop_snapshots)
            except Exception as exc:  # the agent is leaving: say so, never stop it from leaving
                _log.error("snapshots.close_failed", job=self._job, error=str(exc))
        task, self._zygote = self._zygote, None
        if task is None:
            return
        try:
            zygote = await task
            if not self._rt.zygotes.offer(zygote):
                await zygote.close()
            await asyncio.to_thread(self._rt.tracking.job(self._job).drop_zygote)
        except Exception as exc:  # the agent is leaving: say so, never stop it from leaving
            _log.error("zygote.close_failed", job=self._job, error=str(exc))

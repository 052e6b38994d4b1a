"""The composition root: every part of one daemon, built in order, each with its collaborators.

Each part registers its own cleanup on the one ``AsyncExitStack`` as it is built, so the stack
unwinds in reverse order and a failure halfway through startup tears down exactly what was built.
The node's leave (stop serving, stop every job's workers, revoke the lease, close the liveness
port) is registered last, once the daemon serves: it has an order of its own (peers read our
death only once we have left) and runs first at any stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from elasticd import log
from elasticd.config import Settings
from elasticd.control.server import ControlServer
from elasticd.daemon import systemd, taskdump
from elasticd.daemon.observe import Observability
from elasticd.daemon.testhooks import FAKE_NVML_ENV, FakeHardware, fake_hardware
from elasticd.errors import ConfigError, EtcdUnavailable
from elasticd.etcd.backend import connect
from elasticd.etcd.embedded import EmbeddedEtcd
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import Backend
from elasticd.etcd.space import SpaceLimits
from elasticd.etcd.types import EtcdAuth
from elasticd.gpu.fakefile import FileNvml
from elasticd.gpu.health import Verdict
from elasticd.gpu.nvml import Nvml
from elasticd.happenings.bus import publish
from elasticd.happenings.records import DaemonReady
from elasticd.jobs.attempt import NodeRuntime
from elasticd.jobs.logdir import log_group_gid
from elasticd.jobs.quota import Quotas
from elasticd.manager.access import Admins
from elasticd.manager.etcdspace import SpaceWatch
from elasticd.manager.facts import NodeFacts
from elasticd.manager.jobmanager import JobManager
from elasticd.manager.service import CommandService
from elasticd.netaddr import NoFreePort
from elasticd.node import hostmemory
from elasticd.node.gpuwatch import GpuWatch
from elasticd.node.hooks import LeaseHooks
from elasticd.node.inventory import Inventory, discover, load_nvml
from elasticd.node.liveness import LivenessServer
from elasticd.node.numa import read_host
from elasticd.node.registry import NodeRegistry
from elasticd.node.snapshotbound import SnapshotBound, bound_of
from elasticd.node.statedir import StateDir
from elasticd.portfilter.guard import detect as detect_ports
from elasticd.trustedpath import read_secret, trusted_file
from elasticd.workers.cgroups.hierarchy import detect
from elasticd.workers.cgroups.limits import LimitBackend
from elasticd.workers.cgroups.tracking import Tracker
from elasticd.workers.cgroups.tracking import detect as detect_tracking
from elasticd.workers.proctree.reaper import Reaper
from elasticd.workers.warm.pool import ZygotePool
from elasticd.workers.warm.pool_decider import Limits

_log = log.get("elasticd.daemon")

ETCD_CONNECT_TIMEOUT_S = 30.0


class Background:
    """The daemon's long-running tasks: cancelled and awaited together at stop."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []

    def start(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        self.tasks.append(asyncio.create_task(coro, name=name))

    async def first_crash(self) -> None:
        """Returns when one task ends with an exception (logged)."""
        done, _ = await asyncio.wait(self.tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                _log.error("daemon.task_crashed", task=task.get_name(), error=repr(task.exception()))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@dataclass(frozen=True)
class Etcd:
    client: Backend
    endpoints: list[str]
    auth: EtcdAuth


@dataclass(frozen=True)
class Node:
    """What the daemon serves with, once built."""

    node_id: str
    etcd_endpoints: list[str]
    inventory: Inventory
    background: Background


def read_auth(s: Settings) -> EtcdAuth:
    """The etcd credentials; the password file is read once, here (a ConfigError if it is not
    root's alone, see ``elasticd.trustedpath``)."""
    password = s.etcd_password
    if s.etcd_password_file is not None:
        password = read_secret(s.etcd_password_file, "etcd_password_file")
    return EtcdAuth(s.etcd_ca, s.etcd_cert, s.etcd_key, s.etcd_user, password)


async def connect_etcd(s: Settings, stack: contextlib.AsyncExitStack) -> Etcd:
    """The embedded etcd started (if asked), then a client that has seen it healthy."""
    auth = read_auth(s)
    endpoints = list(s.etcd_endpoints)
    if s.embedded_etcd:
        embedded = EmbeddedEtcd(s.state_dir / "etcd", s.etcd_binary, quota_bytes=s.etcd_quota_bytes)
        stack.callback(embedded.stop)  # before start: a start that fails halfway is stopped too
        await asyncio.to_thread(embedded.start)
        endpoints = [embedded.endpoint]
    client = connect(s.etcd_client, endpoints, auth)
    deadline = time.monotonic() + ETCD_CONNECT_TIMEOUT_S
    while True:
        try:
            version = await asyncio.to_thread(client.health)
            _log.info("etcd.connected", endpoints=endpoints, version=version, client=s.etcd_client)
            stack.callback(client.close)
            return Etcd(client, endpoints, auth)
        except EtcdUnavailable as exc:
            if time.monotonic() > deadline:
                raise
            _log.warning("etcd.waiting", error=str(exc))
            await asyncio.sleep(1.0)


def warn_if_unreachable(s: Settings) -> None:
    """A loopback address with an external etcd: workers on other hosts would hang at
    process-group init trying to reach this node. Left at its default, this node also takes
    no multi-node job (``jobs.admission``); set explicitly, it says every node runs here."""
    if s.single_host_only:
        _log.warning(
            "address.loopback",
            address=s.effective_address,
            consequence="this node takes no multi-node job",
            fix="set address (--address, ELASTICD_ADDRESS) to this host's address on the "
            "training network, or to 127.0.0.1 explicitly if every node runs on this host",
        )
    elif s.loopback_with_external_etcd:
        _log.warning(
            "address.loopback",
            address=s.effective_address,
            consequence="workers on other hosts cannot reach this node (fine if every node runs here)",
        )


async def start_liveness(s: Settings, stack: contextlib.AsyncExitStack) -> LivenessServer:
    """The port peers probe to tell this node is alive. The leave closes it, in the leave's order;
    the stack closes it too, so that a start failing after it listens leaves no port open (the
    second close of a normal stop does nothing)."""
    liveness = LivenessServer(s.effective_address)
    stack.push_async_callback(liveness.close)
    try:
        await liveness.start(s.worker_ports)
    except NoFreePort as exc:
        raise ConfigError(str(exc)) from exc
    return liveness


@dataclass(frozen=True)
class Jobs:
    manager: JobManager
    registry: NodeRegistry
    space: SpaceWatch
    quotas: Quotas
    admins: Admins


async def build_jobs(
    s: Settings,
    stack: contextlib.AsyncExitStack,
    etcd: Etcd,
    keys: Keys,
    state: StateDir,
    rt: NodeRuntime,
    gpu_watch: GpuWatch | None = None,
) -> Jobs:
    """The lease's registry and the job manager, which need each other (``LeaseHooks``)."""
    # The lease has its own client with short calls: a keep-alive stuck on a dead etcd member
    # must fail over well within the TTL, or the node would fence itself for nothing.
    lease_etcd = connect(s.etcd_client, etcd.endpoints, etcd.auth, timeout_s=max(0.5, s.lease_ttl / 5))
    stack.callback(lease_etcd.close)
    hooks = LeaseHooks()
    registry = NodeRegistry(
        lease_etcd,
        keys,
        rt.node_id,
        s.lease_ttl,
        record=lambda: (
            {"address": rt.address, "inventory": rt.inventory.to_json()}
            | {"snapshot_bytes": rt.snapshot_bytes, "snapshot_source": rt.snapshot_source.value}
            | {"port_filter": rt.ports.mode.value, "port_filter_detail": rt.ports.detail}
            | hooks.capacity()
        ),
        reaper=rt.reaper,
        hooks=hooks,
    )
    quotas, admins = Quotas.from_settings(s), Admins.of_group(s.admin_group)
    space = SpaceWatch(etcd.client, SpaceLimits(s.etcd_quota_bytes, s.etcd_high_water))
    await space.read()  # before the first submit or the janitor's first sweep
    manager = JobManager(rt, etcd.client, keys, state, registry, s.allow_root_jobs,
                         retention_s=s.job_retention or None, quotas=quotas, admins=admins,
                         space=lambda: space.space, hooks=hooks, gpu_watch=gpu_watch)  # fmt: skip
    return Jobs(manager, registry, space, quotas, admins)


def runtime(
    s: Settings,
    node_id: str,
    inventory: Inventory,
    reaper: Reaper,
    liveness: LivenessServer,
    limits: LimitBackend,
    tracking: Tracker,
) -> NodeRuntime:
    snapshots = snapshot_bound(s.snapshot_bytes)
    return NodeRuntime(
        node_id,
        s.effective_address,
        s.effective_log_dir,
        inventory,
        reaper,
        liveness.port,
        limits=limits,
        log_gid=log_group_gid(s.log_group),
        worker_ports=s.worker_ports,
        single_host_only=s.single_host_only,
        tracking=tracking,
        zygotes=ZygotePool(Limits(s.warm_pool_size, s.warm_keep_s), tracking),
        numa=read_host(),
        snapshot_bytes=snapshots.bytes,
        snapshot_source=snapshots.source,
        straggler_grace_s=s.straggler_grace,
        shrink_interval_s=s.shrink_interval,
        ports=detect_ports(s.port_filter),
    )


def snapshot_bound(setting: int | None) -> SnapshotBound:
    """The bound on each job's memory snapshots here: the operator's, else derived from the host's
    memory as it is at start (logged with what it was derived from)."""
    host = hostmemory.read()
    bound = bound_of(setting, host)
    _log.info("snapshots.bound", bytes=bound.bytes, source=bound.source.value, mem_total=host.mem_total,
              shm_size=host.shm_size, shm_free=host.shm_free)  # fmt: skip
    return bound


def nvml_of(fake: FakeHardware) -> Nvml | None:
    """A test's fake NVML, none where a test's plain fake GPUs stand in for it (``testhooks``),
    else pynvml (None where it is not installed)."""
    if fake.nvml is not None:  # re-read by name as the test changes it: root's, under root's dirs
        return FileNvml(trusted_file(fake.nvml, FAKE_NVML_ENV))
    return None if fake.gpus is not None else load_nvml()


def watch_gpus(
    s: Settings,
    nvml: Nvml | None,
    inventory: Inventory,
    verdicts: asyncio.Queue[tuple[str, Verdict]],
    stack: contextlib.AsyncExitStack,
) -> GpuWatch | None:
    """The health watcher's thread, on a host whose GPUs NVML (or the tests' fake) reads."""
    if nvml is None or not inventory.gpus:
        return None
    loop = asyncio.get_running_loop()

    def report(uuid: str, verdict: Verdict) -> None:  # on the watcher's thread
        loop.call_soon_threadsafe(verdicts.put_nowait, (uuid, verdict))

    watch = GpuWatch(nvml, report, s.gpu_poll)
    stack.callback(watch.close)
    watch.start()
    return watch


async def start(
    s: Settings, stack: contextlib.AsyncExitStack, started_at: float, request_stop: Callable[[str], None]
) -> Node:
    """Build and start every part in order; the stack holds what to undo. Returns once serving."""
    keys = Keys(s.etcd_prefix)
    state = StateDir(s.state_dir)
    state.open()
    stack.callback(state.close)
    node_id = state.node_id(s.node_id)
    # Before any child exists: on cgroup v2 the daemon may have to move itself into a leaf.
    limits = detect(instance=node_id)
    tracking = detect_tracking(instance=node_id)  # after limits: both see the same cgroup
    reaper = Reaper(node_id, tracking.base)
    stack.callback(reaper.close)
    reaper.start()
    etcd = await connect_etcd(s, stack)
    fake = fake_hardware(os.environ)
    nvml = nvml_of(fake)
    inventory = discover(node_id, None if nvml else fake.gpus, s.slots, nvml)
    warn_if_unreachable(s)
    liveness = await start_liveness(s, stack)
    rt = runtime(s, node_id, inventory, reaper, liveness, limits, tracking)
    await rt.ports.start()  # no rule of a previous daemon's survives it: its jobs died with it
    stack.push_async_callback(rt.ports.close)
    verdicts: asyncio.Queue[tuple[str, Verdict]] = asyncio.Queue()
    gpu_watch = watch_gpus(s, nvml, inventory, verdicts, stack)
    jobs = await build_jobs(s, stack, etcd, keys, state, rt, gpu_watch)
    observe = Observability(
        node_id, etcd.client, keys, s.metrics_address, jobs.manager, jobs.registry, jobs.space
    )
    stack.push_async_callback(observe.close)  # after the tasks stop: the last events are written
    await observe.start()
    background = Background()
    stack.push_async_callback(background.close)
    server = await serve(s, etcd, keys, jobs, background, started_at)
    if gpu_watch is not None:
        background.start(jobs.manager.gpu_health.watch_gpus(verdicts), "gpu_health")
    stack.push_async_callback(leave, server, jobs.manager, jobs.registry, liveness, node_id)
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, request_stop, signal.Signals(sig).name)
    taskdump.install(asyncio.get_running_loop())
    # What exists now (modules, settings, clients: ~34,000 objects) lives as long as the
    # daemon: out of the collector's sight, a full collection takes ~0.1 ms, not 5 ms of a
    # control reply's time.
    gc.freeze()
    systemd.notify(f"READY=1\nSTATUS=serving on {s.socket}")
    publish(DaemonReady(node_id, str(s.socket), tuple(etcd.endpoints), inventory.kind, inventory.slots))
    return Node(node_id, etcd.endpoints, inventory, background)


async def serve(
    s: Settings, etcd: Etcd, keys: Keys, jobs: Jobs, background: Background, started_at: float
) -> ControlServer:
    """Register, recover what a crash left, start the tasks, and bind the control socket."""
    await jobs.registry.start()
    await jobs.manager.recover()
    background.start(jobs.registry.run(), "registry")
    background.start(jobs.manager.cluster.run(), "watch")
    background.start(jobs.manager.run(), "jobs")
    background.start(jobs.space.run(), "etcd_space")
    facts = NodeFacts(
        jobs.manager.rt.node_id,
        started_at,
        tuple(etcd.endpoints),
        s.embedded_etcd,
        s.allow_root_jobs,
        s.stop_grace,
        s.effective_log_dir,
        jobs.quotas,
        jobs.admins,
        node_check=s.node_check,
    )
    service = CommandService(facts, jobs.manager, jobs.registry, etcd.client, keys, space=jobs.space)
    server = ControlServer(service, s.socket, s.socket_mode, s.socket_group)
    server.bind()
    background.start(server.serve(), "control")
    return server


async def leave(
    server: ControlServer, manager: JobManager, registry: NodeRegistry, liveness: LivenessServer, node_id: str
) -> None:
    """The node's leave, in its own order: stop serving, stop every job's workers, revoke the lease,
    and only then close the liveness port (peers read our death only once we have left)."""
    systemd.notify("STOPPING=1")
    await server.close()
    await manager.rt.zygotes.close()  # first: leaving jobs stop their zygotes, none is parked
    await manager.shutdown()
    manager.rt.limits.release()
    manager.rt.tracking.release()
    await registry.stop()
    await liveness.close()
    _log.info("daemon.stopped", node=node_id)

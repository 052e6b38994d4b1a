"""Wiring and lifecycle of one daemon: start in order, serve, shut down in reverse order.

Start: state dir lock -> reaper sidecar -> etcd (embedded or external) -> crash recovery ->
node lease -> control socket -> READY. SIGTERM and SIGINT take the same path as any stop:
stop serving, stop every job's workers, flush statuses, revoke the lease, stop etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
from typing import Any

from elasticd import log
from elasticd.config import Settings
from elasticd.control.server import ControlServer
from elasticd.daemon import systemd
from elasticd.daemon.observe import Observability
from elasticd.errors import ConfigError, EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.embedded import EmbeddedEtcd
from elasticd.etcd.keys import Keys
from elasticd.etcd.space import SpaceLimits
from elasticd.etcd.types import EtcdAuth
from elasticd.happenings.bus import publish
from elasticd.happenings.records import DaemonReady, DaemonStopping
from elasticd.jobs.launch import NodeRuntime
from elasticd.jobs.logdir import log_group_gid
from elasticd.jobs.quota import Quotas
from elasticd.manager.access import Admins
from elasticd.manager.etcdspace import SpaceWatch
from elasticd.manager.jobs import JobManager
from elasticd.manager.service import CommandService, NodeFacts
from elasticd.netaddr import NoFreePort
from elasticd.node.inventory import discover
from elasticd.node.liveness import LivenessServer
from elasticd.node.registry import NodeRegistry
from elasticd.node.statedir import StateDir
from elasticd.trustedpath import read_secret
from elasticd.workers.cgroups.hierarchy import detect
from elasticd.workers.cgroups.tracking import detect as detect_tracking
from elasticd.workers.proctree.reaper import Reaper
from elasticd.workers.warm.pool import ZygotePool
from elasticd.workers.warm.pool_decider import Limits

_log = log.get("elasticd.daemon")

ETCD_CONNECT_TIMEOUT_S = 30.0


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started_at = time.time()
        self.keys = Keys(settings.etcd_prefix)
        self.log_dir = settings.effective_log_dir
        self._stop = asyncio.Event()
        self._state = StateDir(settings.state_dir)
        self._embedded: EmbeddedEtcd | None = None
        self._reaper: Reaper | None = None
        self._liveness: LivenessServer | None = None
        self._observe: Observability | None = None
        self.node_id = ""
        self.etcd_endpoints: list[str] = list(settings.etcd_endpoints)
        # Set during start(); typed as non-optional for the commands that use them.
        self.etcd: EtcdClient
        self._etcd_auth = EtcdAuth()
        self._lease_etcd: EtcdClient
        self.manager: JobManager
        self.registry: NodeRegistry

    def request_stop(self, reason: str) -> None:
        publish(DaemonStopping(reason))
        self._stop.set()

    def _read_auth(self) -> EtcdAuth:
        """The etcd credentials; the password file is read once, here (a ConfigError if it is not
        root's alone, see ``elasticd.trustedpath``)."""
        s = self.settings
        password = s.etcd_password
        if s.etcd_password_file is not None:
            password = read_secret(s.etcd_password_file, "etcd_password_file")
        return EtcdAuth(s.etcd_ca, s.etcd_cert, s.etcd_key, s.etcd_user, password)

    async def _connect_etcd(self) -> EtcdClient:
        s = self.settings
        if s.embedded_etcd:
            self._embedded = EmbeddedEtcd(s.state_dir / "etcd", s.etcd_binary, quota_bytes=s.etcd_quota_bytes)
            await asyncio.to_thread(self._embedded.start)
            self.etcd_endpoints = [self._embedded.endpoint]
        client = EtcdClient(self.etcd_endpoints, self._etcd_auth)
        deadline = time.monotonic() + ETCD_CONNECT_TIMEOUT_S
        while True:
            try:
                version = await asyncio.to_thread(client.health)
                _log.info("etcd.connected", endpoints=self.etcd_endpoints, version=version)
                return client
            except EtcdUnavailable as exc:
                if time.monotonic() > deadline:
                    raise
                _log.warning("etcd.waiting", error=str(exc))
                await asyncio.sleep(1.0)

    def _warn_if_unreachable(self) -> None:
        """A loopback address with an external etcd: workers on other hosts would hang at
        process-group init trying to reach this node. Left at its default, this node also takes
        no multi-node job (``jobs.admission``); set explicitly, it says every node runs here."""
        s = self.settings
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

    async def run(self) -> int:
        s = self.settings
        self._state.open()
        background: list[asyncio.Task[Any]] = []
        server: ControlServer | None = None
        try:
            self.node_id = self._state.node_id(s.node_id)
            # Before any child exists: on cgroup v2 the daemon may have to move itself into a leaf.
            limits = detect(instance=self.node_id)
            tracking = detect_tracking(instance=self.node_id)  # after limits: both see the same cgroup
            self._reaper = Reaper(self.node_id, tracking.base)
            self._reaper.start()
            self._etcd_auth = self._read_auth()
            self.etcd = await self._connect_etcd()
            inventory = discover(self.node_id, s.fake_gpus, s.slots)
            address = s.effective_address
            self._warn_if_unreachable()
            self._liveness = LivenessServer(address)
            try:
                await self._liveness.start(s.worker_ports)
            except NoFreePort as exc:
                raise ConfigError(str(exc)) from exc
            rt = NodeRuntime(
                self.node_id,
                address,
                self.log_dir,
                inventory,
                self._reaper,
                self._liveness.port,
                limits=limits,
                log_gid=log_group_gid(s.log_group),
                worker_ports=s.worker_ports,
                single_host_only=s.single_host_only,
                tracking=tracking,
                zygotes=ZygotePool(Limits(s.warm_pool_size, s.warm_keep_s), tracking),
            )
            # The lease has its own client with short calls: a keep-alive stuck on a dead etcd member
            # must fail over well within the TTL, or the node would fence itself for nothing.
            self._lease_etcd = EtcdClient(
                self.etcd_endpoints, self._etcd_auth, timeout_s=max(0.5, s.lease_ttl / 5)
            )
            self.registry = NodeRegistry(
                self._lease_etcd,
                self.keys,
                self.node_id,
                s.lease_ttl,
                record=lambda: (
                    {"address": rt.address, "inventory": inventory.to_json()} | self.manager.capacity()
                ),
                reaper=self._reaper,
            )
            retention = s.job_retention or None
            quotas, admins = Quotas.from_settings(s), Admins.of_group(s.admin_group)
            space = SpaceWatch(self.etcd, SpaceLimits(s.etcd_quota_bytes, s.etcd_high_water))
            await space.read()  # before the first submit or the janitor's first sweep
            self.manager = JobManager(rt, self.etcd, self.keys, self._state, self.registry, s.allow_root_jobs,
                                      retention_s=retention, quotas=quotas, admins=admins,
                                      space=lambda: space.space)  # fmt: skip
            self._observe = Observability(self.node_id, self.etcd, self.keys, s.metrics_address)
            await self._observe.start(self.manager, self.registry, space)
            await self.registry.start()
            await self.manager.recover()
            background.append(asyncio.create_task(self.registry.run(), name="registry"))
            background.append(asyncio.create_task(self.manager.watch(), name="watch"))
            background.append(asyncio.create_task(self.manager.run(), name="jobs"))
            background.append(asyncio.create_task(space.run(), name="etcd_space"))
            facts = NodeFacts(self.node_id, self.started_at, tuple(self.etcd_endpoints), s.embedded_etcd,
                              s.allow_root_jobs, s.stop_grace, self.log_dir, quotas, admins)  # fmt: skip
            service = CommandService(facts, self.manager, self.registry, self.etcd, self.keys, space=space)
            server = ControlServer(service, s.socket, s.socket_mode, s.socket_group)
            server.bind()
            background.append(asyncio.create_task(server.serve(), name="control"))
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
            # What exists now (modules, settings, clients: ~34,000 objects) lives as long as the
            # daemon: out of the collector's sight, a full collection takes ~0.1 ms, not 5 ms of a
            # control reply's time.
            gc.freeze()
            systemd.notify(f"READY=1\nSTATUS=serving on {s.socket}")
            publish(DaemonReady(self.node_id, str(s.socket), tuple(self.etcd_endpoints), inventory.kind,
                                inventory.slots))  # fmt: skip
            crashed = asyncio.create_task(self._first_crash(background))
            stop = asyncio.create_task(self._stop.wait())
            await asyncio.wait({crashed, stop}, return_when=asyncio.FIRST_COMPLETED)
            code = 1 if crashed.done() else 0
            crashed.cancel()
            stop.cancel()
            await self._shutdown(server)
            return code
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            if self._observe is not None:
                await self._observe.close()  # before etcd closes: the last events are written
            self._final_cleanup()

    async def _first_crash(self, tasks: list[asyncio.Task[Any]]) -> None:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                _log.error("daemon.task_crashed", task=task.get_name(), error=repr(task.exception()))

    async def _shutdown(self, server: ControlServer) -> None:
        systemd.notify("STOPPING=1")
        await server.close()
        await self.manager.rt.zygotes.close()  # first: leaving jobs stop their zygotes, none is parked
        await self.manager.shutdown()
        self.manager.rt.limits.release()
        self.manager.rt.tracking.release()
        await self.registry.stop()
        if self._liveness is not None:
            await self._liveness.close()  # last: peers read our death only once we have left
        _log.info("daemon.stopped", node=self.node_id)

    def _final_cleanup(self) -> None:
        with contextlib.suppress(AttributeError):
            self.etcd.close()
            self._lease_etcd.close()
        if self._embedded is not None:
            self._embedded.stop()
        if self._reaper is not None:
            self._reaper.close()
        self._state.close()

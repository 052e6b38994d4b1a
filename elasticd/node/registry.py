"""This node's lease and its ``nodes/<node>`` record, and the fencing deadline that goes with them.

The record (host, address, inventory, free slots) lives under a lease kept alive every TTL/4. A
clean stop revokes the lease, so the key disappears at once; after a SIGKILL it expires within
the TTL.

Its presence in each job it takes part in (``presence/<job>/<node>``) lives under the same lease:
written before the node's first key of the job (``enter``), deleted once its agent has left
(``leave``), and written again with every new lease. Those keys, not ``nodes/``, are what a job's
agents read as its live nodes (``JobLease.alive``) and watch for a loss: the record is rewritten
at every admission, and watched by no one (``Keys.watched``).

Fencing: every successful keep-alive moves a local deadline to (time the request was sent + TTL -
margin), and the reaper sidecar learns it too. Past the deadline the lease may be gone and peers
may have moved on: multi-node workers must not run. The reaper enforces that even when this
daemon is frozen; the daemon itself notices when it runs again, tells the job manager
(``LeaseHooks.lost``, which stops those workers first) and registers anew with a fresh lease.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from elasticd import __version__, log
from elasticd.aio import wait_event
from elasticd.decode import DecodeError, decode, parse_json, report_invalid
from elasticd.errors import EtcdNoSpace, EtcdUnavailable
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.types import KeyValue, Put, Query
from elasticd.gpu.devices import Gpu
from elasticd.happenings.bus import publish
from elasticd.happenings.records import LeaseLost
from elasticd.node.hooks import LeaseHooks
from elasticd.rendezvous.model import DrainRecord
from elasticd.terms.ids import valid_job_id, valid_node_id
from elasticd.terms.state import GpuStatus
from elasticd.workers.proctree.reaper import Reaper

_log = log.get("elasticd.registry")

T = TypeVar("T")


@dataclass(frozen=True)
class InventoryRecord:
    kind: str = "cpu"
    slots: int = 0
    gpus: tuple[Gpu, ...] = ()


MAX_GPU_STATES = 512  # GPUs and MIG parents one record may describe
PRESENCE_KEYS = 64  # presences read one key each (etcd allows 128 ranges in one request); past it, all


@dataclass(frozen=True)
class GpuState:
    """One GPU as its node's record shows it (``manager/gpus.py``: ``GpuPool.states``)."""

    uuid: str
    state: str = GpuStatus.HEALTHY.value  # a ``GpuStatus`` value
    reason: str = ""
    memory_used_mib: int | None = None
    utilization_pct: int | None = None
    job: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class NodeRecord:
    """Value of ``nodes/<node>`` (see ``NodeRegistry.full_record``), as other nodes read it.

    Only ``node`` and ``slots`` are required; the rest has defaults so that records of other
    daemon versions still read (unknown fields are ignored, see ``elasticd.decode``).
    """

    node: str
    slots: int
    host: str = ""
    version: str = ""
    address: str = ""
    inventory: InventoryRecord = InventoryRecord()
    free_slots: int = 0
    free_devices: str = ""
    jobs: tuple[str, ...] = ()
    draining: bool = False
    gpu_states: tuple[GpuState, ...] = ()
    snapshot_bytes: int = 0  # the bound on each job's memory snapshots here (0: off)
    snapshot_source: str = ""  # "derived" or "set" (node/snapshotbound.py); "": an older daemon
    port_filter: str = ""  # portfilter.rules.Mode's value, "on" or "off"; "": an older daemon
    port_filter_detail: str = ""  # on: the identity it filters by ("uid"); off: why

    def __post_init__(self) -> None:
        if not valid_node_id(self.node):
            raise ValueError(f"node must be a node id, got {self.node[:80]!r}")
        if not 0 <= self.free_slots <= self.slots <= 1 << 20:
            raise ValueError("slots and free_slots must satisfy 0 <= free_slots <= slots")
        short = len(self.snapshot_source) <= 16 and len(self.port_filter_detail) <= 120
        if not 0 <= self.snapshot_bytes <= 1 << 62 or not short:
            raise ValueError("snapshot_bytes must be >= 0, snapshot_source and port_filter_detail short")
        if self.port_filter not in ("", "on", "off"):
            raise ValueError("port_filter must be on, off or empty")
        if not all(valid_job_id(j) for j in self.jobs):
            raise ValueError("jobs must be job ids")
        if len(self.gpu_states) > MAX_GPU_STATES:
            raise ValueError(f"gpu_states must be at most {MAX_GPU_STATES}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"jobs": list(self.jobs), "gpu_states": [asdict(g) for g in self.gpu_states]}

    def slots_for(self, mig: bool) -> int:
        """The slots a job could ever get here: MIG slices for a MIG job, else whole GPUs (or
        CPU slots on a host without GPUs)."""
        gpus = self.inventory.gpus
        if mig:
            return sum(len(g.mig) for g in gpus)
        return sum(1 for g in gpus if not g.mig) if gpus else self.slots


def parse_node(keys: Keys, kv: KeyValue) -> NodeRecord | None:
    """A ``nodes/<node>`` key as a record; None (reported once) if the key or value is bad.

    A bad record is skipped: the node it claims to describe is not counted as live, which is
    what its absence would mean too (its own daemon rewrites the record when its capacity moves).
    """
    name = kv.key[len(keys.nodes()) :]
    try:
        record = decode(NodeRecord, parse_json(kv.value))
        if record.node != name:
            raise DecodeError("node", f"is {record.node[:80]!r}, but the key names {name[:80]!r}")
        return record
    except DecodeError as exc:
        report_invalid(kv.key[len(keys.prefix) + 1 :], kv.mod_revision, str(exc), kind="node")
        return None


def parse_presences(keys: Keys, job_id: str, kvs: list[KeyValue]) -> frozenset[str]:
    """The nodes in ``job_id``, from its ``presence/<job>/`` keys (the key names the node; the value
    is not read). A key that does not parse is reported once and names no node."""
    nodes = set()
    for kv in kvs:
        try:
            ref = keys.parse(kv.key)
        except DecodeError as exc:
            report_invalid(keys.relative(kv.key), kv.mod_revision, str(exc), kind="presence")
            continue
        if ref.kind is KeyKind.PRESENCE and ref.job == job_id:
            nodes.add(ref.node)
    return frozenset(nodes)


def parse_node_drain(keys: Keys, kv: KeyValue) -> DrainRecord:
    """A ``drain/<node>`` key as a record. A bad value is reported once but still drains the node
    (with the job's own grace): the key's presence is the operator's intent."""
    try:
        return DrainRecord.from_json(parse_json(kv.value))
    except DecodeError as exc:
        report_invalid(kv.key[len(keys.prefix) + 1 :], kv.mod_revision, str(exc), kind="node_drain")
        return DrainRecord()


class NodeRegistry:
    def __init__(
        self,
        etcd: KV,
        keys: Keys,
        node_id: str,
        ttl_s: float,
        record: Callable[[], dict[str, Any]],
        reaper: Reaper,
        hooks: LeaseHooks | None = None,
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self.node_id = node_id
        self.ttl_s = ttl_s
        self._record = record
        self._reaper = reaper
        self.lease_id: int | None = None
        self.deadline = 0.0  # CLOCK_MONOTONIC
        self.renewals = 0  # keep-alives that extended the lease (the metrics endpoint reports it)
        self._hooks = hooks or LeaseHooks()
        self._dirty = asyncio.Event()
        self._published: dict[str, Any] | None = None  # the record as last written
        self._unpublished = False  # the last write of a changed record was refused (NOSPACE)
        self._jobs: set[str] = set()  # the jobs this node is in: their presences go with every lease
        self._stale: set[str] = set()  # jobs left whose presence is still to delete
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"lease-{node_id}")

    async def _lease_call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a lease call on the lease's own thread: calls of the jobs' agents, however slow or
        many, queue on the default executor and can never delay a keep-alive into a self-fence."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, functools.partial(fn, *args))

    @property
    def margin_s(self) -> float:
        return min(1.0, self.ttl_s * 0.2)

    def lease_valid(self) -> bool:
        return self.lease_id is not None and time.monotonic() < self.deadline

    # -- presence in jobs ----------------------------------------------------------------------------
    async def enter(self, job_id: str) -> None:
        """This node takes part in ``job_id``: write its presence under the lease now, before any
        other key of the node in the job (its peers read a node without one as gone). Without a
        lease it is written with the next (``_register``), before that lease is used. Raises
        ``EtcdUnavailable``: the node must not take part then."""
        self._jobs.add(job_id)
        self._stale.discard(job_id)
        lease = self.lease_id
        if lease is None:
            return
        try:
            await self._lease_call(self._etcd.put_json, self._keys.presence(job_id, self.node_id), {}, lease)
        except EtcdUnavailable:
            self.leave(job_id)
            raise

    def leave(self, job_id: str) -> None:
        """This node's agent has left ``job_id`` (its last keys written): delete its presence, at
        once on the lease's loop, and at every keep-alive after a failed attempt. (Its lease's end
        deletes it in any case.)"""
        self._jobs.discard(job_id)
        self._stale.add(job_id)
        self._dirty.set()

    async def present(self, job_id: str, among: frozenset[str] | None = None) -> frozenset[str]:
        """The nodes in ``job_id`` whose lease is alive, of ``among`` (None: all): their presence
        keys alone (none read for none asked about), or, for all or more than ``PRESENCE_KEYS``,
        one read of the job's presences, O(nodes in the job) whatever the size of the cluster."""
        if among is not None and len(among) <= PRESENCE_KEYS:
            if not among:
                return frozenset()
            queries = [Query(self._keys.presence(job_id, n)) for n in sorted(among)]
            found = await asyncio.to_thread(self._etcd.read_many, queries)
            kvs = [kv for f in found for kv in f.kvs]
        else:
            kvs = await asyncio.to_thread(self._etcd.get_prefix, self._keys.presences(job_id))
        nodes = parse_presences(self._keys, job_id, kvs)
        return nodes if among is None else nodes & among

    def in_job(self, job_id: str) -> JobLease:
        """The lease as one job's agent sees it (``agent.seams.Lease``)."""
        return JobLease(self, job_id)

    async def _forget_stale(self) -> None:
        for job_id in sorted(self._stale):
            if job_id not in self._jobs:  # (entered again meanwhile: its put comes after this)
                await self._lease_call(self._etcd.delete, self._keys.presence(job_id, self.node_id))
            self._stale.discard(job_id)

    def live_nodes(self) -> list[str]:
        """Nodes whose lease is alive (blocking: call from a thread)."""
        return [r.node for r in self.records()]

    def records(self) -> list[NodeRecord]:
        """The valid records of live nodes (blocking: call from a thread)."""
        kvs = self._etcd.get_prefix(self._keys.nodes())
        return [r for kv in kvs if (r := parse_node(self._keys, kv)) is not None]

    def full_record(self) -> dict[str, Any]:
        return {"node": self.node_id, "host": socket.gethostname(), "version": __version__} | self._record()

    def _extend(self, sent_at: float, ttl: float) -> None:
        self.deadline = sent_at + ttl - self.margin_s
        self._reaper.set_deadline(self.deadline)

    async def start(self) -> None:
        await self._register()

    async def _register(self) -> None:
        sent = time.monotonic()
        lease = await self._lease_call(self._etcd.grant_lease, self.ttl_s)
        record = self.full_record()
        jobs = set(self._jobs)
        puts = [Put(self._keys.node(self.node_id), record, lease)]
        puts += [Put(self._keys.presence(j, self.node_id), {}, lease) for j in sorted(jobs)]
        await self._lease_call(self._etcd.txn, [], puts)
        for job_id in sorted(self._jobs - jobs):  # entered while the lease was granted
            await self._lease_call(self._etcd.put_json, self._keys.presence(job_id, self.node_id), {}, lease)
        self._published = record
        self.lease_id = lease
        self._extend(sent, self.ttl_s)
        _log.info("lease.granted", node=self.node_id, lease=lease, ttl_s=self.ttl_s)
        self._hooks.granted()

    def _lost(self, why: str) -> None:
        publish(LeaseLost(self.node_id, self.lease_id, why))
        self.lease_id = None
        self._hooks.lost()

    def publish_soon(self) -> None:
        """Ask for the record to be re-published (free capacity changed)."""
        self._dirty.set()

    async def run(self) -> None:
        """Keep the lease alive every TTL/4, and re-publish the record only when it changed.

        (Publishing on every request would feed back: our own watch sees ``nodes/`` change and
        wakes the job scan, which asks to publish again.)"""
        interval = self.ttl_s / 4
        failing_since: float | None = None
        next_keepalive = time.monotonic() + interval
        while True:
            if failing_since is None:  # while failing, retry at once (after a short pause below)
                await wait_event(self._dirty, max(0.0, next_keepalive - time.monotonic()))
            self._dirty.clear()
            if self.lease_id is not None and time.monotonic() >= self.deadline:
                self._lost("deadline passed without a keep-alive")
            try:
                if self.lease_id is None:
                    await self._register()
                    failing_since = None
                    next_keepalive = time.monotonic() + interval
                    continue
                if time.monotonic() >= next_keepalive or failing_since is not None:
                    sent = time.monotonic()
                    remaining = await self._lease_call(self._etcd.refresh_lease, self.lease_id)
                    if remaining <= 0:
                        self._lost("etcd says the lease expired")
                        await self._register()
                        continue
                    self._extend(sent, remaining)
                    self.renewals += 1
                    next_keepalive = sent + interval
                await self._publish()
                if failing_since is not None:
                    _log.info(
                        "lease.refresh_ok",
                        node=self.node_id,
                        after_s=round(time.monotonic() - failing_since, 1),
                    )
                    failing_since = None
            except EtcdUnavailable as exc:
                if failing_since is None:
                    failing_since = time.monotonic()
                    _log.warning("lease.refresh_failed", node=self.node_id, error=str(exc))
                await asyncio.sleep(min(0.2, interval))  # retry soon: the deadline is near

    async def _publish(self) -> None:
        """Write the record if it changed. Under etcd's NOSPACE alarm the write is refused while
        keep-alives still work: the lease is fine, so this is no failure of it; the record is
        written at a later keep-alive, once etcd has room."""
        if self._stale:
            await self._forget_stale()
        record = self.full_record()
        if record == self._published:
            return
        try:
            await self._lease_call(self._etcd.put_json, self._keys.node(self.node_id), record, self.lease_id)
        except EtcdNoSpace as exc:
            if not self._unpublished:
                _log.warning("node.record_unpublished", node=self.node_id, error=str(exc))
            self._unpublished = True
            return
        self._published = record
        self._unpublished = False

    async def stop(self) -> None:
        if self.lease_id is not None:
            try:
                await self._lease_call(self._etcd.revoke_lease, self.lease_id)
                _log.info("lease.revoked", node=self.node_id, lease=self.lease_id)
            except EtcdUnavailable as exc:
                _log.warning("lease.revoke_failed", node=self.node_id, error=str(exc))
            self.lease_id = None
        self._thread.shutdown(wait=False)


@dataclass(frozen=True)
class JobLease:
    """This node's lease for one job's agent (``agent.seams.Lease``): the live nodes it is told of
    are the job's present ones, so an agent's read costs what its job's size does."""

    registry: NodeRegistry
    job_id: str

    @property
    def lease_id(self) -> int | None:
        return self.registry.lease_id

    def lease_valid(self) -> bool:
        return self.registry.lease_valid()

    async def alive(self, among: frozenset[str] | None = None) -> frozenset[str]:
        """The job's nodes whose lease is alive, of ``among`` (None: all)."""
        return await self.registry.present(self.job_id, among)

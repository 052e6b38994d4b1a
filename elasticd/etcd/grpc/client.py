"""The KV seam over grpc: etcd3's stubs on channels of our own, with the gateway client's failover,
re-login and error mapping (the package's doc says why a second backend)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from elasticd import log
from elasticd.errors import ConfigError, EtcdUnavailable
from elasticd.etcd import gateway as gw
from elasticd.etcd import versions
from elasticd.etcd.client import NO_AUTH, refused
from elasticd.etcd.gateway import Failure, GatewayError
from elasticd.etcd.grpc.proto import Channel, found, in_use, load, range_request, status_of
from elasticd.etcd.grpc.watch import Watch
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.transport import Endpoint, parse_endpoint, uses_tls
from elasticd.etcd.types import Compare, EtcdAuth, EtcdStatus, Found, KeyValue, Put, Query, WatchEvent
from elasticd.etcd.watch import OpenWatches

_log = log.get("elasticd.etcd")

T = TypeVar("T")


def _b(text: str) -> bytes:
    return text.encode()


class GrpcEtcdClient:
    """The ``KV`` protocol over grpc, with failover across endpoints and one fresh login per call
    (as ``EtcdClient``). Thread-safe: grpc channels are."""

    def __init__(
        self, endpoints: Sequence[str], auth: EtcdAuth | None = None, timeout_s: float = 5.0
    ) -> None:
        if not endpoints:
            raise ConfigError("at least one etcd endpoint is required")
        self._grpc, self._rpc = load()
        self._auth = auth or EtcdAuth()
        self.endpoints = [parse_endpoint(e) for e in endpoints]
        self._creds = self._credentials() if any(uses_tls(e, self._auth) for e in self.endpoints) else None
        self._timeout_s = timeout_s
        self._channels = [self._open(e) for e in self.endpoints]
        self._lock = threading.Lock()
        self._index = 0
        self._token: str | None = None
        self._watches = OpenWatches()
        self._splits_reads: dict[str, bool] = {}  # by endpoint: ``versions.splits_reads``

    def _credentials(self) -> Any:
        def read(path: Any) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        try:
            return self._grpc.ssl_channel_credentials(
                read(self._auth.ca), read(self._auth.key), read(self._auth.cert)
            )
        except OSError as exc:
            raise ConfigError(f"etcd TLS files (etcd_ca, etcd_cert, etcd_key) are unusable: {exc}") from exc

    def _open(self, e: Endpoint) -> Channel:
        if e.scheme == "unix":
            target = f"unix:{e.path}"
        else:
            target = f"[{e.host}]:{e.port}" if ":" in e.host else f"{e.host}:{e.port}"
        tls = uses_tls(e, self._auth)
        channel = (
            self._grpc.secure_channel(target, self._creds) if tls else self._grpc.insecure_channel(target)
        )
        rpc = self._rpc
        return Channel(e, channel, rpc.KVStub(channel), rpc.LeaseStub(channel), rpc.WatchStub(channel),
                        rpc.MaintenanceStub(channel), rpc.AuthStub(channel))  # fmt: skip

    # -- endpoints, login and errors ----------------------------------------------------------
    def _login(self, ch: Channel) -> str:
        request = self._rpc.AuthenticateRequest(name=self._auth.user, password=self._auth.password or "")
        try:
            return str(ch.auth.Authenticate(request, timeout=self._timeout_s).token)
        except self._grpc.RpcError as exc:
            error = status_of(exc)
            if gw.auth_disabled(error):
                return NO_AUTH
            raise error from exc

    def _current(self) -> tuple[int, Channel, str | None]:
        with self._lock:
            index, token = self._index, self._token
        ch = self._channels[index]
        if self._auth.user is not None and token is None:
            token = self._login(ch)
            with self._lock:
                if self._index == index:
                    self._token = token
        return index, ch, token

    def _fail_over(self, failed: int) -> None:
        with self._lock:
            if self._index == failed and len(self._channels) > 1:
                self._index = (failed + 1) % len(self._channels)
                self._token = None

    def call(self, op: Callable[[Channel, Any], T]) -> T:
        """``op(channel, metadata)`` with failover and one fresh login; every failure mapped."""
        last: Exception | None = None
        relogged = False
        attempts = 0
        while attempts < len(self._channels):
            index, token = self._index, None
            try:
                index, ch, token = self._current()
                return op(ch, (("token", token),) if token else None)
            except self._grpc.RpcError as exc:
                error = status_of(exc)
            except GatewayError as exc:
                error = exc
            if error.failure is Failure.UNAUTHENTICATED and self._auth.user is not None and not relogged:
                relogged = True  # etcd forgot the token (a restart, its TTL): log in again
                with self._lock:
                    self._token = None if self._token == token else self._token
                continue
            if error.failure is not Failure.UNREACHABLE:
                raise refused(error) from error
            last = error
            self._fail_over(index)
            attempts += 1
        where = ",".join(str(e) for e in self.endpoints)
        raise EtcdUnavailable(f"etcd is unreachable at {where} (grpc): {last}") from last

    def close(self) -> None:
        self._watches.close_all()
        for ch in self._channels:
            ch.channel.close()

    # -- requests -----------------------------------------------------------------------------
    def _range(self, q: Query) -> Any:
        return range_request(self._rpc, q)

    def _unary(self, stub: str, method: str, request: Any) -> Any:
        return self.call(
            lambda ch, md: getattr(getattr(ch, stub), method)(request, timeout=self._timeout_s, metadata=md)
        )

    def get(self, key: str) -> KeyValue | None:
        kvs = self.read_many([Query(key)])[0].kvs
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        return self.read_many([Query(prefix, prefix=True)])[0].kvs

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        """Several ranges at one revision: a transaction of ranges, or pinned ranges where the
        server's version cannot take one safely (``elasticd.etcd.versions``)."""
        if not queries:
            return []
        return self.call(lambda ch, md: self._read_many_on(ch, md, queries))

    def _read_many_on(self, ch: Channel, md: Any, queries: Sequence[Query]) -> list[Found]:
        def get(q: Query, revision: int = 0) -> Any:
            request = range_request(self._rpc, q, revision)
            return ch.kv.Range(request, timeout=self._timeout_s, metadata=md)

        if len(queries) > 1 and not self._splits(ch, md):
            ops = [self._rpc.RequestOp(request_range=self._range(q)) for q in queries]
            answer = ch.kv.Txn(self._rpc.TxnRequest(success=ops), timeout=self._timeout_s, metadata=md)
            return [found(r.response_range, int(answer.header.revision)) for r in answer.responses]
        for _ in range(versions.RESTARTS):
            first = get(queries[0])
            revision = int(first.header.revision)
            try:
                rest = [get(q, revision) for q in queries[1:]]
            except self._grpc.RpcError as exc:
                error = status_of(exc)
                if versions.pinned_compacted(error.code, error.message):
                    continue
                raise
            return [found(r, revision) for r in (first, *rest)]
        raise GatewayError(Failure.REFUSED, "a read's revision was compacted each time it was read")

    def _splits(self, ch: Channel, md: Any) -> bool:
        where = str(ch.endpoint)
        known = self._splits_reads.get(where)
        if known is None:
            version = self._version(ch, md)  # None: status is for etcd's admins
            known = self._splits_reads[where] = version is None or versions.splits_reads(version)
            _log.info("etcd.version", endpoint=where, version=version or "unknown", pinned_reads=known)
        return known

    def _version(self, ch: Channel, md: Any) -> str | None:
        try:
            status = ch.maintenance.Status(self._rpc.StatusRequest(), timeout=self._timeout_s, metadata=md)
        except self._grpc.RpcError as exc:
            if status_of(exc).failure is Failure.DENIED:
                return None
            raise
        return str(status.version)[:64]

    def put_json(self, key: str, value: Any, lease: int | None = None) -> None:
        self._unary("kv", "Put", self._put(Put(key, value, lease)))

    def _put(self, p: Put) -> Any:
        value = json.dumps(p.value, separators=(",", ":")).encode()
        return self._rpc.PutRequest(key=_b(p.key), value=value, lease=p.lease or 0)

    def _compare(self, c: Compare) -> Any:
        rpc = self._rpc
        if c.target == "create":
            return rpc.Compare(key=_b(c.key), target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                               create_revision=c.revision)  # fmt: skip
        if c.target == "lease":
            return rpc.Compare(key=_b(c.key), target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL,
                               lease=c.revision)  # fmt: skip
        return rpc.Compare(
            key=_b(c.key), target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=c.revision
        )

    def _delete(self, d: str | Query) -> Any:
        q = d if isinstance(d, Query) else Query(d)
        request = self._rpc.DeleteRangeRequest(key=_b(q.key))
        if q.prefix:
            request.range_end = _b(prefix_end(q.key))
        elif q.end is not None:
            request.range_end = _b(q.end)
        return request

    def txn(
        self, compare: Sequence[Compare], puts: Sequence[Put], deletes: Sequence[str | Query] = ()
    ) -> bool:
        rpc = self._rpc
        success = [rpc.RequestOp(request_put=self._put(p)) for p in puts]
        success += [rpc.RequestOp(request_delete_range=self._delete(d)) for d in deletes]
        request = rpc.TxnRequest(compare=[self._compare(c) for c in compare], success=success)
        return bool(self._unary("kv", "Txn", request).succeeded)

    def write_and_read(
        self,
        compare: Sequence[Compare],
        puts: Sequence[Put],
        deletes: Sequence[str | Query],
        reads: Sequence[Query],
    ) -> list[Found] | None:
        rpc = self._rpc
        success = [rpc.RequestOp(request_put=self._put(p)) for p in puts]
        success += [rpc.RequestOp(request_delete_range=self._delete(d)) for d in deletes]
        success += [rpc.RequestOp(request_range=self._range(q)) for q in reads]
        request = rpc.TxnRequest(compare=[self._compare(c) for c in compare], success=success)
        answer = self._unary("kv", "Txn", request)
        if not answer.succeeded:
            return None
        return [found(r.response_range) for r in answer.responses[len(answer.responses) - len(reads) :]]

    def create_json(self, key: str, value: Any, lease: int | None = None) -> bool:
        return self.txn([Compare(key, "create", 0)], [Put(key, value, lease)])

    def delete(self, key: str) -> bool:
        return int(self._unary("kv", "DeleteRange", self._delete(key)).deleted) > 0

    def delete_prefix(self, prefix: str) -> None:
        self._unary("kv", "DeleteRange", self._delete(Query(prefix, prefix=True)))

    # -- watches ------------------------------------------------------------------------------
    def watch_range(
        self,
        start: str,
        end: str,
        on_change: Callable[[str, bool], None],
        on_broken: Callable[[], None],
        deletes_only: bool = False,
    ) -> Callable[[], None]:
        filters = [self._rpc.WatchCreateRequest.NOPUT] if deletes_only else []
        create = self._rpc.WatchRequest(
            create_request=self._rpc.WatchCreateRequest(key=_b(start), range_end=_b(end), filters=filters)
        )
        return self._open_watch(create, on_change, on_broken, whole=False)

    def watch_from(
        self,
        start: str,
        end: str,
        revision: int,
        on_events: Callable[[list[WatchEvent]], None],
        on_broken: Callable[[], None],
    ) -> Callable[[], None]:
        """``watch_range`` from ``revision``, each change whole (``KV.watch_from``)."""
        create = self._rpc.WatchRequest(
            create_request=self._rpc.WatchCreateRequest(
                key=_b(start), range_end=_b(end), start_revision=revision
            )
        )
        return self._open_watch(create, on_events, on_broken, whole=True)

    def _open_watch(
        self,
        create: Any,
        on_change: Callable[[str, bool], None] | Callable[[list[WatchEvent]], None],
        on_broken: Callable[[], None],
        whole: bool,
    ) -> Callable[[], None]:
        def op(ch: Channel, md: Any) -> Callable[[], None]:
            stream = Watch(self._grpc, ch, create, md, on_change, on_broken, whole)
            stream.wait_created(self._timeout_s)
            return stream.cancel

        cancel = self.call(op)
        return self._watches.track(cancel)

    def watch_prefix(
        self, prefix: str, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        return self.watch_range(prefix, prefix_end(prefix), on_change, on_broken)

    # -- leases -------------------------------------------------------------------------------
    def grant_lease(self, ttl_s: float) -> int:
        answer = self._unary("lease", "LeaseGrant", self._rpc.LeaseGrantRequest(TTL=max(1, round(ttl_s))))
        if answer.error:
            raise EtcdUnavailable(f"etcd refused the lease: {answer.error[:200]}")
        return int(answer.ID)

    def refresh_lease(self, lease_id: int) -> int:
        """One keep-alive on the stream, its answer (TTL 0: the lease is gone), and the stream closed."""
        request = self._rpc.LeaseKeepAliveRequest(ID=lease_id)

        def op(ch: Channel, md: Any) -> int:
            for answer in ch.lease.LeaseKeepAlive(iter([request]), timeout=self._timeout_s, metadata=md):
                return int(answer.TTL)
            return 0

        return self.call(op)

    def revoke_lease(self, lease_id: int) -> None:
        request = self._rpc.LeaseRevokeRequest(ID=lease_id)

        def op(ch: Channel, md: Any) -> None:
            try:
                ch.lease.LeaseRevoke(request, timeout=self._timeout_s, metadata=md)
            except self._grpc.RpcError as exc:
                if status_of(exc).code != gw.NOT_FOUND:
                    raise

        self.call(op)

    # -- health -------------------------------------------------------------------------------
    def status(self) -> EtcdStatus | None:
        rpc = self._rpc
        get = rpc.AlarmRequest(action=rpc.AlarmRequest.GET)

        def op(ch: Channel, md: Any) -> EtcdStatus | None:
            try:
                status = ch.maintenance.Status(rpc.StatusRequest(), timeout=self._timeout_s, metadata=md)
                alarms = ch.maintenance.Alarm(get, timeout=self._timeout_s, metadata=md)
            except self._grpc.RpcError as exc:
                if status_of(exc).failure is Failure.DENIED:
                    return None
                raise
            names = rpc.AlarmMember.DESCRIPTOR.fields_by_name["alarm"].enum_type.values_by_number
            raised = {names[a.alarm].name if a.alarm in names else f"ALARM{a.alarm}" for a in alarms.alarms}
            raised.discard("NONE")
            return EtcdStatus(
                int(status.dbSize), in_use(status), int(status.header.revision), tuple(sorted(raised))
            )

        return self.call(op)

    def compact(self, revision: int) -> None:
        request = self._rpc.CompactionRequest(revision=revision, physical=False)

        def op(ch: Channel, md: Any) -> None:
            try:
                ch.kv.Compact(request, timeout=self._timeout_s, metadata=md)
            except self._grpc.RpcError as exc:
                error = status_of(exc)
                if not (error.code == gw.OUT_OF_RANGE and gw.COMPACTED_TEXT in error.message):
                    raise

        self.call(op)

    def health(self) -> str:
        def op(ch: Channel, md: Any) -> str:
            return self._version(ch, md) or "unknown (status is reserved to etcd admins)"

        return self.call(op)

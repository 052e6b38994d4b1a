"""etcd over grpc (``etcd_client = grpc``): the KV seam through the ``etcd3`` package's v3 API.

Why a second backend beside the JSON gateway (``etcd.client``, the default): etcd's gateway
cannot map a client certificate's CN to an etcd user (etcd-io/etcd#10392), which is how most
production clusters (Kubernetes' among them) identify clients, and some clusters turn the gateway
off. Over grpc, a client certificate with a CN *is* the etcd user, no password needed. The price
is the idle footprint (``bench/bench_footprint.py``: grpc's event-engine threads, ~30 MB more
RSS), which is why it is not the default.

What it uses of ``etcd3`` (0.12): the generated v3 API (``etcd3.etcdrpc``: messages and stubs) on
a channel of our own, so that every request can say what the seam needs (``count_only``,
``limit``, ``min_mod_revision`` and sorts inside one read-only transaction) and so that UNIX
endpoints (the embedded etcd) and several endpoints with failover work as with the gateway client.
etcd3's generated code predates protobuf 4 and needs protobuf's pure-Python implementation, a
process-wide setting read when protobuf is first imported: ``_load`` sets it for that import only,
and only here, so the gateway path and every process the daemon starts never see it.

Errors map as the gateway's do: a grpc status is the same v3 status code the gateway reports, so
``gateway.status_error`` names the ``Failure`` and ``client.refused`` our error.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from elasticd import log
from elasticd.errors import ConfigError, EtcdUnavailable
from elasticd.etcd import gateway as gw
from elasticd.etcd.client import NO_AUTH, refused
from elasticd.etcd.gateway import Failure, GatewayError
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.transport import Endpoint, parse_endpoint, uses_tls
from elasticd.etcd.types import Compare, EtcdAuth, EtcdStatus, Found, KeyValue, Put, Query

_log = log.get("elasticd.etcd")

T = TypeVar("T")
PB_ENV = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"
JOIN_S = 5.0
DB_SIZE_IN_USE_FIELD = 9  # StatusResponse.dbSizeInUse (etcd >= 3.4), newer than etcd3's protos


def _load() -> tuple[Any, Any]:
    """``grpc`` and ``etcd3.etcdrpc``, with protobuf's pure-Python implementation for this import
    (the environment is as it was afterwards: processes we start do not inherit the setting)."""
    had = os.environ.get(PB_ENV)
    os.environ[PB_ENV] = "python"
    try:
        with warnings.catch_warnings():  # etcd3's generated code uses descriptor calls protobuf deprecates
            warnings.simplefilter("ignore", DeprecationWarning)
            grpc = importlib.import_module("grpc")
            rpc = importlib.import_module("etcd3.etcdrpc")
    except ImportError as exc:
        raise ConfigError(
            f"etcd_client = grpc needs the grpc extra (pip install 'elasticd[grpc]'): {exc}"
        ) from exc
    except TypeError as exc:  # protobuf was imported before, with its C implementation
        raise ConfigError(
            f"etcd_client = grpc: etcd3's protobuf code cannot load in this process: {exc}"
        ) from exc
    finally:
        if had is None:
            os.environ.pop(PB_ENV, None)
        else:
            os.environ[PB_ENV] = had
    return grpc, rpc


def _b(text: str) -> bytes:
    return text.encode()


def status_of(grpc_error: Any) -> GatewayError:
    """A failed call's grpc status, as the gateway's mapping names it."""
    try:
        code, details = grpc_error.code().value[0], grpc_error.details()
    except Exception:  # not a call's error (a channel that never connected says less)
        return GatewayError(Failure.UNREACHABLE, str(grpc_error) or type(grpc_error).__name__)
    return gw.status_error(code, details)


@dataclass
class _Channel:
    """One endpoint's channel and the stubs on it."""

    endpoint: Endpoint
    channel: Any
    kv: Any
    lease: Any
    watch: Any
    maintenance: Any
    auth: Any


class GrpcEtcdClient:
    """The ``KV`` protocol over grpc, with failover across endpoints and one fresh login per call
    (as ``EtcdClient``). Thread-safe: grpc channels are."""

    def __init__(
        self, endpoints: Sequence[str], auth: EtcdAuth | None = None, timeout_s: float = 5.0
    ) -> None:
        if not endpoints:
            raise ConfigError("at least one etcd endpoint is required")
        self._grpc, self._rpc = _load()
        self._auth = auth or EtcdAuth()
        self.endpoints = [parse_endpoint(e) for e in endpoints]
        self._creds = self._credentials() if any(uses_tls(e, self._auth) for e in self.endpoints) else None
        self._timeout_s = timeout_s
        self._channels = [self._open(e) for e in self.endpoints]
        self._lock = threading.Lock()
        self._index = 0
        self._token: str | None = None
        self._watches: set[Callable[[], None]] = set()

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

    def _open(self, e: Endpoint) -> _Channel:
        if e.scheme == "unix":
            target = f"unix:{e.path}"
        else:
            target = f"[{e.host}]:{e.port}" if ":" in e.host else f"{e.host}:{e.port}"
        tls = uses_tls(e, self._auth)
        channel = (
            self._grpc.secure_channel(target, self._creds) if tls else self._grpc.insecure_channel(target)
        )
        rpc = self._rpc
        return _Channel(e, channel, rpc.KVStub(channel), rpc.LeaseStub(channel), rpc.WatchStub(channel),
                        rpc.MaintenanceStub(channel), rpc.AuthStub(channel))  # fmt: skip

    # -- endpoints, login and errors ----------------------------------------------------------
    def _login(self, ch: _Channel) -> str:
        request = self._rpc.AuthenticateRequest(name=self._auth.user, password=self._auth.password or "")
        try:
            return str(ch.auth.Authenticate(request, timeout=self._timeout_s).token)
        except self._grpc.RpcError as exc:
            error = status_of(exc)
            if gw.auth_disabled(error):
                return NO_AUTH
            raise error from exc

    def _current(self) -> tuple[int, _Channel, str | None]:
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

    def call(self, op: Callable[[_Channel, Any], T]) -> T:
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
        with self._lock:
            watches, self._watches = list(self._watches), set()
        for cancel in watches:
            cancel()
        for ch in self._channels:
            ch.channel.close()

    # -- requests -----------------------------------------------------------------------------
    def _range(self, q: Query) -> Any:
        rpc = self._rpc
        request = rpc.RangeRequest(key=_b(q.key))
        if q.prefix:
            request.range_end = _b(prefix_end(q.key))
        elif q.end is not None:
            request.range_end = _b(q.end)
        if q.oldest_only:
            request.sort_order, request.sort_target, request.limit = (
                rpc.RangeRequest.ASCEND, rpc.RangeRequest.CREATE, 1
            )  # fmt: skip
        elif q.first_only:
            request.limit = 1
        request.count_only = q.count_only
        request.min_mod_revision = q.min_mod_revision
        return request

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
        if not queries:
            return []
        ops = [self._rpc.RequestOp(request_range=self._range(q)) for q in queries]
        answer = self._unary("kv", "Txn", self._rpc.TxnRequest(success=ops))
        return [_found(r.response_range) for r in answer.responses]

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

    def create_json(self, key: str, value: Any, lease: int | None = None) -> bool:
        return self.txn([Compare(key, "create", 0)], [Put(key, value, lease)])

    def delete(self, key: str) -> bool:
        return int(self._unary("kv", "DeleteRange", self._delete(key)).deleted) > 0

    def delete_prefix(self, prefix: str) -> None:
        self._unary("kv", "DeleteRange", self._delete(Query(prefix, prefix=True)))

    # -- watches ------------------------------------------------------------------------------
    def watch_range(
        self, start: str, end: str, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        create = self._rpc.WatchRequest(
            create_request=self._rpc.WatchCreateRequest(key=_b(start), range_end=_b(end))
        )

        def op(ch: _Channel, md: Any) -> Callable[[], None]:
            stream = _Watch(self._grpc, ch, create, md, on_change, on_broken)
            stream.wait_created(self._timeout_s)
            return stream.cancel

        cancel = self.call(op)
        with self._lock:
            self._watches.add(cancel)

        def stop() -> None:
            with self._lock:
                self._watches.discard(cancel)
            cancel()

        return stop

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

        def op(ch: _Channel, md: Any) -> int:
            for answer in ch.lease.LeaseKeepAlive(iter([request]), timeout=self._timeout_s, metadata=md):
                return int(answer.TTL)
            return 0

        return self.call(op)

    def revoke_lease(self, lease_id: int) -> None:
        request = self._rpc.LeaseRevokeRequest(ID=lease_id)

        def op(ch: _Channel, md: Any) -> None:
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

        def op(ch: _Channel, md: Any) -> EtcdStatus | None:
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
                int(status.dbSize), _in_use(status), int(status.header.revision), tuple(sorted(raised))
            )

        return self.call(op)

    def compact(self, revision: int) -> None:
        request = self._rpc.CompactionRequest(revision=revision, physical=False)

        def op(ch: _Channel, md: Any) -> None:
            try:
                ch.kv.Compact(request, timeout=self._timeout_s, metadata=md)
            except self._grpc.RpcError as exc:
                error = status_of(exc)
                if not (error.code == gw.OUT_OF_RANGE and gw.COMPACTED_TEXT in error.message):
                    raise

        self.call(op)

    def health(self) -> str:
        def op(ch: _Channel, md: Any) -> str:
            try:
                return str(
                    ch.maintenance.Status(
                        self._rpc.StatusRequest(), timeout=self._timeout_s, metadata=md
                    ).version
                )[:64]
            except self._grpc.RpcError as exc:
                if status_of(exc).failure is Failure.DENIED:
                    return "unknown (status is reserved to etcd admins)"
                raise

        return self.call(op)


def _found(r: Any) -> Found:
    kvs = [KeyValue(kv.key.decode("utf-8", "replace"), bytes(kv.value), int(kv.create_revision),
                    int(kv.mod_revision), int(kv.lease)) for kv in r.kvs]  # fmt: skip
    return Found(kvs, int(r.count))


def _in_use(status: Any) -> int:
    """``dbSizeInUse``, which etcd >= 3.4 sends and etcd3's older protos keep as an unknown field
    (0, "not said", when it cannot be read)."""
    try:
        unknown = importlib.import_module("google.protobuf.unknown_fields")
        for f in unknown.UnknownFieldSet(status):
            if f.field_number == DB_SIZE_IN_USE_FIELD and isinstance(f.data, int):
                return max(0, f.data)
    except Exception:  # an older protobuf without the module: the member's size in use is not said
        pass
    return 0


class _Watch:
    """One watch stream, read by one thread (``etcd-watch``); cancel and delivery take one lock,
    so no callback runs once ``cancel`` returned (a callback may itself cancel)."""

    def __init__(
        self,
        grpc: Any,
        ch: _Channel,
        create: Any,
        metadata: Any,
        on_change: Callable[[str, bool], None],
        on_broken: Callable[[], None],
    ) -> None:
        self._grpc = grpc
        self._on_change = on_change
        self._on_broken = on_broken
        self._lock = threading.RLock()
        self._over = False
        self._done = threading.Event()  # the request stream may end (cancel)
        self._created = threading.Event()
        self._error: GatewayError | None = None
        self._call = ch.watch.Watch(self._requests(create), metadata=metadata)
        self._thread = threading.Thread(target=self._read, name="etcd-watch", daemon=True)
        self._thread.start()

    def _requests(self, create: Any) -> Iterator[Any]:
        yield create
        self._done.wait()

    def wait_created(self, timeout_s: float) -> None:
        if not self._created.wait(timeout_s):
            self.cancel()
            raise GatewayError(Failure.UNREACHABLE, f"no answer to a watch within {timeout_s} s")
        if self._error is not None:
            self.cancel()
            raise self._error

    def cancel(self) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
        self._done.set()
        self._call.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(JOIN_S)

    def _read(self) -> None:
        why = "etcd ended the stream"
        try:
            for answer in self._call:
                if not self._created.is_set() and (answer.canceled or not answer.created):
                    self._error = gw.watch_canceled(answer.cancel_reason or "the watch was not created")
                    return
                self._created.set()
                for event in answer.events:
                    self._deliver(event.kv.key.decode("utf-8", "replace"), event.type == 1)  # 1: DELETE
                if answer.canceled:
                    why = f"etcd canceled the watch: {answer.cancel_reason or answer.compact_revision}"
                    break
        except self._grpc.RpcError as exc:
            self._error = status_of(exc)
            why = self._error.message
        finally:
            self._done.set()
            if not self._created.is_set():  # never created: the opener raises, nothing is broken
                self._error = self._error or GatewayError(Failure.UNREACHABLE, why)
                self._created.set()
                return  # noqa: B012  (the opener reports it; no on_broken for a watch never made)
        self._broken(why)

    def _deliver(self, key: str, deleted: bool) -> None:
        with self._lock:
            if self._over:
                return
            try:
                self._on_change(key, deleted)
            except Exception:  # a watcher's bug: logged; the stream and later events carry on
                _log.exception("watch.callback_failed", key=key)

    def _broken(self, why: str) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
            _log.info("watch.broken", why=why)
            try:
                self._on_broken()
            except Exception:
                _log.exception("watch.callback_failed", key=None)

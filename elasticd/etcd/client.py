"""A thread-safe etcd v3 client over etcd's JSON gateway (HTTP/1.1), with failover and our own errors.

Why not grpc by default (the idle footprint): the grpc client (etcd3 0.12 on grpcio, with the
pure-Python protobuf that etcd3's old generated code needs) was most of the idle daemon's cost:
4 grpc event-engine threads waking ~40 times a second, grpc's channel-spin thread every 200 ms
(a compile-time constant), and ~33 MB of RSS for ``import grpc`` + etcd3 + protobuf (importing
this module cost 44 MB against 10.6 MB for a bare interpreter). etcd >= 3.4 serves the same v3
API as JSON over HTTP on the client port (and on the embedded etcd's UNIX socket), so a client
of the standard library's ``http.client`` does the same job: calls are plain POSTs on a few
keep-alive connections, and each watch is one streaming response read by one thread that
sleeps in ``recv`` until something changes. The wire format is ``elasticd.etcd.gateway``; the
connections are ``elasticd.etcd.transport``; watches are ``elasticd.etcd.watch``.

Backend contract: every write that must not race uses a transaction whose compare is on
``create_revision`` (absent == 0) or ``mod_revision``; those revisions are the fencing tokens.

Identity: with etcd auth on, the gateway refuses a client certificate that has a subject CN (it
could not pass the CN on as the user; etcd-io/etcd#10392), so the certificate only proves that
we may connect (mutual TLS) and the etcd user comes from a password login
(``/v3/auth/authenticate``), whose token goes in the ``Authorization`` header. etcd forgets a
token when it restarts or after its TTL: on "invalid auth token" the call logs in again, once.
A user configured before ``etcdctl auth enable`` works too: while etcd says auth is off, calls go
without a token (logged once), and a denial then means auth came on: the call logs in, once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from elasticd import log
from elasticd.errors import ConfigError, EtcdNoSpace, EtcdUnavailable
from elasticd.etcd import gateway as gw
from elasticd.etcd import versions
from elasticd.etcd.gateway import Failure, GatewayError
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.transport import ConnectionLost, Endpoint, Transport, parse_endpoint, tls_context, uses_tls
from elasticd.etcd.types import Compare, EtcdAuth, EtcdStatus, Found, KeyValue, Put, Query, WatchEvent
from elasticd.etcd.watch import OpenWatches, open_watch

_log = log.get("elasticd.etcd")

T = TypeVar("T")
Op = Callable[[Transport, str | None], T]
NO_AUTH = ""  # the token while etcd's auth is off: no Authorization header


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def refused(exc: GatewayError) -> EtcdUnavailable:
    """Our error for an answer that another endpoint would give as well (no failover)."""
    if exc.failure is Failure.DENIED:
        # RBAC said no. Every member enforces the same roles, and "unreachable" would send an
        # operator after the network.
        return EtcdUnavailable(
            f"etcd denied the request (permission denied): the etcd user of this daemon has no role "
            f"that allows it on this key range: {exc.message}"
        )
    if exc.failure is Failure.CN_CERT:
        return EtcdUnavailable(
            "etcd refused our client certificate because it has a subject CN, which etcd's HTTP "
            "gateway cannot use as the user while auth is on: client certificates must have an "
            f"empty subject CN; use etcd_user/etcd_password_file for identity ({exc.message})"
        )
    if exc.failure is Failure.UNAUTHENTICATED:
        return EtcdUnavailable(f"etcd did not accept our auth token after a fresh login: {exc.message}")
    if exc.failure is Failure.NO_SPACE:
        return EtcdNoSpace(
            f"etcd refused a write: its database is at its quota (NOSPACE alarm): {exc.message}; an "
            "operator compacts and defragments etcd, then runs `etcdctl alarm disarm`"
        )
    return EtcdUnavailable(f"etcd refused the request: {exc.message}")


class EtcdClient:
    """Calls go to the current endpoint; on a connection failure we move to the next one and retry,
    and only when every endpoint has failed once does the call raise ``EtcdUnavailable``."""

    def __init__(
        self, endpoints: Sequence[str], auth: EtcdAuth | None = None, timeout_s: float = 5.0
    ) -> None:
        if not endpoints:
            raise ConfigError("at least one etcd endpoint is required")
        self.endpoints: list[Endpoint] = [parse_endpoint(e) for e in endpoints]
        self._auth = auth or EtcdAuth()
        tls = [uses_tls(e, self._auth) for e in self.endpoints]
        context = tls_context(self._auth) if any(tls) else None
        self._transports = [
            Transport(e, context if t else None, timeout_s) for e, t in zip(self.endpoints, tls, strict=True)
        ]
        self._lock = threading.Lock()
        self._index = 0
        self._token: str | None = None  # of the current endpoint (simple tokens are per member)
        self._watches = OpenWatches()
        self._warned_auth_off = False
        self._splits_reads: dict[str, bool] = {}  # by endpoint: ``versions.splits_reads``

    # -- endpoints, login and errors: the one place ---------------------------------------------
    def _current(self) -> tuple[int, Transport, str | None]:
        with self._lock:
            index, token = self._index, self._token
        transport = self._transports[index]
        if self._auth.user is not None and token is None:
            token = self._login(transport)
            with self._lock:
                if self._index == index:
                    self._token = token
        return index, transport, token

    def _login(self, transport: Transport) -> str:
        body = {"name": self._auth.user, "password": self._auth.password or ""}
        try:
            return gw.parse_token(transport.post("/v3/auth/authenticate", _encode(body), None))
        except GatewayError as exc:
            if not gw.auth_disabled(exc):
                raise
        if not self._warned_auth_off:
            self._warned_auth_off = True
            _log.warning(
                "etcd.auth_off",
                endpoint=str(transport.endpoint),
                user=self._auth.user,
                consequence="requests go without a user: anyone who may connect may write",
            )
        return NO_AUTH

    def _fail_over(self, failed_index: int) -> None:
        """Drop the failed endpoint's idle connections and move to the next endpoint (unless
        another thread already did). Calls in flight on it fail over on their own."""
        self._transports[failed_index].close()
        with self._lock:
            if self._index == failed_index and len(self._transports) > 1:
                self._index = (failed_index + 1) % len(self._transports)
                self._token = None

    def _forget_token(self, token: str | None) -> None:
        with self._lock:
            if self._token == token:
                self._token = None

    def call(self, op: Op[T]) -> T:
        """Run ``op(transport, token)`` with failover and one fresh login; maps every failure."""
        last: Exception | None = None
        relogged = False
        attempts = 0
        while attempts < len(self._transports):
            index, token = self._index, None
            try:
                index, transport, token = self._current()
                return op(transport, token)
            except ConnectionLost as exc:
                last = exc
            except GatewayError as exc:
                stale = exc.failure is Failure.UNAUTHENTICATED or (
                    exc.failure is Failure.DENIED and token == NO_AUTH  # auth came on since
                )
                if stale and self._auth.user is not None and not relogged:
                    relogged = True  # etcd forgot the token (a restart, its TTL): log in again
                    self._forget_token(token)
                    continue
                if exc.failure is not Failure.UNREACHABLE:
                    raise refused(exc) from exc
                last = exc
            self._fail_over(index)
            attempts += 1
        where = ",".join(str(e) for e in self.endpoints)
        raise EtcdUnavailable(f"etcd is unreachable at {where}: {last}") from last

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        return self.call(lambda t, token: t.post(path, data, token))

    def close(self) -> None:
        """Cancel the watches still open and close the idle connections."""
        self._watches.close_all()
        for transport in self._transports:
            transport.close()

    # -- key/value ---------------------------------------------------------------------------
    def _range(self, q: Query) -> Found:
        return gw.parse_range_answer(self._post("/v3/kv/range", gw.range_request(q)))

    def get(self, key: str) -> KeyValue | None:
        kvs = self._range(Query(key)).kvs
        return kvs[0] if kvs else None

    def get_json(self, key: str) -> Any:
        kv = self.get(key)
        return None if kv is None else kv.json()

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        return self._range(Query(prefix, prefix=True)).kvs

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        """Several ranges at one revision: a transaction of ranges, or pinned ranges where the
        server's version cannot take one safely (``elasticd.etcd.versions``)."""
        if len(queries) <= 1:
            return [self._range(q) for q in queries]
        return self.call(lambda t, token: self._read_many_on(t, token, queries))

    def _read_many_on(self, t: Transport, token: str | None, queries: Sequence[Query]) -> list[Found]:
        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            return t.post(path, _encode(body), token)

        if not self._splits(t, token):
            return gw.parse_read_many(post("/v3/kv/txn", gw.read_many_request(queries)), len(queries))
        for _ in range(versions.RESTARTS):
            first = gw.parse_range_answer(post("/v3/kv/range", gw.range_request(queries[0])))
            try:
                rest = [post("/v3/kv/range", gw.range_request(q, first.revision)) for q in queries[1:]]
            except GatewayError as exc:
                if versions.pinned_compacted(exc.code, exc.message):
                    continue
                raise
            return [first, *(replace(gw.parse_range(r), revision=first.revision) for r in rest)]
        raise GatewayError(Failure.REFUSED, "a read's revision was compacted each time it was read")

    def _splits(self, t: Transport, token: str | None) -> bool:
        where = str(t.endpoint)
        known = self._splits_reads.get(where)
        if known is None:
            try:
                version = gw.parse_version(t.post("/v3/maintenance/status", b"{}", token))
            except GatewayError as exc:
                if exc.failure is not Failure.DENIED:
                    raise
                version = ""  # status is for etcd's admins: pinned ranges are right on every version
            known = self._splits_reads[where] = versions.splits_reads(version)
            _log.info("etcd.version", endpoint=where, version=version or "unknown", pinned_reads=known)
        return known

    def put_json(self, key: str, value: Any, lease: int | None = None) -> None:
        self._post("/v3/kv/put", gw.put_request(key, _encode(value), lease))

    def create_json(self, key: str, value: Any, lease: int | None = None) -> bool:
        """Write ``key`` only if it does not exist; True when we created it."""
        return self.txn([Compare(key, "create", 0)], [Put(key, value, lease)])

    def txn(
        self, compare: Sequence[Compare], puts: Sequence[Put], deletes: Sequence[str | Query] = ()
    ) -> bool:
        """All-or-nothing: when every comparison holds, apply the puts and deletes. True if applied."""
        body = gw.txn_request(compare, [(p, _encode(p.value)) for p in puts], deletes)
        return gw.parse_txn(self._post("/v3/kv/txn", body))

    def write_and_read(
        self,
        compare: Sequence[Compare],
        puts: Sequence[Put],
        deletes: Sequence[str | Query],
        reads: Sequence[Query],
    ) -> list[Found] | None:
        body = gw.write_and_read_request(compare, [(p, _encode(p.value)) for p in puts], deletes, reads)
        return gw.parse_write_and_read(self._post("/v3/kv/txn", body), len(reads))

    def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""
        return gw.parse_deleted(self._post("/v3/kv/deleterange", gw.key_range(key))) > 0

    def delete_prefix(self, prefix: str) -> None:
        self._post("/v3/kv/deleterange", gw.key_range(prefix, prefix=True))

    # -- watches ----------------------------------------------------------------------------
    def watch_range(
        self,
        start: str,
        end: str,
        on_change: Callable[[str, bool], None],
        on_broken: Callable[[], None],
        deletes_only: bool = False,
    ) -> Callable[[], None]:
        """From a thread of its own, ``on_change(key, deleted)`` for each later change of a key in
        [start, end); ``on_broken`` once if the stream ends, after which the caller watches anew.
        Returns once etcd has created the watch; the function returned cancels it."""
        body = gw.watch_request(start, end, deletes_only)
        cancel = self.call(lambda t, token: open_watch(t, body, token, on_change, on_broken))
        return self._watches.track(cancel)

    def watch_prefix(
        self, prefix: str, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        return self.watch_range(prefix, prefix_end(prefix), on_change, on_broken)

    def watch_from(
        self,
        start: str,
        end: str,
        revision: int,
        on_events: Callable[[list[WatchEvent]], None],
        on_broken: Callable[[], None],
    ) -> Callable[[], None]:
        """``watch_range`` from ``revision``, each change whole (``KV.watch_from``)."""
        body = gw.watch_request(start, end, revision=revision)
        cancel = self.call(lambda t, token: open_watch(t, body, token, on_events, on_broken, whole=True))
        return self._watches.track(cancel)

    # -- leases ------------------------------------------------------------------------------
    def grant_lease(self, ttl_s: float) -> int:
        return gw.parse_lease_id(self._post("/v3/lease/grant", {"TTL": str(max(1, round(ttl_s)))}))

    def refresh_lease(self, lease_id: int) -> int:
        """Keep ``lease_id`` alive; returns the remaining TTL, 0 or less when it has expired.

        ``/v3/lease/keepalive`` is a stream; with one request in the body it answers one line
        (``{"result": {"ID", "TTL"}}``, no TTL when the lease is gone) and ends."""
        return gw.parse_keepalive(self._post("/v3/lease/keepalive", gw.lease_request(lease_id)))

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke ``lease_id``; a lease already gone (expired, revoked by a peer) is no error."""
        data = json.dumps(gw.lease_request(lease_id)).encode()

        def op(t: Transport, token: str | None) -> None:
            try:
                t.post("/v3/lease/revoke", data, token)
            except GatewayError as exc:
                if exc.code != gw.NOT_FOUND:
                    raise

        self.call(op)

    def status(self) -> EtcdStatus | None:
        """The current endpoint's database size and the cluster's alarms (two small requests to
        one member); None when etcd keeps them to its admins (a user limited to our prefix)."""
        alarm = json.dumps(gw.ALARM_GET).encode()

        def op(t: Transport, token: str | None) -> EtcdStatus | None:
            try:
                status = t.post("/v3/maintenance/status", b"{}", token)
                alarms = t.post("/v3/maintenance/alarm", alarm, token)
            except GatewayError as exc:
                if exc.failure is Failure.DENIED:
                    return None
                raise
            return gw.parse_status(status, alarms)

        return self.call(op)

    def compact(self, revision: int) -> None:
        """Compact etcd's history up to ``revision`` (every key's older versions go; watches
        behind it are cancelled and start again). A revision already compacted is no error."""
        data = json.dumps(gw.compact_request(revision)).encode()

        def op(t: Transport, token: str | None) -> None:
            try:
                t.post("/v3/kv/compaction", data, token)
            except GatewayError as exc:
                if not (exc.code == gw.OUT_OF_RANGE and gw.COMPACTED_TEXT in exc.message):
                    raise

        self.call(op)

    def health(self) -> str:
        """The server version of the current endpoint; raises EtcdUnavailable if none answers.

        A server that keeps Maintenance.Status for admins denies a user limited to our prefix;
        that denial still proves the member is up and knows us.
        """

        def op(t: Transport, token: str | None) -> str:
            try:
                return gw.parse_version(t.post("/v3/maintenance/status", b"{}", token))
            except GatewayError as exc:
                if exc.failure is Failure.DENIED:
                    return "unknown (status is reserved to etcd admins)"
                raise

        return self.call(op)

"""A thread-safe etcd v3 client over several endpoints, with failover and our own errors.

This is the one module that imports ``etcd3``. The ``etcd3`` 0.12 client ships protobuf code
generated for protobuf 3; protobuf >= 4 refuses it unless the pure-Python implementation is
selected before protobuf is first imported. We select it here, deliberately, rather than pinning
``protobuf<4``: a pin would fight every other package in a user's environment (tensorboard,
grpc tools) for no gain, and the pure-Python codec costs well under a millisecond per request,
far below an etcd round trip. The daemon imports nothing else that loads protobuf first; if
something did, we fail loudly instead of half-working.

Backend contract: every write that must not race uses a transaction whose compare is on
``create_revision`` (absent == 0) or ``mod_revision``; those revisions are the fencing tokens.

Against an etcd with auth and RBAC (the multi-host deployment: client certificates whose CN is
an etcd user, with a role limited to our key prefix), ``etcd3`` 0.12 needs two corrections,
both in ``call``: it authenticates a user/password once, in its constructor, and never again,
so a token that etcd forgot (a restart, a JWT past its TTL) would fail every later call; and it
reports "permission denied" as a bare grpc error that must not look like a dead endpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from elasticd.errors import ConfigError, EtcdUnavailable
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.types import Compare, EtcdAuth, Found, KeyValue, Put, Query

if "google.protobuf" in sys.modules:
    from google.protobuf.internal import api_implementation  # type: ignore[import-untyped]

    if api_implementation.Type() != "python":
        raise ImportError(
            "protobuf was imported before elasticd.etcd.client with its native codec; etcd3 0.12 needs "
            "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python set before protobuf's first import"
        )
os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
# The daemon forks only to exec at once; grpc's fork handlers would only log noise.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import etcd3
import etcd3.etcdrpc
import etcd3.events
import etcd3.exceptions
import etcd3.utils
import grpc._common  # type: ignore[import-untyped]

# grpc's blocking waits (a watch stream's next event, a stream call's request iterator) wake every
# MAXIMUM_WAIT_TIMEOUT (0.1 s) only so that a *main* thread blocked in grpc can run signal handlers;
# a wait returns as soon as it is notified either way. The daemon never calls grpc from its main
# thread (its event loop hands every call to a worker thread), so those wake-ups only cost CPU:
# the watch thread alone was 10 wake-ups and ~0.9 ms of CPU a second on an idle daemon.
if isinstance(getattr(grpc._common, "MAXIMUM_WAIT_TIMEOUT", None), float):
    grpc._common.MAXIMUM_WAIT_TIMEOUT = 5.0

T = TypeVar("T")

_RETRYABLE = (etcd3.exceptions.ConnectionFailedError, etcd3.exceptions.ConnectionTimeoutError)
_GRPC_OPTIONS = [
    # Reconnect quickly after an etcd restart instead of grpc's default backoff of up to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _encode(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _quiet_closed_watch_threads() -> None:
    """etcd3's watch thread has no stop: closing the channel ends it with a ValueError. Expected."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else ""
        if name.startswith("etcd3_watch") and isinstance(args.exc_value, ValueError):
            return
        previous(args)

    threading.excepthook = hook


_quiet_closed_watch_threads()


def _grpc_status(exc: BaseException) -> str:
    """The grpc status name of an error etcd3 let through, else "" (duck-typed: grpc has no types)."""
    code = getattr(exc, "code", None)
    if not callable(code):
        return ""
    try:
        return str(getattr(code(), "name", ""))
    except Exception:
        return ""


def _is_connection_error(exc: BaseException) -> bool:
    """An error that another endpoint (or a retry) may not have: worth failing over."""
    if isinstance(exc, (*_RETRYABLE, etcd3.exceptions.InternalServerError)):
        return True
    # grpc errors not mapped by etcd3 (bad TLS, a closed channel, ...)
    return type(exc).__module__.startswith(("grpc", "etcd3")) or "closed channel" in str(exc).lower()


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``http://host:port``, ``https://host:port`` or ``host:port`` -> (host, port).

    ``unix:/dir/localhost:2379`` (the embedded etcd) gives ("unix:/dir/localhost", 2379), which
    etcd3 joins back into the grpc UNIX-socket target ``unix:/dir/localhost:2379``.
    """
    rest = endpoint.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(f"etcd endpoint must be host:port with a port in 1..65535, got {endpoint!r}")
    return host.strip("[]"), int(port)


class EtcdClient:
    """Calls go to the current endpoint; on a connection failure we move to the next one and retry,
    and only when every endpoint has failed once does the call raise ``EtcdUnavailable``."""

    def __init__(
        self, endpoints: Sequence[str], auth: EtcdAuth | None = None, timeout_s: float = 5.0
    ) -> None:
        if not endpoints:
            raise ConfigError("at least one etcd endpoint is required")
        self.endpoints = [parse_endpoint(e) for e in endpoints]
        self._auth = auth or EtcdAuth()
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._index = 0
        self._client: Any = None

    # -- connection management -------------------------------------------------------------
    def _connect(self, index: int) -> Any:
        host, port = self.endpoints[index]
        a = self._auth
        return etcd3.client(
            host=host,
            port=port,
            ca_cert=str(a.ca) if a.ca else None,
            cert_key=str(a.key) if a.key else None,
            cert_cert=str(a.cert) if a.cert else None,
            user=a.user,
            password=a.password,
            timeout=self._timeout_s,
            grpc_options=_GRPC_OPTIONS,
        )

    def _current(self) -> tuple[int, Any]:
        with self._lock:
            if self._client is None:
                self._client = self._connect(self._index)
            return self._index, self._client

    def _fail_over(self, failed_index: int) -> None:
        """Move to the next endpoint. The old channel is not closed here: other threads may be
        mid-call on it, and they fail over (or retry) on their own; it closes when collected.
        With a single endpoint, grpc's own reconnection is all there is to do."""
        with self._lock:
            if self._index != failed_index or len(self.endpoints) == 1:
                return  # another thread already moved on
            self._client = None
            self._index = (self._index + 1) % len(self.endpoints)

    def _reconnect(self, stale: Any) -> None:
        """Drop ``stale`` so that the next call connects, and so authenticates, afresh. Only if it
        is still current: several threads may see the same expired token at once."""
        with self._lock:
            if self._client is stale and stale is not None:
                self._client = None

    def call(self, op: Callable[[Any], T]) -> T:
        """Run ``op(raw_client)`` with failover; the single place that translates etcd errors."""
        last: BaseException | None = None
        reauthenticated = False
        attempts = 0
        while attempts < len(self.endpoints):
            index, client = -1, None
            try:
                index, client = self._current()
                return op(client)
            except Exception as exc:
                status = _grpc_status(exc)
                if status == "PERMISSION_DENIED":
                    # RBAC said no. Every member enforces the same roles: failing over cannot
                    # help, and "unreachable" would send an operator after the network.
                    raise EtcdUnavailable(
                        f"etcd denied the request (permission denied): the etcd user of this "
                        f"daemon has no role that allows it on this key range: {exc}"
                    ) from exc
                if status == "UNAUTHENTICATED" and not reauthenticated:
                    # "invalid auth token": etcd3 0.12 authenticated once, when the client was
                    # built, and etcd has since forgotten the token (restart, JWT expiry). A new
                    # client authenticates again; retry once on the same endpoint.
                    reauthenticated = True
                    last = exc
                    self._reconnect(client)
                    continue
                if not _is_connection_error(exc):
                    raise
                last = exc
                self._fail_over(index)
                attempts += 1
        where = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        raise EtcdUnavailable(f"etcd is unreachable at {where}: {last}") from last

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- key/value ---------------------------------------------------------------------------
    def get(self, key: str) -> KeyValue | None:
        value, meta = self.call(lambda c: c.get(key))
        if value is None:
            return None
        return KeyValue(key, value, meta.create_revision, meta.mod_revision, meta.lease_id)

    def get_json(self, key: str) -> Any:
        kv = self.get(key)
        return None if kv is None else kv.json()

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        def op(c: Any) -> list[KeyValue]:
            return [
                KeyValue(m.key.decode(), v, m.create_revision, m.mod_revision, m.lease_id)
                for v, m in c.get_prefix(prefix, sort_order="ascend", sort_target="key")
            ]

        return self.call(op)

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        """Several ranges in one request, all at one revision (a read-only transaction)."""

        def op(c: Any) -> list[Found]:
            ops = []
            for q in queries:
                end = q.end if q.end is not None else None
                if q.prefix:
                    end = etcd3.utils.increment_last_byte(etcd3.utils.to_bytes(q.key))
                request = c._build_get_range_request(
                    q.key,
                    range_end=end,
                    sort_order="ascend" if q.oldest_only else None,
                    sort_target="create" if q.oldest_only else "key",
                    count_only=q.count_only,
                )
                if q.oldest_only:
                    request.limit = 1  # (etcd3 0.12 accepts a limit argument but never sets it)
                request.count_only = q.count_only  # (nor this one: it would send every key)
                ops.append(etcd3.etcdrpc.RequestOp(request_range=request))
            response = c.kvstub.Txn(
                etcd3.etcdrpc.TxnRequest(compare=[], success=ops, failure=[]),
                c.timeout,
                credentials=c.call_credentials,
                metadata=c.metadata,
            )
            return [
                Found(
                    [
                        KeyValue(kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision, kv.lease)
                        for kv in r.response_range.kvs
                    ],
                    int(r.response_range.count),
                )
                for r in response.responses
            ]

        return self.call(op)

    def put_json(self, key: str, value: Any, lease: int | None = None) -> None:
        data = _encode(value)
        self.call(lambda c: c.put(key, data, lease=lease))

    def create_json(self, key: str, value: Any, lease: int | None = None) -> bool:
        """Write ``key`` only if it does not exist; True when we created it."""
        return self.txn([Compare(key, "create", 0)], [Put(key, value, lease)])

    def txn(self, compare: Sequence[Compare], puts: Sequence[Put], deletes: Sequence[str] = ()) -> bool:
        """All-or-nothing: when every comparison holds, apply the puts and deletes. True if applied."""

        def op(c: Any) -> bool:
            checks = [
                (c.transactions.create(cmp.key) if cmp.target == "create" else c.transactions.mod(cmp.key))
                == cmp.revision
                for cmp in compare
            ]
            success = [c.transactions.put(p.key, _encode(p.value), lease=p.lease) for p in puts]
            success += [c.transactions.delete(k) for k in deletes]
            ok, _ = c.transaction(compare=checks, success=success, failure=[])
            return bool(ok)

        return self.call(op)

    def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""
        return bool(self.call(lambda c: c.delete(key)))

    def delete_prefix(self, prefix: str) -> None:
        self.call(lambda c: c.delete_prefix(prefix))

    # -- watches ----------------------------------------------------------------------------
    def watch_prefix(
        self, prefix: str, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        return self.watch_range(prefix, prefix_end(prefix), on_change, on_broken)

    def watch_range(
        self, start: str, end: str, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        """From a grpc thread, call ``on_change(key, deleted)`` for each change in [start, end).

        etcd3 reports a broken stream once and then forgets the watch: ``on_broken`` is called
        and the caller re-arms. Returns a function that cancels the watch.
        """
        holder: dict[str, Any] = {}

        def callback(response: Any) -> None:
            if isinstance(response, Exception):
                on_broken()
                return
            for event in getattr(response, "events", ()):
                on_change(event.key.decode(), isinstance(event, etcd3.events.DeleteEvent))

        def op(c: Any) -> Any:
            holder["client"] = c
            return c.add_watch_callback(start, callback, range_end=end)

        watch_id = self.call(op)

        def cancel() -> None:
            # The channel may already be gone; then there is nothing left to cancel.
            with contextlib.suppress(Exception):
                holder["client"].cancel_watch(watch_id)

        return cancel

    # -- leases ------------------------------------------------------------------------------
    def grant_lease(self, ttl_s: float) -> int:
        return int(self.call(lambda c: c.lease(max(1, round(ttl_s))).id))

    def refresh_lease(self, lease_id: int) -> int:
        """Keep ``lease_id`` alive; returns the remaining TTL, 0 or less when it has expired."""

        def op(c: Any) -> int:
            responses = list(c.refresh_lease(lease_id))
            return int(responses[0].TTL) if responses else 0

        return self.call(op)

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke ``lease_id``; a lease already gone (expired, revoked by a peer) is no error."""

        def op(c: Any) -> None:
            try:
                c.revoke_lease(lease_id)
            except Exception as exc:
                if "lease not found" not in str(exc):
                    raise

        self.call(op)

    def health(self) -> str:
        """The server version of the current endpoint; raises EtcdUnavailable if none answers.

        A server that keeps Maintenance.Status for admins (etcd 3.5 does not) denies a user
        limited to our prefix; that denial still proves the member is up and knows us.
        """

        def op(c: Any) -> str:
            try:
                return str(c.status().version)
            except Exception as exc:
                if _grpc_status(exc) == "PERMISSION_DENIED":
                    return "unknown (status is reserved to etcd admins)"
                raise

        return self.call(op)

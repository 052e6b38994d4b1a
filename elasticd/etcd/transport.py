"""HTTP/1.1 to one etcd endpoint: its address, its TLS, and a small pool of keep-alive connections.

The standard library's ``http.client`` rather than urllib3: it costs ~1.6 MB of RSS where
urllib3 costs ~5 MB more (measured in the daemon's interpreter, which loads ``ssl`` anyway), it
adds no dependency, and the watch needs the raw socket (to shut it down from another thread),
which urllib3 keeps to itself. What urllib3 would add is this module's pool: take an idle
connection or open one, give it back unless the server said it closes, and drop an idle one
whose socket became readable (the server closed it, e.g. when etcd restarted) before reuse.

A request that fails on the wire raises ``ConnectionLost``. It is repeated here only when a
reused connection was closed under it before any answer (see ``Transport.post``); otherwise a
put or a transaction may have been applied, and the client decides, by failing over.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
from dataclasses import dataclass

from elasticd.errors import ConfigError
from elasticd.etcd.gateway import error_of, parse_json
from elasticd.etcd.types import EtcdAuth

IDLE_CONNECTIONS = 4  # kept open per endpoint; more concurrent calls open (and close) extras
# A watch waits in recv for as long as nothing changes; TCP keep-alive (in the kernel, no wake-up
# of ours) notices a peer that vanished without a FIN within ~1 min and breaks the watch.
_KEEPALIVE = (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))


# What sending on a connection the server had closed looks like (no byte of an answer came).
_CLOSED_WHILE_IDLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class ConnectionLost(Exception):
    """The request did not complete on the wire (refused, reset, TLS failure, timeout)."""


@dataclass(frozen=True)
class Endpoint:
    """``scheme`` is "http", "https", "" (bare host:port) or "unix" (``path`` is the socket)."""

    scheme: str
    host: str
    port: int
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}" if self.scheme else f"{host}:{self.port}"


def parse_endpoint(endpoint: str) -> Endpoint:
    """``http://host:port``, ``https://host:port``, ``host:port`` (``[v6]:port``), or the
    embedded etcd's ``unix:/abs/dir/localhost:2379`` (the whole path names the socket)."""
    if endpoint.startswith("unix:"):
        path = endpoint.removeprefix("unix:")
        path = path[2:] if path.startswith("///") else path
        if not path.startswith("/") or "\0" in path:
            raise ConfigError(f"etcd UNIX endpoint must be unix:/absolute/path, got {endpoint!r}")
        return Endpoint("unix", "localhost", 0, path)
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        scheme, rest = "", endpoint
    elif scheme not in ("http", "https"):
        raise ConfigError(f"etcd endpoint scheme must be http or https, got {endpoint!r}")
    host, sep, port = rest.removesuffix("/").rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(f"etcd endpoint must be host:port with a port in 1..65535, got {endpoint!r}")
    if host.startswith("["):
        host = host.removeprefix("[").removesuffix("]")
    if not host or "/" in host or "[" in host or "]" in host:
        raise ConfigError(f"etcd endpoint has no valid host: {endpoint!r}")
    return Endpoint(scheme, host, int(port))


def tls_context(auth: EtcdAuth) -> ssl.SSLContext:
    """Verify the server against ``auth.ca`` (else the system's CAs); present our certificate."""
    try:
        context = ssl.create_default_context(cafile=str(auth.ca) if auth.ca else None)
        if auth.cert is not None:
            context.load_cert_chain(str(auth.cert), str(auth.key) if auth.key else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"etcd TLS files (etcd_ca, etcd_cert, etcd_key) are unusable: {exc}") from exc
    return context


def uses_tls(endpoint: Endpoint, auth: EtcdAuth) -> bool:
    """https:// always; a bare host:port when TLS files are configured (how etcd's own tools
    name a TLS endpoint)."""
    if endpoint.scheme == "http" and (auth.ca or auth.cert):
        raise ConfigError(
            f"etcd endpoint {endpoint} is plain http but etcd_ca/etcd_cert is set: use https://"
        )
    return endpoint.scheme == "https" or (endpoint.scheme == "" and bool(auth.ca or auth.cert))


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class Transport:
    """How to reach one endpoint, with a pool of idle connections. Thread-safe."""

    def __init__(self, endpoint: Endpoint, context: ssl.SSLContext | None, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._context = context
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []

    def connect(self) -> http.client.HTTPConnection:
        """A new connection, already connected (so that a watch owns its socket from the start)."""
        e = self.endpoint
        conn: http.client.HTTPConnection
        if e.scheme == "unix":
            conn = _UnixConnection(e.path, self.timeout_s)
        elif self._context is not None:
            conn = http.client.HTTPSConnection(e.host, e.port, timeout=self.timeout_s, context=self._context)
        else:
            conn = http.client.HTTPConnection(e.host, e.port, timeout=self.timeout_s)
        try:
            conn.connect()
            if e.scheme != "unix" and conn.sock is not None:
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise ConnectionLost(f"{e}: {exc}") from exc
        return conn

    def post(self, path: str, body: bytes, token: str | None) -> dict[str, object]:
        """POST a JSON body; the JSON object answered. Raises ConnectionLost or GatewayError.

        A kept-alive connection that the server closed just as we sent (its close raced our
        check) fails with no answer at all; a server closes an idle connection without reading
        what arrives on it, so the request is sent once more, on a new connection."""
        conn = self._take()
        if conn is not None:
            try:
                return self._exchange(conn, path, body, token)
            except ConnectionLost as exc:
                if not isinstance(exc.__cause__, _CLOSED_WHILE_IDLE):
                    raise
        return self._exchange(self.connect(), path, body, token)

    def _exchange(
        self, conn: http.client.HTTPConnection, path: str, body: bytes, token: str | None
    ) -> dict[str, object]:
        try:
            conn.request("POST", path, body, headers(token))
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise ConnectionLost(f"{self.endpoint}: {exc or type(exc).__name__}") from exc
        if response.will_close:
            conn.close()
        else:
            self._give(conn)
        if response.status != 200:
            raise error_of(response.status, data)
        return parse_json(data)

    def _take(self) -> http.client.HTTPConnection | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()
            if conn.sock is not None and not _readable(conn.sock):
                conn.sock.settimeout(self.timeout_s)
                return conn
            conn.close()  # the server closed it (or sent something unasked): not reusable

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def headers(token: str | None) -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if token:
        h["Authorization"] = token
    return h


def keep_alive(sock: socket.socket) -> None:
    """Let the kernel probe an idle TCP connection (no effect on UNIX sockets)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in _KEEPALIVE:
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _readable(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))

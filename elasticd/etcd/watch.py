"""One etcd watch: a streaming ``POST /v3/watch`` on a connection of its own, read by one thread.

The thread sits in ``recv`` until etcd sends a line, so an idle watch costs no wake-up at all
(the grpc client it replaces woke 5-10 times a second per watch). ``open_watch`` returns only
once etcd said the watch is created, so every change after it returns is seen. Each event is
one ``on_change(key, deleted)``; when the stream ends for any reason (etcd stopped, the network
broke, an ``{"error"}`` line, or etcd canceled the watch, as after a compaction) ``on_broken``
is called once and the watch is over: the caller watches anew.

``cancel`` shuts the socket down, which wakes the reader at once; it never calls ``on_broken``,
and once it returns no callback runs any more (delivery and cancel take one lock; a callback may
itself cancel).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

from elasticd import log
from elasticd.etcd.gateway import GatewayError, error_of, parse_watch, watch_canceled
from elasticd.etcd.transport import ConnectionLost, Transport, headers, keep_alive
from elasticd.etcd.types import WatchEvent

_log = log.get("elasticd.etcd")

JOIN_S = 5.0


class OpenWatches:
    """A client's open watches (either backend's): each cancelled once, by its own stop or at the
    client's close."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[Callable[[], None]] = set()

    def track(self, cancel: Callable[[], None]) -> Callable[[], None]:
        """``cancel`` kept until the returned stop (or ``close_all``) runs it."""
        with self._lock:
            self._open.add(cancel)

        def stop() -> None:
            with self._lock:
                self._open.discard(cancel)
            cancel()

        return stop

    def close_all(self) -> None:
        with self._lock:
            still, self._open = list(self._open), set()
        for cancel in still:
            cancel()


def open_watch(
    transport: Transport,
    body: dict[str, object],
    token: str | None,
    on_change: Callable[[str, bool], None] | Callable[[list[WatchEvent]], None],
    on_broken: Callable[[], None],
    whole: bool = False,
) -> Callable[[], None]:
    """Create the watch (raising ConnectionLost or GatewayError if etcd does not); its cancel.
    ``on_change`` takes each change's key and whether it was deleted; with ``whole``, each
    message's changes (``WatchEvent``: values and revisions)."""
    conn = transport.connect()
    try:
        conn.request("POST", "/v3/watch", json.dumps(body).encode(), headers(token))
        response = conn.getresponse()
        if response.status != 200:
            raise error_of(response.status, response.read())
        first = parse_watch(response.readline())
        if first.canceled or not first.created:
            raise watch_canceled(first.reason or "the watch was not created")
        sock = conn.sock
        if sock is None:
            raise ConnectionLost(f"{transport.endpoint}: the watch's connection closed")
        sock.settimeout(None)  # from now on, wait for as long as nothing changes
        keep_alive(sock)
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise ConnectionLost(f"{transport.endpoint}: {exc or type(exc).__name__}") from exc
    except BaseException:
        conn.close()
        raise
    stream = _Stream(conn, sock, response, on_change, on_broken, whole)
    return stream.cancel


class _Stream:
    def __init__(
        self,
        conn: http.client.HTTPConnection,
        sock: socket.socket,
        response: http.client.HTTPResponse,
        on_change: Callable[[str, bool], None] | Callable[[list[WatchEvent]], None],
        on_broken: Callable[[], None],
        whole: bool = False,
    ) -> None:
        self._whole = whole
        self._conn = conn
        self._sock = sock
        self._response = response
        self._on_change = on_change
        self._on_broken = on_broken
        self._lock = threading.RLock()
        self._over = False  # canceled or broken: no more callbacks
        self._thread = threading.Thread(target=self._read, name="etcd-watch", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
        # The base class's shutdown: ssl.SSLSocket's would also drop its state under the reader.
        with contextlib.suppress(OSError):  # already closed by the peer
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
        if threading.current_thread() is not self._thread:
            self._thread.join(JOIN_S)

    def _read(self) -> None:
        why = "etcd ended the stream"
        try:
            while line := self._response.readline():
                if not line.strip():
                    continue
                message = parse_watch(line)
                if self._whole and message.changes:
                    self._deliver(message.changes)
                for key, deleted in message.events if not self._whole else ():
                    self._deliver(key, deleted)
                if message.canceled:
                    why = f"etcd canceled the watch: {message.reason}"
                    break
        except (OSError, http.client.HTTPException, ValueError, GatewayError) as exc:
            why = str(exc) or type(exc).__name__
        finally:
            self._conn.close()  # only here, by the reader: no fd is closed under its feet
        self._broken(why)

    def _deliver(self, *args: Any) -> None:
        with self._lock:
            if self._over:
                return
            try:
                self._on_change(*args)
            except Exception:  # a watcher's bug: logged; the stream and later events carry on
                _log.exception("watch.callback_failed", key=args[0] if len(args) == 2 else None)

    def _broken(self, why: str) -> None:
        with self._lock:
            if self._over:
                return  # canceled: the shutdown ended the stream, as asked
            self._over = True
            _log.info("watch.broken", why=why)
            try:
                self._on_broken()
            except Exception:
                _log.exception("watch.callback_failed", key=None)

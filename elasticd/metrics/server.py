"""The metrics endpoint: a small HTTP/1.0 server on the daemon's own loop, ``GET /metrics`` only.

Not prometheus_client's ``start_http_server``: that one runs its own threads on the process-wide
registry. Here each scrape first takes one look at the daemon (``refresh``, on the loop, reading
etcd in threads), then renders this daemon's registry. Requests are bounded in size and time;
anything but ``GET /metrics`` gets 404 or 405.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from elasticd import log
from elasticd.errors import ConfigError
from elasticd.metrics.address import HostPort

_log = log.get("elasticd.metrics")

REQUEST_MAX_BYTES = 8192
REQUEST_TIMEOUT_S = 10.0
REFRESH_TIMEOUT_S = 10.0


class MetricsServer:
    def __init__(
        self, address: HostPort, registry: CollectorRegistry, refresh: Callable[[], Awaitable[None]]
    ) -> None:
        self.address = address
        self._registry = registry
        self._refresh = refresh
        self._server: asyncio.Server | None = None
        self.port = address.port

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._serve, self.address.host, self.address.port, limit=REQUEST_MAX_BYTES
            )
        except OSError as exc:
            raise ConfigError(
                f"metrics_address {self.address}: cannot listen: {exc.strerror or exc}"
            ) from exc
        _log.info("metrics.listening", address=str(self.address))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body, ctype = await asyncio.wait_for(self._answer(reader), REQUEST_TIMEOUT_S)
            head = f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            pass
        except ValueError:  # a line over the limit
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[str, bytes, str]:
        request = await reader.readline()
        size = len(request)
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):  # headers: not used
            size += len(line)
            if size > REQUEST_MAX_BYTES:
                return "431 Request Header Fields Too Large", b"request too large\n", "text/plain"
        parts = request.decode("latin-1").split()
        if len(parts) < 2:
            return "400 Bad Request", b"bad request\n", "text/plain"
        method, path = parts[0], parts[1].split("?", 1)[0]
        if path != "/metrics":
            return "404 Not Found", b"only /metrics is here\n", "text/plain"
        if method != "GET":
            return "405 Method Not Allowed", b"GET only\n", "text/plain"
        try:
            await asyncio.wait_for(self._refresh(), REFRESH_TIMEOUT_S)
        except Exception as exc:  # the state could not be read: the counters are still worth serving
            _log.warning("metrics.refresh_failed", error=repr(exc))
        return "200 OK", generate_latest(self._registry), CONTENT_TYPE_LATEST

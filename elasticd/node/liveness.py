"""Fast detection of a dead peer daemon, by a TCP connection that only its death can break.

Every daemon listens on a liveness port (published in its join records) and holds accepted
connections open without ever writing. Members of a running round connect to each other. When a
daemon process dies, even by SIGKILL, its kernel closes those sockets at once: the peers read EOF
or a reset, confirm with one fresh connection attempt (refused: nobody listens), and revoke the
dead node's lease. Its workers died with it (parent-death signal, reaper), so nothing is fenced
wrongly; the survivors move to the next round in well under a second instead of a lease TTL.

Silence proves nothing (a partition, a frozen host): it is left to the lease TTL. It only keeps a
node out of a round (``probe``, judged by ``elasticd.rendezvous.reach``): a node cut from its peers
but not from etcd would stall every round that took it in.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from elasticd import log
from elasticd.netaddr import NoFreePort, PortRange

_log = log.get("elasticd.liveness")

CONFIRM_TIMEOUT_S = 0.5


class LivenessServer:
    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self._server: asyncio.Server | None = None
        self._peers: set[asyncio.StreamWriter] = set()

    async def start(self, ports: PortRange | None = None) -> None:
        """Listen on any free port, or on one of ``ports`` (raises ``NoFreePort``)."""
        if ports is None:
            self._server = server = await asyncio.start_server(self._hold, self.host, 0)
        else:
            for port in ports.candidates():
                try:
                    self._server = server = await asyncio.start_server(self._hold, self.host, port)
                    break
                except OSError:
                    continue
            else:
                raise NoFreePort(f"no free port in worker_ports {ports} for the liveness port")
        self.port = int(server.sockets[0].getsockname()[1])

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._peers.add(writer)
        try:
            await reader.read()  # until the peer goes away
        except ConnectionError:
            pass
        finally:
            self._peers.discard(writer)
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._peers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


async def _listening(host: str, port: int) -> bool | None:
    """True if something accepts on host:port, False if refused, None if we cannot tell."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONFIRM_TIMEOUT_S)
    except ConnectionRefusedError:
        return False
    except (OSError, TimeoutError):
        return None
    writer.close()
    return True


async def probe(
    targets: Sequence[tuple[str, str, int]], timeout_s: float
) -> tuple[frozenset[str], frozenset[str]]:
    """Connect to each (node, host, port) at once, each for at most ``timeout_s``: (reached,
    unreached). What this judges is only whether a round may take a node in
    (``elasticd.rendezvous.reach``); it never proves a death."""

    async def one(host: str, port: int) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True

    found = await asyncio.gather(*(one(host, port) for _, host, port in targets))
    reached = frozenset(t[0] for t, ok in zip(targets, found, strict=True) if ok)
    return reached, frozenset(t[0] for t in targets) - reached


class LivenessMonitor:
    """Watches peer daemons; calls ``on_dead(node)`` once per proven death."""

    def __init__(self, on_dead: Callable[[str], Awaitable[None]]) -> None:
        self._on_dead = on_dead
        self._tasks: dict[tuple[str, str, int], asyncio.Task[None]] = {}

    def watch(self, peers: dict[str, tuple[str, int]]) -> None:
        """Watch exactly ``peers`` (node -> (address, port)); stop watching the others."""
        wanted = {(node, host, port) for node, (host, port) in peers.items() if port}
        for key in set(self._tasks) - wanted:
            self._tasks.pop(key).cancel()
        for key in wanted - set(self._tasks):
            self._tasks[key] = asyncio.create_task(self._follow(*key), name=f"liveness-{key[0]}")

    async def _follow(self, node: str, host: str, port: int) -> None:
        while True:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
            except (OSError, TimeoutError):
                pass
            else:
                try:
                    await reader.read()
                except ConnectionError:
                    pass
                finally:
                    writer.close()
            verdict = await _listening(host, port)
            if verdict is False:
                await self._dead(node, host, port)
                return
            await asyncio.sleep(1.0 if verdict is None else 0.1)  # alive or unknown: follow again

    async def _dead(self, node: str, host: str, port: int) -> None:
        _log.warning("peer.dead", node=node, address=f"{host}:{port}")
        await self._on_dead(node)

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

"""``liveness.probe``: a connect to each liveness port at once, on loopback (a listening daemon's
port is reached; a closed one and an address nothing answers are not, within the timeout)."""

from __future__ import annotations

import asyncio
import time

from elasticd.netaddr import free_port
from elasticd.node.liveness import LivenessServer, probe


def test_probe_sorts_reached_from_unreached_within_its_timeout() -> None:
    async def main() -> tuple[frozenset[str], frozenset[str], float]:
        server = LivenessServer("127.0.0.1")
        await server.start()
        closed = free_port("127.0.0.1")
        targets = [("up", "127.0.0.1", server.port), ("down", "127.0.0.1", closed), ("far", "192.0.2.1", 9)]
        try:
            t0 = time.monotonic()
            reached, unreached = await probe(targets, 0.3)
            return reached, unreached, time.monotonic() - t0
        finally:
            await server.close()

    reached, unreached, took = asyncio.run(main())
    assert reached == {"up"} and unreached == {"down", "far"}
    assert took < 1.0  # in parallel, each bounded by the timeout

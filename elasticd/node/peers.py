"""Peer liveness for one job: while our workers run, watch the ring neighbours' daemons, and when
one is proven dead, revoke its lease so that its keys go at once (see ``node.liveness``).

Revoking another node's lease is drastic, so it is done only on proof (a refused connection
after the held one broke) and only for the lease that node joined the current round with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from elasticd import log
from elasticd.errors import EtcdUnavailable
from elasticd.node.liveness import LivenessMonitor
from elasticd.rendezvous.model import Join, Member

_log = log.get("elasticd.peers")


class PeerRecords(Protocol):
    """What ``PeerWatch`` needs of a job's store."""

    async def join_of(self, round_no: int, node: str) -> Join | None: ...
    async def revoke(self, lease: int) -> None: ...


class PeerWatch:
    def __init__(self, job_id: str, store: PeerRecords, on_revoked: Callable[[], None]) -> None:
        self._job_id = job_id
        self._store = store
        self._on_revoked = on_revoked
        self._round = 0
        self._monitor = LivenessMonitor(self._dead)

    def follow(self, round_no: int, peers: tuple[Member, ...]) -> None:
        """Watch exactly ``peers`` (empty: none), members of round ``round_no``."""
        self._round = round_no
        self._monitor.watch({m.node: (m.address, m.liveness_port) for m in peers})

    async def _dead(self, node: str) -> None:
        join = await self._store.join_of(self._round, node)
        if join is None or not join.lease:
            return
        try:
            await self._store.revoke(join.lease)
            _log.warning("peer.lease_revoked", job=self._job_id, node=node, lease=join.lease)
        except EtcdUnavailable as exc:
            _log.warning("peer.revoke_failed", job=self._job_id, node=node, error=str(exc))
        self._on_revoked()

    def close(self) -> None:
        self._monitor.close()

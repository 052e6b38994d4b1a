"""The key-value seam: what elasticd needs of etcd, as a protocol with two implementations.

``elasticd.etcd.client.EtcdClient`` talks to a real etcd; ``elasticd.etcd.memory.MemoryKV``
keeps everything in memory with the same semantics (one revision counter, create and mod
revisions per key, leases that own keys, transactions that compare revisions). The same
contract tests (``tests/contract/test_kv_contract.py``) run against both.

Calls block (the etcd client waits on the network): async code runs them in a thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from elasticd.etcd.types import Compare, Found, KeyValue, Put, Query


def prefix_end(prefix: str) -> str:
    """The exclusive end of the range of keys that start with ``prefix`` (its last character
    plus one: code-point order is UTF-8 byte order, etcd's key order); "\\0", etcd's "to the
    end of the key space", for the empty prefix."""
    if not prefix:
        return "\0"
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class KV(Protocol):
    def get(self, key: str) -> KeyValue | None:
        """The key, or None if it does not exist."""
        ...

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Every key under ``prefix``, in key order, as of one revision."""
        ...

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        """Several ranges read as of one revision (one round trip)."""
        ...

    def put_json(self, key: str, value: Any, lease: int | None = None) -> None:
        """Write ``value`` JSON-encoded, attached to ``lease`` when given."""
        ...

    def txn(self, compare: Sequence[Compare], puts: Sequence[Put], deletes: Sequence[str] = ()) -> bool:
        """If every comparison holds, apply the puts and deletes at one revision; True if applied."""
        ...

    def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""
        ...

    def delete_prefix(self, prefix: str) -> None: ...

    def watch_range(
        self, start: str, end: str, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_change(key, deleted)`` for each later change of a key in [start, end) (from
        another thread), in revision order; ``on_broken`` once if the watch breaks (it then gets
        nothing more: the caller watches again, and reads what it may have missed). Returns a
        function that cancels it."""
        ...

    def watch_prefix(
        self, prefix: str, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        """``watch_range`` over every key under ``prefix``: [prefix, prefix_end(prefix))."""
        ...

    def grant_lease(self, ttl_s: float) -> int: ...

    def refresh_lease(self, lease_id: int) -> int:
        """Keep ``lease_id`` alive; the remaining TTL in seconds, 0 or less when it has expired."""
        ...

    def revoke_lease(self, lease_id: int) -> None:
        """End the lease now: every key attached to it is deleted."""
        ...

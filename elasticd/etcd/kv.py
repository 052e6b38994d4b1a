"""The key-value seam: what elasticd needs of etcd, as a protocol with two implementations.

``elasticd.etcd.client.EtcdClient`` talks to a real etcd; ``elasticd.etcd.memory.MemoryKV``
keeps everything in memory with the same semantics (one revision counter, create and mod
revisions per key, leases that own keys, transactions that compare revisions). The same
contract tests (``tests/contract/test_kv_contract.py``) run against both.

Calls block (the etcd client waits on the network): async code runs them in a thread.
Ranges are etcd's: [start, end) in key order (UTF-8 byte order, which is code-point order),
with the end ``ALL_KEYS`` ("\\0") meaning every key from start on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from elasticd.etcd.types import Compare, EtcdStatus, Found, KeyValue, Put, Query, WatchEvent

ALL_KEYS = "\0"
CLIENTS = ("gateway", "grpc")  # the setting etcd_client: which Backend talks to a real etcd


def prefix_end(prefix: str) -> str:
    """The end of the range of every key that starts with ``prefix``: its last character that
    can be incremented, incremented (``ALL_KEYS`` for the empty prefix)."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code == 0xD800:  # surrogates are no key characters: the next one is U+E000
            code = 0xE000
        if code <= 0x10FFFF:
            return "".join(chars) + chr(code)
    return ALL_KEYS


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

    def txn(
        self, compare: Sequence[Compare], puts: Sequence[Put], deletes: Sequence[str | Query] = ()
    ) -> bool:
        """If every comparison holds, apply the puts and deletes at one revision; True if applied.
        A delete is a key, or a range (a ``Query``'s key, prefix or end; a range must not hold a
        key that is put)."""
        ...

    def write_and_read(
        self,
        compare: Sequence[Compare],
        puts: Sequence[Put],
        deletes: Sequence[str | Query],
        reads: Sequence[Query],
    ) -> list[Found] | None:
        """``txn``, then ``reads`` in the same transaction, which see its writes: a write and
        what the writer needs to know right after it, in one round trip at one revision. The
        reads' answers, or None when a comparison failed (nothing written, nothing read)."""
        ...

    def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""
        ...

    def delete_prefix(self, prefix: str) -> None: ...

    def watch_range(
        self,
        start: str,
        end: str,
        on_change: Callable[[str, bool], None],
        on_broken: Callable[[], None],
        deletes_only: bool = False,
    ) -> Callable[[], None]:
        """Call ``on_change(key, deleted)`` for each later change of a key in [start, end) (from
        another thread); ``on_broken`` once if the watch breaks, and nothing after it. Returns a
        function that cancels the watch: no callback runs once it returned, and never on_broken.
        With ``deletes_only`` etcd filters the puts out (``NOPUT``): they are never sent."""
        ...

    def watch_prefix(
        self, prefix: str, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        """``watch_range`` over every key under ``prefix``."""
        ...

    def watch_from(
        self,
        start: str,
        end: str,
        revision: int,
        on_events: Callable[[list[WatchEvent]], None],
        on_broken: Callable[[], None],
    ) -> Callable[[], None]:
        """``watch_range`` from ``revision`` on (the changes since, first), each change with its
        value and revision; ``on_events`` gets them in revision order, a batch at a time. A
        ``revision`` already compacted breaks the watch at once (``on_broken``): the caller reads
        the range again, and watches from the revision after that read (``Found.revision``)."""
        ...

    def grant_lease(self, ttl_s: float) -> int: ...

    def refresh_lease(self, lease_id: int) -> int:
        """Keep ``lease_id`` alive; the remaining TTL in seconds, 0 or less when it has expired."""
        ...

    def revoke_lease(self, lease_id: int) -> None:
        """End the lease now: every key attached to it is deleted."""
        ...

    def status(self) -> EtcdStatus | None:
        """The database's size and the raised alarms; None when etcd will not tell us."""
        ...

    def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (a revision already compacted: nothing)."""
        ...


class Backend(KV, Protocol):
    """A ``KV`` on a real etcd, as the daemon holds it: ``EtcdClient`` (the JSON gateway) or
    ``GrpcEtcdClient`` (grpc), picked by ``etcd.backend.connect``."""

    def health(self) -> str:
        """The server's version; raises ``EtcdUnavailable`` when no endpoint answers."""
        ...

    def close(self) -> None:
        """Cancel the watches still open and close the connections."""
        ...

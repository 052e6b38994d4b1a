"""The values that cross the etcd seam: plain frozen records, with no etcd client behind them.

Kept apart from ``elasticd.etcd.client`` so that pure modules (snapshots, deciders, views) and
their tests can use them without loading the HTTP client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EtcdAuth:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a log line


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    def json(self) -> Any:
        return json.loads(self.value)


@dataclass(frozen=True)
class Compare:
    """``target`` of ``key`` equals ``revision``: its create or mod revision (0: the key is
    absent), or for ``"lease"`` the lease the key is held under (0: none, or absent). A write
    guarded by a lease compare lands only beside a key that dies with the same lease."""

    key: str
    target: str  # "create" | "mod" | "lease"
    revision: int


@dataclass(frozen=True)
class Query:
    """One range of a ``read_many``: a key, a prefix, or [key, end)."""

    key: str
    prefix: bool = False
    end: str | None = None  # exclusive end of the range, instead of ``prefix``
    oldest_only: bool = False  # only the key with the lowest create_revision
    first_only: bool = False  # only the first key in key order (no sort on the server: cheap)
    count_only: bool = False  # how many keys, not the keys
    # At most this many keys, the first in key order (0: no bound); ``Found.count`` still counts
    # the whole range: a page of a range too large for one response (``rendezvous.rosterread``).
    limit: int = 0
    # Only the keys modified at or after this revision (0: all). ``Found.count`` still counts every
    # key in the range, as etcd does: so a read can tell that nothing was created, changed or
    # deleted since a revision without reading the range again.
    min_mod_revision: int = 0
    # Served by the member the client talks to from what it has applied, without first asking
    # the cluster's leader how far the log goes (etcd's ReadIndex): no older than what that
    # member already told this client (a watch event, an earlier answer), maybe older than the
    # newest write elsewhere. A read-only transaction skips the ReadIndex only when every range
    # in it is serializable. For reads whose staleness only delays: what acts on them is guarded.
    serializable: bool = False


@dataclass(frozen=True)
class Found:
    kvs: list[KeyValue]
    count: int
    # The store's revision the read was served at (0: not told): a watch from the one after it
    # sees every later change of the range, and nothing the read already showed. Not part of
    # what the read found: two reads of the same keys are equal at any revision.
    revision: int = field(default=0, compare=False)


@dataclass(frozen=True)
class WatchEvent:
    """One change a watch reports: the key as written (for a delete: its key, and the delete's
    revision as ``mod_revision``; no value)."""

    kv: KeyValue
    deleted: bool


@dataclass(frozen=True)
class EtcdStatus:
    """How full etcd's database is, and its raised alarms, as one member reports them.

    etcd refuses every write that would grow the database once ``db_size`` (the file, what its
    ``--quota-backend-bytes`` counts) reaches the quota, and then raises NOSPACE for the whole
    cluster until an operator disarms it. ``db_size_in_use`` is the part of the file in use: a
    compaction lowers it, a defragmentation gives the rest of the file back."""

    db_size: int  # bytes of the member's database file
    db_size_in_use: int  # bytes of it in use (0: the member does not say)
    revision: int  # the store's revision as read: what a compaction compacts to
    alarms: tuple[str, ...] = ()  # raised alarms (NOSPACE, CORRUPT), each once, in name order

    def __post_init__(self) -> None:
        if min(self.db_size, self.db_size_in_use, self.revision) < 0:
            raise ValueError("sizes and revision must be >= 0")


@dataclass(frozen=True)
class Put:
    key: str
    value: Any  # JSON-encoded on write
    lease: int | None = None

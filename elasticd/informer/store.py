"""``Store``: the informer's copy of its key ranges, and each group's decoded read. Pure.

The keys are held as etcd gave them (``KeyValue``: value, create and mod revisions), by key:
those of the ranges it holds (``held``; a watch may report others, which it leaves out).
``group_of`` names the group a key belongs to (a job), or None for a key no group reads. A
group's read (``decode(group, its keys in key order)``) is made once per change of its keys and
handed out as the same object until then, and the mapping of every group's read is the same
object while nothing changed: so what is made from them (a view, a ticket, a queue) is kept by
their identity (``derived.py``).

Bounded: etcd's content is untrusted, and a copy of it is memory of the daemon's. Past
``Bound`` a key not held is not taken (one held is still changed or deleted), and the store is
``OVER_BOUND`` until a list fits again; what reads it can tell (``state``).

States (``Completeness``):
    WHOLE ──a new key past the bound──> OVER_BOUND
    OVER_BOUND ──a list (``replace``) that fits──> WHOLE
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from elasticd.etcd.types import KeyValue, WatchEvent

T = TypeVar("T")


class Completeness(Enum):
    """Whether the copy holds every key of its ranges (the transitions are in the module doc)."""

    WHOLE = "whole"
    OVER_BOUND = "over_bound"  # keys past the bound were left out


@dataclass(frozen=True)
class Bound:
    """The most the copy holds: keys, and bytes of keys and values together."""

    keys: int = 200_000
    bytes: int = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.keys <= 0 or self.bytes <= 0:
            raise ValueError("a bound must be positive")


def _size(kv: KeyValue) -> int:
    return len(kv.key) + len(kv.value)


class Store(Generic[T]):
    """The keys of the ranges, as of ``revision``, and each group's read (module doc)."""

    def __init__(
        self,
        held: Sequence[tuple[str, str]],
        group_of: Callable[[str], str | None],
        decode: Callable[[str, list[KeyValue]], T],
        bound: Bound = Bound(),
    ) -> None:
        self.held = tuple(held)  # the ranges [start, end) it holds
        self._group_of = group_of
        self._decode = decode
        self._bound = bound
        self._kvs: dict[str, KeyValue] = {}
        self._groups: dict[str, set[str]] = {}  # group → its keys held
        self._reads: dict[str, T] = {}
        self._stale: set[str] = set()  # groups whose read is to be made again
        self._view: Mapping[str, T] | None = None
        self._bytes = 0
        self.revision = 0  # of the list, or of the newest change applied since (0: never listed)
        self._floor = 0  # the last list's revision: no change at or before it is applied again
        self.state = Completeness.WHOLE
        self.left_out = 0  # keys not taken for the bound, since the last list
        self.decoded = 0  # groups' reads made: what the tests count

    @property
    def listed(self) -> bool:
        return self.revision > 0

    def __len__(self) -> int:
        return len(self._kvs)

    @property
    def size(self) -> int:
        """Bytes of the keys and values held."""
        return self._bytes

    def replace(self, kvs: Iterable[KeyValue], revision: int) -> set[str]:
        """Every key of the ranges, read at ``revision`` (a list): what is not among them is gone.
        The groups whose keys changed (their reads are made again). A list older than the last
        one is ignored (two lists may finish out of order)."""
        if revision < self._floor:
            return set()
        self._floor = revision
        old = self._kvs
        self._kvs, self._groups, self._bytes = {}, {}, 0
        self.state, self.left_out = Completeness.WHOLE, 0
        for kv in kvs:
            if self.holds(kv.key):
                self._put(kv)
        changed = {k for k in old.keys() | self._kvs.keys() if old.get(k) != self._kvs.get(k)}
        groups = {g for k in changed if (g := self._group_of(k)) is not None}
        self._touch(groups)
        self._reads = {g: r for g, r in self._reads.items() if g in self._groups}
        self.revision = max(self.revision, revision)
        return groups

    def apply(self, events: Iterable[WatchEvent]) -> set[str]:
        """Changes a watch reported, in revision order; the groups they touched."""
        groups: set[str] = set()
        for event in events:
            kv = event.kv
            if kv.mod_revision <= self._floor:
                continue  # (shown by the last list already)
            self.revision = max(self.revision, kv.mod_revision)  # (a watch's progress, held or not)
            held = self._kvs.get(kv.key)
            if not self.holds(kv.key) or (held is not None and held.mod_revision >= kv.mod_revision):
                continue
            if event.deleted:
                self._drop(kv.key)
            else:
                self._put(kv)
            if (group := self._group_of(kv.key)) is not None:
                groups.add(group)
        self._touch(groups)
        return groups

    def reads(self) -> Mapping[str, T]:
        """Every group's read: the same mapping while nothing changed, the same read of a group
        while its keys did not change."""
        if self._view is not None:
            return self._view
        for group in self._stale:
            keys = self._groups.get(group)
            if keys:
                self._reads[group] = self._decode(group, [self._kvs[k] for k in sorted(keys)])
                self.decoded += 1
            else:
                self._reads.pop(group, None)
        self._stale = set()
        self._view = dict(self._reads)
        return self._view

    def keys(self, group: str) -> list[KeyValue]:
        """The keys of ``group`` held, in key order."""
        return [self._kvs[k] for k in sorted(self._groups.get(group, ()))]

    def get(self, key: str) -> KeyValue | None:
        return self._kvs.get(key)

    def holds(self, key: str) -> bool:
        """Whether ``key`` is in a range the store holds."""
        return any(start <= key < end for start, end in self.held)

    def count(self, start: str, end: str) -> int:
        """How many keys it holds in [start, end)."""
        return sum(start <= key < end for key in self._kvs)

    def _touch(self, groups: set[str]) -> None:
        if groups:
            self._stale |= groups
            self._view = None

    def _put(self, kv: KeyValue) -> None:
        old = self._kvs.get(kv.key)
        grown = _size(kv) - (_size(old) if old is not None else 0)
        if old is None and (len(self._kvs) >= self._bound.keys or self._bytes + grown > self._bound.bytes):
            self.state = Completeness.OVER_BOUND
            self.left_out += 1
            return
        self._kvs[kv.key] = kv
        self._bytes += grown
        if (group := self._group_of(kv.key)) is not None:
            self._groups.setdefault(group, set()).add(kv.key)

    def _drop(self, key: str) -> None:
        old = self._kvs.pop(key, None)
        if old is None:
            return
        self._bytes -= _size(old)
        group = self._group_of(key)
        if group is not None and (keys := self._groups.get(group)) is not None:
            keys.discard(key)
            if not keys:
                del self._groups[group]

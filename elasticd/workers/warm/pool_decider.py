"""The node's pool of parked zygotes, decided purely: given the pool, a request and ``now``, which
zygotes to park, check, hand over, or stop. ``pool`` carries the actions out.

A job whose zygote is healthy when it leaves this node offers it to the pool (``park``); the next
job whose launch would start an identical zygote (the same ``ZygoteKey``, compared exactly, so never
across users) asks for it (``want``), and gets it if the zygote, asked to check the files behind its
modules, says they are unchanged (``checked``). Bounds that hold after every decision:

- at most ``Limits.size`` entries, and ``Limits.per_uid`` of one submitter (a user cannot fill the
  pool): a new entry pushes out the least recently parked one (LRU), of its own user first;
- a PARKED entry older than ``Limits.keep_s`` is stopped at the next decision (the executor wakes
  for it at ``next_expiry``);
- under memory pressure nothing is parked and what is parked (and not wanted) is stopped.

The key type is opaque here (any hashable value with a ``uid``): the decider compares keys only
for equality.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol


class Key(Hashable, Protocol):
    @property
    def uid(self) -> int: ...


class EntryState(Enum):
    """A zygote's life in the pool.

    (offered) → PARKED          ``park``: kept (the executor moves it to the pool's cgroup)
    (offered) → gone            ``park``: refused (off, full of entries being adopted, low memory)
    PARKED → CHECKING           ``want``: a job with the same key asked; the zygote checks its files
    CHECKING → gone (adopted)   ``checked``: fresh; it serves that job now
    CHECKING → gone (stale)     ``checked``: a file changed; stopped, the job starts a fresh one
    PARKED → gone               ``expire`` (kept ``keep_s``), evicted by a newer entry (LRU, per uid),
                                low memory
    PARKED | CHECKING → gone    ``lost`` (it died or misbehaved: forgotten), ``close`` (daemon stop)
    """

    PARKED = "parked"
    CHECKING = "checking"


class Why(Enum):
    """Why an entry leaves the pool (or an offered zygote is not kept)."""

    OFF = "off"  # the pool is disabled (size 0 or keep_s 0)
    FULL = "full"  # every entry (of the pool, or of the user) is being adopted: none to evict
    EVICTED = "evicted"  # the least recently parked, to make room
    EXPIRED = "expired"
    LOW_MEMORY = "low_memory"
    STALE = "stale"  # a file behind its modules changed since it was ready
    ADOPTED = "adopted"
    LOST = "lost"  # it died or misbehaved while in the pool
    CLOSED = "closed"  # the daemon stops


@dataclass(frozen=True)
class Limits:
    size: int = 2  # entries on this node
    keep_s: float = 120.0  # how long an entry stays PARKED
    per_uid: int = 1  # entries of one submitter

    @property
    def off(self) -> bool:
        return self.size <= 0 or self.keep_s <= 0 or self.per_uid <= 0


@dataclass(frozen=True)
class Entry:
    id: int
    key: Key
    parked_at: float
    state: EntryState = EntryState.PARKED

    @property
    def uid(self) -> int:
        return self.key.uid


@dataclass(frozen=True)
class Pool:
    entries: tuple[Entry, ...] = ()

    def get(self, entry_id: int) -> Entry | None:
        return next((e for e in self.entries if e.id == entry_id), None)

    def without(self, *ids: int) -> Pool:
        return Pool(tuple(e for e in self.entries if e.id not in ids))


@dataclass(frozen=True)
class Park:
    """Keep the offered zygote ``id``."""

    id: int


@dataclass(frozen=True)
class Stop:
    """Stop zygote ``id`` (an entry leaving the pool, or the offered one, refused)."""

    id: int
    why: Why


@dataclass(frozen=True)
class Check:
    """Ask entry ``id`` whether the files behind its modules are unchanged (``checked`` follows)."""

    id: int


@dataclass(frozen=True)
class Adopt:
    """Hand entry ``id`` to the job that asked for it."""

    id: int


@dataclass(frozen=True)
class Forget:
    """Entry ``id`` is gone already (dead): drop it."""

    id: int
    why: Why


Action = Park | Stop | Check | Adopt | Forget
Decision = tuple[Pool, list[Action]]


def expire(pool: Pool, limits: Limits, now: float) -> Decision:
    """Stop every PARKED entry kept ``keep_s`` or longer."""
    old = [e.id for e in pool.entries if e.state is EntryState.PARKED and now - e.parked_at >= limits.keep_s]
    return pool.without(*old), [Stop(i, Why.EXPIRED) for i in old]


def next_expiry(pool: Pool, limits: Limits) -> float | None:
    """When ``expire`` next has something to do."""
    times = [e.parked_at + limits.keep_s for e in pool.entries if e.state is EntryState.PARKED]
    return min(times, default=None)


def _evict(pool: Pool, victims: list[Entry], n: int, why: Why) -> Decision:
    """Stop the ``n`` least recently parked of the PARKED ``victims``."""
    chosen = sorted((e for e in victims if e.state is EntryState.PARKED), key=lambda e: (e.parked_at, e.id))
    ids = [e.id for e in chosen[: max(0, n)]]
    return pool.without(*ids), [Stop(i, why) for i in ids]


def park(pool: Pool, offered: int, key: Key, limits: Limits, now: float, memory_low: bool) -> Decision:
    """A healthy zygote ``offered`` (not in the pool; its id unique) whose job left: keep it, making
    room by evicting the least recently parked entries, or refuse it."""
    pool, actions = expire(pool, limits, now)
    if limits.off:
        return pool, [*actions, Stop(offered, Why.OFF)]
    if memory_low:
        pool, stopped = _evict(pool, list(pool.entries), len(pool.entries), Why.LOW_MEMORY)
        return pool, [*actions, *stopped, Stop(offered, Why.LOW_MEMORY)]
    mine = [e for e in pool.entries if e.uid == key.uid]
    pool, evicted = _evict(pool, mine, len(mine) - limits.per_uid + 1, Why.EVICTED)
    actions += evicted
    pool, evicted = _evict(pool, list(pool.entries), len(pool.entries) - limits.size + 1, Why.EVICTED)
    actions += evicted
    full = len(pool.entries) >= limits.size
    if full or sum(e.uid == key.uid for e in pool.entries) >= limits.per_uid:
        return pool, [*actions, Stop(offered, Why.FULL)]
    return Pool((*pool.entries, Entry(offered, key, now))), [*actions, Park(offered)]


def want(pool: Pool, key: Key, limits: Limits, now: float, memory_low: bool) -> Decision:
    """A job would start a zygote with ``key``: check the most recently parked entry with exactly
    that key (``Check``; none: no action for it). Under memory pressure the other PARKED entries go."""
    pool, actions = expire(pool, limits, now)
    same = [e for e in pool.entries if e.state is EntryState.PARKED and e.key == key]
    match = max(same, key=lambda e: (e.parked_at, e.id), default=None)
    if memory_low:
        others = [e for e in pool.entries if match is None or e.id != match.id]
        pool, stopped = _evict(pool, others, len(others), Why.LOW_MEMORY)
        actions += stopped
    if match is None:
        return pool, actions
    checking = replace(match, state=EntryState.CHECKING)
    entries = tuple(checking if e.id == match.id else e for e in pool.entries)
    return Pool(entries), [*actions, Check(match.id)]


def checked(pool: Pool, entry_id: int, fresh: bool) -> Decision:
    """Entry ``entry_id`` answered its ``Check``: fresh → adopt it, else stop it (stale). An entry
    that left meanwhile (lost, closed) is not acted on."""
    entry = pool.get(entry_id)
    if entry is None or entry.state is not EntryState.CHECKING:
        return pool, []
    return pool.without(entry_id), [Adopt(entry_id) if fresh else Stop(entry_id, Why.STALE)]


def lost(pool: Pool, entry_id: int) -> Decision:
    """Entry ``entry_id`` died (its pidfd said so) or misbehaved: forget it."""
    if pool.get(entry_id) is None:
        return pool, []
    return pool.without(entry_id), [Forget(entry_id, Why.LOST)]


def close(pool: Pool) -> Decision:
    """The daemon stops: every entry goes."""
    return Pool(), [Stop(e.id, Why.CLOSED) for e in pool.entries]

"""A job as etcd holds it, read at one revision: one frozen type per shape of read.

What a read covered decides what it can tell, so each shape is its own type, and a field that
was not read does not exist (mypy checks that an accessor is only called where its fields were
read):

- ``JobRead``: the job's records (``jobs/<job>/``) and, where read, its pending notes and its
  nodes' reports; its closed rounds as their heads (size, world, master), not their members. The
  copy of every job (``jobparse.parse_job`` per job: the scan, the table of ``status``) holds this.
- ``JoinsRead``: also the job's parts (``parts/<job>/``): each round's joins, done markers and
  lead key, one round's joins perhaps only counted (a running member needs how many, not whose).
  ``status <job>``, ``kill``, ``logs`` and ``rm`` read this (``JobStore.read``).
- ``MemberRead``: also one node's own assignment of the current round (``JobStore.read_member``):
  what a member of a running round reads, O(1) bytes whatever the job's size.
- ``RostersRead``: also every closed round whole (``JobStore.read_rosters``): what a round's
  leader, a node outside a running round and a member that lost a peer read.
- ``Parts``: some rounds' joins and done markers alone, read for one job (``JobStore.round_parts``,
  ``rosterread.Members``).

Every mapping is built by the parser (``elasticd.rendezvous.jobparse``) and never changed after:
a read is shared by every reader of it (the scan's read of every job, ``status``). A job with an
invalid key has ended (``ended``): the janitor records it as FAILED, and no agent acts on it
meanwhile. (``elasticd.rendezvous.glance``: the small read a node waiting in an open round makes
instead.) Pure: no etcd client (``elasticd.rendezvous.storeread`` does the reading).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from elasticd.rendezvous.model import (
    Assignment,
    DrainRecord,
    FinalRecord,
    Join,
    Member,
    NodeStatus,
    RoundHead,
    RoundInfo,
    RoundResult,
    WaitingRecord,
)
from elasticd.rendezvous.roster import own
from elasticd.terms.head import JobHead

K = TypeVar("K")
V = TypeVar("V")


class Frozen(Mapping[K, V]):
    """A read-only mapping, built once by the parser: a read is shared by every reader of it.
    (Unlike ``types.MappingProxyType``, it copies and compares as the plain data it is.)"""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        self._items: dict[K, V] = dict(items or {})

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return repr(self._items)


EMPTY: Mapping[Any, Any] = Frozen()


def _empty() -> Any:
    """A mapping field's default: the shared empty one (a ``Field`` each: it is unhashable)."""
    return field(default_factory=lambda: EMPTY)


@dataclass(frozen=True)
class InvalidKey:
    """A key of a job that did not parse or validate; ``key`` is relative to the daemon's prefix."""

    key: str
    why: str
    revision: int = 0  # its mod revision (0: a missing key), so that it is reported once

    def describe(self) -> str:
        return f"invalid record at {self.key}: {self.why}"


# A running round's member that is there with work left; a bad key read; or, none being there,
# the round's done markers (``elasticd.rendezvous.rosterread.Members.live``).
Live = str | InvalidKey | frozenset[str]


@dataclass(frozen=True)
class JobRead:
    """The job's records, its pending notes and its nodes' reports (each where the read covered
    them: the read of every job carries no report), at one revision."""

    job_id: str
    head: JobHead | None = None  # ``jobs/<job>/spec``; the full spec is no part of a read
    round: RoundInfo | None = None
    round_mod: int = 0
    restarts: int = 0
    restarts_mod: int = 0
    final: FinalRecord | None = None
    final_mod: int = 0
    heads: Mapping[int, RoundHead] = _empty()  # closed rounds, as every node reads them
    left: Mapping[int, frozenset[str]] = _empty()  # stopped for good before round r
    waiting: Mapping[str, WaitingRecord] = _empty()
    node_status: Mapping[str, NodeStatus] = _empty()  # the reports (``reportread``), where read
    pending: Mapping[str, str] = _empty()
    drains: Mapping[str, DrainRecord] = _empty()  # nodes asked to leave this job
    invalid: tuple[InvalidKey, ...] = ()
    # How many keys the job has under jobs/<job>/ (0: no such job). Parts alone make no job: they
    # are under their nodes' leases, and a job's removal deletes them first.
    found: int = 0

    @property
    def current(self) -> int:
        return self.round.round if self.round else 0

    def rounds(self) -> set[int]:
        """The closed rounds the read names."""
        return set(self.heads)

    def head_of(self, round_no: int) -> RoundHead | None:
        return self.heads.get(round_no)

    @property
    def closed(self) -> RoundHead | None:
        """The current round's head: the round closed (None: it is open)."""
        return self.head_of(self.current)

    @property
    def previous_head(self) -> RoundHead | None:
        earlier = [r for r in self.rounds() if r < self.current]
        return self.head_of(max(earlier)) if earlier else None

    @property
    def ended(self) -> bool:
        """The job is over: it has a final record, or a record nothing sound can be built on."""
        return self.final is not None or bool(self.invalid)

    @property
    def final_invalid(self) -> InvalidKey | None:
        """The bad ``final`` record, if that is one of the invalid keys."""
        return next((k for k in self.invalid if k.key.endswith(f"/{self.job_id}/final")), None)


def fields_of(read: JobRead, shape: type[JobRead] = JobRead) -> dict[str, Any]:
    """``read``'s fields that every read of ``shape`` has, to build that shape of it from."""
    return {f.name: getattr(read, f.name) for f in fields(shape)}


def bare(read: JobRead) -> JobRead:
    """``read`` as the read of every job holds it: no part, no assignment, no report."""
    return JobRead(**fields_of(read) | {"node_status": EMPTY})


@dataclass(frozen=True)
class JoinsRead(JobRead):
    """Also the job's parts: each round's joins (oldest first), done markers and lead key; the
    rounds in ``join_counts`` had their joins only counted."""

    joins: Mapping[int, tuple[Join, ...]] = _empty()
    done: Mapping[int, frozenset[str]] = _empty()
    leads: Mapping[int, str] = _empty()  # each round's leader, by its lead key
    join_counts: Mapping[int, int] = _empty()

    @property
    def current_joins(self) -> tuple[Join, ...]:
        return self.joins.get(self.current, ())

    @property
    def last_join_revision(self) -> int:
        """The current round's newest join's create revision (0: none read)."""
        return max((j.create_revision for j in self.current_joins), default=0)

    def done_in(self, round_no: int) -> frozenset[str]:
        return self.done.get(round_no, frozenset())

    def all_done(self) -> bool:
        """Every member of the current round reported ``done``, by count: only members write one."""
        head = self.closed
        return head is not None and len(self.done_in(self.current)) >= head.size


@dataclass(frozen=True)
class MemberRead(JoinsRead):
    """Also ``node``'s own assignment of the current round, when it has one (O(1) bytes)."""

    node: str = ""
    assignment: Assignment | None = None

    def _own(self, node: str) -> Assignment | None:
        head = self.closed
        if head is None or node != self.node:
            return None
        return own(head, self.assignment)

    def me(self, node: str) -> Member | None:
        """``node``'s part in the current round (None: not a member, or the round is open)."""
        found = self._own(node)
        return found.member if found is not None else None

    def peers(self, node: str) -> tuple[Member, ...]:
        """``node``'s neighbours in the current round's rank order (the daemons it watches)."""
        found = self._own(node)
        return found.peers if found is not None else ()


@dataclass(frozen=True)
class RostersRead(JoinsRead):
    """Also every closed round whole (a round forgotten while it was read is left out)."""

    results: Mapping[int, RoundResult] = _empty()

    def rounds(self) -> set[int]:
        return {*self.heads, *self.results}

    def head_of(self, round_no: int) -> RoundHead | None:
        head = self.heads.get(round_no)
        if head is None and round_no in self.results:  # a read built whole (tests)
            return self.results[round_no].head()
        return head

    @property
    def result(self) -> RoundResult | None:
        """The current round whole."""
        return self.results.get(self.current)

    @property
    def previous_result(self) -> RoundResult | None:
        """The last closed round before the current one, whole."""
        earlier = [r for r in self.results if r < self.current]
        return self.results[max(earlier)] if earlier else None

    def me(self, node: str) -> Member | None:
        """``node``'s part in the current round (None: not a member, or the round is open)."""
        result = self.result if self.closed is not None else None
        return result.member(node) if result is not None else None

    def peers(self, node: str) -> tuple[Member, ...]:
        """``node``'s neighbours in the current round's rank order (the daemons it watches)."""
        result = self.result if self.closed is not None else None
        if result is None:
            return ()
        members = result.members
        index = next((i for i, m in enumerate(members) if m.node == node), None)
        if index is None or len(members) < 2:
            return ()
        around = {p.node: p for p in (members[index - 1], members[(index + 1) % len(members)])}
        return tuple(m for n, m in around.items() if n != node)

    def all_done(self) -> bool:
        """Every member of the current round reported ``done``: by name, or by count when the
        round was forgotten while it was read."""
        result = self.result if self.closed is not None else None
        if result is None:
            return super().all_done()
        return set(result.nodes) <= self.done_in(self.current)

    @property
    def may_still_run(self) -> frozenset[str]:
        """Members of the previous round whose workers may still run: not done, and their join
        still there under their lease (one whose lease ended was fenced before it did, or died;
        joins only counted say nothing of whose: then every member not done)."""
        prev = self.previous_result
        if prev is None:
            return frozenset()
        if prev.round in self.join_counts:
            held = set(prev.nodes)
        else:
            held = {j.node for j in self.joins.get(prev.round, ())}
        return frozenset(held - self.done_in(prev.round))


# What an agent reads after a step asks for it (``agent.actions.ReadJob``).
AgentRead = MemberRead | RostersRead


@dataclass(frozen=True)
class Parts:
    """Some rounds' joins (oldest first) and done markers of one job, read alone, and the bad
    keys among them."""

    joins: Mapping[int, tuple[Join, ...]] = _empty()
    done: Mapping[int, frozenset[str]] = _empty()
    invalid: tuple[InvalidKey, ...] = ()

"""A job as etcd holds it, read at one revision: the model every decider works on.

``JobSnapshot.parse`` turns the keys of one read of ``jobs/<job>/``, its joins (``parts/<job>/``)
and its pending notes (``notes/<job>/``), at one revision, into typed records and never raises: a key
that does not parse, does not validate or should not exist is recorded in ``invalid``. A closed
round is its head (``heads``); its members are in ``results`` only when the read covered every
assignment of the job (``rosters``: a round's leader) or one round's were read on demand
(``rosterread``: ``status <job>``); a member's own assignment is read alone (``node``, ``me``):
O(1) bytes for a member, whatever the job's size. The scan's read of every job carries heads only,
and no join (``joins_read``): what decides on them counts or reads them for one job.
(``elasticd.rendezvous.glance``: the small read a node waiting in an open round makes instead.)
Pure: no etcd client (``elasticd.rendezvous.store`` does the reading)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from elasticd.decode import DecodeError, decode, parse_json
from elasticd.errors import InvalidSpec
from elasticd.etcd.keyref import KeyKind, KeyRef
from elasticd.etcd.keys import Keys
from elasticd.etcd.types import KeyValue
from elasticd.rendezvous.model import (
    Assignment,
    DoneRecord,
    DrainRecord,
    FinalRecord,
    Join,
    LeadRecord,
    LeftRecord,
    Member,
    NodeStatus,
    RoundHead,
    RoundInfo,
    RoundResult,
    WaitingRecord,
    pending_note,
)
from elasticd.rendezvous.roster import assemble, bounded, own
from elasticd.terms.head import JobHead, parse_head

T = TypeVar("T")
REQUIRED = (KeyKind.SPEC, KeyKind.ROUND, KeyKind.RESTARTS)  # written together at submit
MAX_RESTARTS_VALUE = 2**31 - 1


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


@dataclass
class JobSnapshot:
    """Everything etcd holds about one job, as of one revision.

    A job with an invalid key has ended (``ended``): the janitor records it as FAILED, and no
    agent acts on it meanwhile.
    """

    job_id: str
    head: JobHead | None = None  # ``jobs/<job>/spec``; the full spec is no part of a snapshot
    round: RoundInfo | None = None
    round_mod: int = 0
    restarts: int = 0
    restarts_mod: int = 0
    final: FinalRecord | None = None
    final_mod: int = 0
    heads: dict[int, RoundHead] = field(default_factory=dict)  # closed rounds, as every node reads them
    results: dict[int, RoundResult] = field(default_factory=dict)  # closed rounds whole (``rosters``)
    assigned: dict[int, dict[str, Assignment]] = field(default_factory=dict)  # as read, by round and node
    rosters: bool = False  # the read covered every assignment: ``results`` holds each closed round
    node: str = ""  # whose own assignment of the current round the read covered ("": none)
    joins: dict[int, list[Join]] = field(default_factory=dict)
    done: dict[int, set[str]] = field(default_factory=dict)
    left: dict[int, set[str]] = field(default_factory=dict)  # stopped for good before round r
    leads: dict[int, str] = field(default_factory=dict)  # each round's leader, by its lead key
    waiting: dict[str, WaitingRecord] = field(default_factory=dict)
    node_status: dict[str, NodeStatus] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)
    drains: dict[str, DrainRecord] = field(default_factory=dict)  # nodes asked to leave this job
    last_join_revision: int = 0
    join_counts: dict[int, int] = field(default_factory=dict)  # rounds whose joins were only counted
    # False: the read covered no join nor done marker (the read of every job): ``joins``,
    # ``current_joins``, ``done`` and ``all_done`` say nothing, and what needs them reads them for
    # this job (``admitter``, ``janitor``, ``status``).
    joins_read: bool = True
    invalid: list[InvalidKey] = field(default_factory=list)
    # How many keys the job has under jobs/<job>/ (0: no such job). Parts alone make no job: they
    # are under their nodes' leases, and a job's removal deletes them first.
    found: int = 0

    @property
    def current(self) -> int:
        return self.round.round if self.round else 0

    def head_of(self, round_no: int) -> RoundHead | None:
        head = self.heads.get(round_no)
        if head is None and round_no in self.results:  # a snapshot built whole (tests)
            return self.results[round_no].head()
        return head

    @property
    def closed(self) -> RoundHead | None:
        """The current round's head: the round closed (None: it is open)."""
        return self.head_of(self.current)

    @property
    def result(self) -> RoundResult | None:
        """The current round whole: only from a read that covered the rosters (``rosters``)."""
        return self.results.get(self.current)

    def me(self, node: str) -> Member | None:
        """``node``'s part in the current round (None: not a member, or the round is open); from
        the round whole, or from ``node``'s own assignment the read covered."""
        head = self.closed
        if head is None:
            return None
        if self.current in self.results:
            return self.results[self.current].member(node)
        found = own(head, self.assigned.get(self.current, {}).get(node))
        return found.member if found is not None else None

    def peers(self, node: str) -> tuple[Member, ...]:
        """``node``'s neighbours in the current round's rank order (the daemons it watches)."""
        head = self.closed
        if head is None:
            return ()
        if self.current in self.results:
            members = self.results[self.current].members
            index = next((i for i, m in enumerate(members) if m.node == node), None)
            if index is None or len(members) < 2:
                return ()
            around = {p.node: p for p in (members[index - 1], members[(index + 1) % len(members)])}
            return tuple(m for n, m in around.items() if n != node)
        found = own(head, self.assigned.get(self.current, {}).get(node))
        return found.peers if found is not None else ()

    def all_done(self) -> bool:
        """Every member of the current round reported ``done`` (by name when the round is read
        whole, else by count: only members write ``done``)."""
        head, done = self.closed, self.done.get(self.current, set())
        if head is None:
            return False
        if self.current in self.results:
            return set(self.results[self.current].nodes) <= done
        return len(done) >= head.size

    @property
    def current_joins(self) -> list[Join]:
        return self.joins.get(self.current, [])

    @property
    def previous_head(self) -> RoundHead | None:
        earlier = [r for r in {*self.heads, *self.results} if r < self.current]
        return self.head_of(max(earlier)) if earlier else None

    @property
    def previous_result(self) -> RoundResult | None:
        """The last closed round before the current one, whole (read with the rosters)."""
        earlier = [r for r in self.results if r < self.current]
        return self.results[max(earlier)] if earlier else None

    @property
    def may_still_run(self) -> set[str]:
        """Members of the previous round whose workers may still run: not done, and their join
        still there under their lease (one whose lease ended was fenced before it did, or died;
        joins only counted say nothing of whose: then every member not done). Needs the rosters
        (a round's leader reads them)."""
        prev = self.previous_result
        if prev is None:
            return set()
        if prev.round in self.join_counts:
            held = set(prev.nodes)
        else:
            held = {j.node for j in self.joins.get(prev.round, [])}
        return held - self.done.get(prev.round, set())

    @property
    def ended(self) -> bool:
        """The job is over: it has a final record, or a record nothing sound can be built on."""
        return self.final is not None or bool(self.invalid)

    @property
    def final_invalid(self) -> InvalidKey | None:
        """The bad ``final`` record, if that is one of the invalid keys."""
        return next((k for k in self.invalid if k.key.endswith(f"/{self.job_id}/final")), None)

    @classmethod
    def parse(
        cls,
        keys: Keys,
        job_id: str,
        kvs: list[KeyValue],
        cache: RecordCache | None = None,
        *,
        rosters: bool = False,
        node: str = "",
        with_joins: bool = True,
    ) -> JobSnapshot:
        """``rosters``: ``kvs`` hold every assignment of the job (each closed round is assembled
        whole, and one that does not make its head is invalid); ``node``: they hold that node's
        own assignment of the current round; ``with_joins=False``: they hold no join (``joins_read``)."""
        snap = cls(job_id, rosters=rosters, node=node, joins_read=with_joins)
        base = keys.job(job_id)
        seen = {kv.key[len(base) :] for kv in kvs if kv.key.startswith(base)}
        for kv in kvs:
            snap.found += kv.key.startswith(base)
            try:
                snap._take(keys.parse(kv.key), kv, cache)
            except (DecodeError, InvalidSpec) as exc:
                why = exc.message if isinstance(exc, InvalidSpec) else str(exc)
                snap.invalid.append(InvalidKey(keys.relative(kv.key), why[:300], kv.mod_revision))
        if snap.found:
            missing = [kind.value for kind in REQUIRED if kind.value not in seen]
            snap.invalid.extend(InvalidKey(keys.relative(base) + leaf, "missing", 0) for leaf in missing)
        if rosters:
            snap._assemble(keys)
        snap.invalid.sort(key=lambda k: k.key)
        for joins in snap.joins.values():
            joins.sort(key=lambda j: j.create_revision)
        snap.last_join_revision = max((j.create_revision for j in snap.current_joins), default=0)
        return snap

    def _assemble(self, keys: Keys) -> None:
        """Each closed round whole, from its head and its assignments (``roster.assemble``)."""
        for r, head in self.heads.items():
            where = keys.relative(keys.assignments(self.job_id, r))
            if any(k.key.startswith(where) for k in self.invalid):
                continue  # a bad assignment is named already
            try:
                self.results[r] = assemble(head, self.assigned.get(r, {}).values())
            except DecodeError as exc:
                self.invalid.append(InvalidKey(where, str(exc)[:300], 0))

    def _take(self, ref: KeyRef, kv: KeyValue, cache: RecordCache | None) -> None:
        """Read one key into the snapshot; DecodeError (or InvalidSpec) if it is not valid."""
        if ref.job != self.job_id:
            raise DecodeError("", "the key is not under this job")
        match ref.kind:  # the records every job has are decoded once per revision (``cache``)
            case KeyKind.SPEC:
                head = cache.get(kv, parse_head) if cache is not None else parse_head(kv.value)
                if head.id != self.job_id:
                    raise DecodeError("id", f"is {head.id!r}, not the job's own id")
                self.head = head
            case KeyKind.ROUND:
                info = cache.get(kv, _round) if cache is not None else _round(kv.value)
                self.round, self.round_mod = info, kv.mod_revision
            case KeyKind.WAITING | KeyKind.NODE_STATUS | KeyKind.PENDING | KeyKind.JOB_DRAIN:
                self._take_note(ref, parse_json(kv.value))
            case KeyKind.ASSIGNMENT:  # N of them in a read of the rosters: decoded once each
                got = cache.get(kv, _assignment) if cache is not None else _assignment(kv.value)
                if got.round != ref.round or got.member.node != ref.node:
                    raise DecodeError("member", f"is {got.member.node!r} of round {got.round}, not the key's")
                self.assigned.setdefault(got.round, {})[ref.node] = got
            case KeyKind.RESULT:  # bounded before it is decoded
                self._take_round_record(ref, kv, parse_json(bounded(kv.value, ref.kind.value)))
            case _:
                self._take_round_record(ref, kv, parse_json(kv.value))

    def _take_round_record(self, ref: KeyRef, kv: KeyValue, value: Any) -> None:
        """The job's restart count, its end, and its rounds' results, joins and ends."""
        r = ref.round if ref.round is not None else -1
        match ref.kind:
            case KeyKind.RESTARTS:
                restarts = decode(int, value)
                if not 0 <= restarts <= MAX_RESTARTS_VALUE:
                    raise DecodeError("", f"restarts must be 0..{MAX_RESTARTS_VALUE}")
                self.restarts, self.restarts_mod = restarts, kv.mod_revision
            case KeyKind.FINAL:
                self.final, self.final_mod = FinalRecord.from_json(value), kv.mod_revision
            case KeyKind.RESULT:
                head = RoundHead.from_json(value)
                if head.round != r:
                    raise DecodeError("round", f"is {head.round}, but the key is round {r}")
                self.heads[head.round] = head
            case KeyKind.JOIN:
                join = Join.from_json(value, kv.create_revision, kv.lease)
                if join.node != ref.node:
                    raise DecodeError("node", f"is {join.node!r}, but the key names {ref.node!r}")
                self.joins.setdefault(r, []).append(join)
            case KeyKind.DONE:
                decode(DoneRecord, value)
                self.done.setdefault(r, set()).add(ref.node)
            case KeyKind.LEAD:
                decode(LeadRecord, value)
                self.leads[r] = ref.node
            case KeyKind.LEFT:
                decode(LeftRecord, value)
                self.left.setdefault(r, set()).add(ref.node)
            case _:
                raise DecodeError("", "no such key: a job has no record of this name")

    def _take_note(self, ref: KeyRef, value: Any) -> None:
        """What one node says about itself in this job: waiting, its status, pending, draining."""
        match ref.kind:
            case KeyKind.WAITING:
                self.waiting[ref.node] = decode(WaitingRecord, value)
            case KeyKind.NODE_STATUS:
                self.node_status[ref.node] = NodeStatus.from_json(value)
            case KeyKind.PENDING:
                self.pending[ref.node] = pending_note(value)
            case KeyKind.JOB_DRAIN:
                self.drains[ref.node] = DrainRecord.from_json(value)


def _round(raw: bytes) -> RoundInfo:
    return RoundInfo.from_json(parse_json(raw))


def _assignment(raw: bytes) -> Assignment:
    return Assignment.from_json(parse_json(bounded(raw, "an assignment")))


Signature = tuple[tuple[str, int], ...]  # a job's keys and their mod revisions, in key order


class RecordCache:
    """Decoded records by key and mod revision, and whole snapshots by the keys and revisions they
    were parsed from, so that a read of every job parses only what changed since the last one (a
    thousand pending jobs, at every scan and every ``status`` refresh).

    Bounded: ``retain`` keeps only the last read's keys and jobs, and no more than ``limit`` of
    each are held. Records are frozen, and a snapshot handed out from here is shared by every
    reader of that read (``JobManager``'s scan and ``status``): they treat it as read-only."""

    def __init__(self, limit: int = 20_000) -> None:
        self._held: dict[str, tuple[int, Any]] = {}
        self._jobs: dict[str, tuple[Signature, JobSnapshot]] = {}
        self._limit = limit
        self.decoded = 0  # records decoded (not found here): what the tests count

    def snapshot(self, keys: Keys, job_id: str, kvs: list[KeyValue]) -> JobSnapshot:
        """``JobSnapshot.parse`` of ``kvs`` (the job's keys under ``jobs/`` and ``notes/``: its
        rounds' heads, not their members nor their joins), or the same snapshot as last time if
        none changed."""
        signature = tuple((kv.key, kv.mod_revision) for kv in kvs)
        held = self._jobs.get(job_id)
        if held is not None and held[0] == signature:
            return held[1]
        snap = JobSnapshot.parse(keys, job_id, kvs, self, with_joins=False)
        if len(self._jobs) < self._limit or job_id in self._jobs:
            self._jobs[job_id] = (signature, snap)
        return snap

    def get(self, kv: KeyValue, decoder: Callable[[bytes], T]) -> T:
        held = self._held.get(kv.key)
        if held is not None and held[0] == kv.mod_revision:
            return cast(T, held[1])
        record = decoder(kv.value)  # raises for a bad one, which is not held
        self.decoded += 1
        if len(self._held) < self._limit or kv.key in self._held:
            self._held[kv.key] = (kv.mod_revision, record)
        return record

    def retain(self, keys: set[str], jobs: set[str]) -> None:
        """Forget every key not in ``keys`` and every job not in ``jobs`` (the last read's)."""
        self._held = {k: v for k, v in self._held.items() if k in keys}
        self._jobs = {j: v for j, v in self._jobs.items() if j in jobs}

    def __len__(self) -> int:
        return len(self._held)


def parse_jobs(
    keys: Keys, kvs: list[KeyValue], cache: RecordCache | None = None
) -> tuple[dict[str, JobSnapshot], dict[str, list[str]]]:
    """Every job in one read of ``jobs/`` and ``notes/`` (one revision), by id (no join read:
    ``joins_read``); and the keys of notes of no job: ``notes/<job>/`` of a job that has no
    records, put after its removal (a note a leaving node wrote late). Those make no job; their
    node's lease lasts as long as its daemon, so the janitor deletes them. With ``cache``,
    records unchanged since the cache's last read are not decoded again, and the cache keeps only
    this read's keys."""
    by_job: dict[str, list[KeyValue]] = {}
    for kv in kvs:
        job = keys.job_of(kv.key)
        if job is not None:
            by_job.setdefault(job, []).append(kv)
    if cache is None:
        snaps = [JobSnapshot.parse(keys, job, items, with_joins=False) for job, items in by_job.items()]
    else:
        snaps = [cache.snapshot(keys, job, items) for job, items in by_job.items()]
        cache.retain({kv.key for kv in kvs}, set(by_job))
    strays = {s.job_id: [kv.key for kv in by_job[s.job_id]] for s in snaps if not s.found}
    return {s.job_id: s for s in snaps if s.found}, strays

"""One read of a job's keys, parsed into the shape that read has (``elasticd.rendezvous.jobread``).

The keys of one read of ``jobs/<job>/``, its parts (``parts/<job>/``), its pending notes
(``notes/<job>/``) and any assignments read with them, at one revision, become typed records,
and parsing never raises: a key that does not parse, does not validate or should not exist is
recorded in ``invalid``. The records are gathered in a private, mutable ``_Found``, then frozen
into the shape the caller read (``parse_job``, ``parse_joins``, ``parse_member``,
``parse_rosters``, ``parse_parts``): nothing changes a read after that. The daemon's copy of
every job (``manager/clustercopy.py``) parses a job again only when its keys changed.
Pure: no etcd client (``elasticd.rendezvous.storeread`` does the reading)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from elasticd.decode import DecodeError, decode, parse_json
from elasticd.errors import InvalidSpec
from elasticd.etcd.keyref import KeyKind, KeyRef
from elasticd.etcd.keys import Keys
from elasticd.etcd.types import KeyValue
from elasticd.rendezvous.jobread import (
    EMPTY,
    Frozen,
    InvalidKey,
    JobRead,
    JoinsRead,
    MemberRead,
    Parts,
    RostersRead,
    fields_of,
)
from elasticd.rendezvous.model import (
    Assignment,
    DoneRecord,
    DrainRecord,
    FinalRecord,
    Join,
    LeadRecord,
    LeftRecord,
    NodeStatus,
    RoundHead,
    RoundInfo,
    RoundResult,
    WaitingRecord,
    pending_note,
)
from elasticd.rendezvous.roster import assemble, bounded
from elasticd.terms.head import JobHead, parse_head

K = TypeVar("K")
V = TypeVar("V")
REQUIRED = (KeyKind.SPEC, KeyKind.ROUND, KeyKind.RESTARTS)  # written together at submit
MAX_RESTARTS_VALUE = 2**31 - 1


def frozen(mapping: Mapping[K, V]) -> Mapping[K, V]:
    """A read-only copy of ``mapping`` (the shared empty one when it is empty)."""
    return Frozen(mapping) if mapping else EMPTY


class _Found:
    """What the keys of one read hold, gathered before they are frozen into the read's shape."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.head: JobHead | None = None
        self.round: RoundInfo | None = None
        self.round_mod = 0
        self.restarts = 0
        self.restarts_mod = 0
        self.final: FinalRecord | None = None
        self.final_mod = 0
        self.heads: dict[int, RoundHead] = {}
        self.assigned: dict[int, dict[str, Assignment]] = {}  # by round and node
        self.joins: dict[int, list[Join]] = {}
        self.done: dict[int, set[str]] = {}
        self.left: dict[int, set[str]] = {}
        self.leads: dict[int, str] = {}
        self.waiting: dict[str, WaitingRecord] = {}
        self.node_status: dict[str, NodeStatus] = {}
        self.pending: dict[str, str] = {}
        self.drains: dict[str, DrainRecord] = {}
        self.invalid: list[InvalidKey] = []
        self.found = 0

    def job(self) -> JobRead:
        return JobRead(**self._job_fields())

    def _job_fields(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "head": self.head,
            "round": self.round,
            "round_mod": self.round_mod,
            "restarts": self.restarts,
            "restarts_mod": self.restarts_mod,
            "final": self.final,
            "final_mod": self.final_mod,
            "heads": frozen(self.heads),
            "left": frozen({r: frozenset(n) for r, n in self.left.items()}),
            "waiting": frozen(self.waiting),
            "node_status": frozen(self.node_status),
            "pending": frozen(self.pending),
            "drains": frozen(self.drains),
            "invalid": tuple(sorted(self.invalid, key=lambda k: k.key)),
            "found": self.found,
        }

    def joins_fields(self, counts: Mapping[int, int]) -> dict[str, Any]:
        joins = {r: tuple(sorted(js, key=lambda j: j.create_revision)) for r, js in self.joins.items()}
        return self._job_fields() | {
            "joins": frozen(joins),
            "done": self._done(),
            "leads": frozen(self.leads),
            "join_counts": frozen(counts),
        }

    def _done(self) -> Mapping[int, frozenset[str]]:
        return frozen({r: frozenset(n) for r, n in self.done.items()})

    def parts(self) -> Parts:
        joins = {r: tuple(sorted(js, key=lambda j: j.create_revision)) for r, js in self.joins.items()}
        return Parts(frozen(joins), self._done(), tuple(sorted(self.invalid, key=lambda k: k.key)))

    def assemble(self, keys: Keys) -> dict[int, RoundResult]:
        """Each closed round whole, from its head and its assignments (``roster.assemble``); an
        assignment that does not make its head is invalid."""
        results: dict[int, RoundResult] = {}
        for r, head in self.heads.items():
            where = keys.relative(keys.assignments(self.job_id, r))
            if any(k.key.startswith(where) for k in self.invalid):
                continue  # a bad assignment is named already
            try:
                results[r] = assemble(head, self.assigned.get(r, {}).values())
            except DecodeError as exc:
                self.invalid.append(InvalidKey(where, str(exc)[:300], 0))
        return results

    def take(self, keys: Keys, kvs: Iterable[KeyValue]) -> _Found:
        """Every key of ``kvs``; each one that is not valid is recorded in ``invalid``."""
        base = keys.job(self.job_id)
        kvs = list(kvs)
        seen = {kv.key[len(base) :] for kv in kvs if kv.key.startswith(base)}
        for kv in kvs:
            self.found += kv.key.startswith(base)
            try:
                self._take(keys.parse(kv.key), kv)
            except (DecodeError, InvalidSpec) as exc:
                why = exc.message if isinstance(exc, InvalidSpec) else str(exc)
                self.invalid.append(InvalidKey(keys.relative(kv.key), why[:300], kv.mod_revision))
        if self.found:
            missing = [kind.value for kind in REQUIRED if kind.value not in seen]
            self.invalid.extend(InvalidKey(keys.relative(base) + leaf, "missing", 0) for leaf in missing)
        return self

    def _take(self, ref: KeyRef, kv: KeyValue) -> None:
        """Read one key; DecodeError (or InvalidSpec) if it is not valid."""
        if ref.job != self.job_id:
            raise DecodeError("", "the key is not under this job")
        match ref.kind:
            case KeyKind.SPEC:
                head = parse_head(kv.value)
                if head.id != self.job_id:
                    raise DecodeError("id", f"is {head.id!r}, not the job's own id")
                self.head = head
            case KeyKind.ROUND:
                info = _round(kv.value)
                self.round, self.round_mod = info, kv.mod_revision
            case KeyKind.WAITING | KeyKind.NODE_STATUS | KeyKind.PENDING | KeyKind.JOB_DRAIN:
                self._take_note(ref, parse_json(kv.value))
            case KeyKind.ASSIGNMENT:
                got = _assignment(kv.value)
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


def parse_job(keys: Keys, job_id: str, kvs: Iterable[KeyValue]) -> JobRead:
    """The job's records and notes in ``kvs`` (the read of every job's part of it: no join)."""
    return _Found(job_id).take(keys, kvs).job()


def parse_joins(
    keys: Keys, job_id: str, kvs: Iterable[KeyValue], counts: Mapping[int, int] = EMPTY
) -> JoinsRead:
    """The job with its parts; ``counts``: the rounds whose joins were only counted, and how many."""
    return JoinsRead(**_Found(job_id).take(keys, kvs).joins_fields(counts))


def parse_member(
    keys: Keys, job_id: str, kvs: Iterable[KeyValue], node: str, counts: Mapping[int, int] = EMPTY
) -> MemberRead:
    """The job with its parts and ``node``'s own assignment of the current round, where ``kvs``
    hold it (``node`` empty: they hold none)."""
    found = _Found(job_id).take(keys, kvs)
    current = found.round.round if found.round is not None else 0
    mine = found.assigned.get(current, {}).get(node) if node else None
    return MemberRead(**found.joins_fields(counts), node=node, assignment=mine)


def parse_rosters(
    keys: Keys, job_id: str, kvs: Iterable[KeyValue], counts: Mapping[int, int] = EMPTY
) -> RostersRead:
    """The job with its parts and every closed round whole, from ``kvs`` holding every assignment
    of the job (a round whose assignments do not make its head is invalid)."""
    found = _Found(job_id).take(keys, kvs)
    results = found.assemble(keys)
    return RostersRead(**found.joins_fields(counts), results=frozen(results))


def with_rosters(
    read: JoinsRead, results: Mapping[int, RoundResult], bad: Iterable[InvalidKey]
) -> RostersRead:
    """``read`` with the closed rounds ``results`` holds whole, and the bad keys found reading them."""
    invalid = tuple(sorted([*read.invalid, *bad], key=lambda k: k.key))
    return RostersRead(**fields_of(read, JoinsRead) | {"invalid": invalid}, results=frozen(results))


def with_parts(read: JobRead, round_no: int, parts: Parts) -> JoinsRead:
    """``read`` (of every job: no part) with round ``round_no``'s joins and done markers, read alone."""
    invalid = tuple(sorted([*read.invalid, *parts.invalid], key=lambda k: k.key))
    joins = frozen({round_no: parts.joins.get(round_no, ())})
    done = frozen({round_no: parts.done.get(round_no, frozenset())})
    return JoinsRead(**fields_of(read) | {"invalid": invalid}, joins=joins, done=done)


def parse_parts(keys: Keys, job_id: str, kvs: Iterable[KeyValue]) -> Parts:
    """Some rounds' joins and done markers alone (no record of the job)."""
    return _Found(job_id).take(keys, kvs).parts()


def parse_assignments(
    keys: Keys, job_id: str, kvs: Iterable[KeyValue]
) -> tuple[dict[int, dict[str, Assignment]], tuple[InvalidKey, ...]]:
    """The assignments in ``kvs``, by round and node, each checked against its key; the bad ones."""
    found = _Found(job_id).take(keys, kvs)
    return found.assigned, tuple(sorted(found.invalid, key=lambda k: k.key))


def parse_jobs(keys: Keys, kvs: list[KeyValue]) -> tuple[dict[str, JobRead], dict[str, list[str]]]:
    """Every job in one read of ``jobs/`` and ``notes/`` (one revision), by id (no join read);
    and the keys of notes of no job: ``notes/<job>/`` of a job that has no records, put after its
    removal (a note a leaving node wrote late). Those make no job; their node's lease lasts as
    long as its daemon, so the janitor deletes them."""
    by_job: dict[str, list[KeyValue]] = {}
    for kv in kvs:
        job = keys.job_of(kv.key)
        if job is not None:
            by_job.setdefault(job, []).append(kv)
    reads = [parse_job(keys, job, items) for job, items in by_job.items()]
    strays = {r.job_id: [kv.key for kv in by_job[r.job_id]] for r in reads if not r.found}
    return {r.job_id: r for r in reads if r.found}, strays

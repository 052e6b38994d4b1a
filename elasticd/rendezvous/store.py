"""A job's state in etcd: one consistent snapshot per read, and the few writes that change it.

Reads are a single range request over ``jobs/<job>/`` (one revision, so a snapshot is never torn).
Every write that must not race is a transaction guarded by revisions (the fencing tokens):
- the job is created once (``create(spec) == 0``);
- a round's result is written once (``create(result) == 0``) and never after the job ended;
- the round advances only from the revision the caller saw (``mod(round)``), together with the
  restart counter (``mod(restarts)``), so concurrent observers of one event bump it once;
- the job ends once (``create(final) == 0``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from elasticd.decode import DecodeError, decode, parse_json
from elasticd.errors import InvalidSpec
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from elasticd.etcd.types import Compare, KeyValue, Put, Query
from elasticd.jobs.spec import JobSpec, valid_job_id, valid_node_id
from elasticd.jobs.state import EndReason, JobState
from elasticd.rendezvous.model import (
    MAX_ROUND,
    DoneRecord,
    DrainRecord,
    FinalRecord,
    Join,
    LeftRecord,
    NodeStatus,
    RoundInfo,
    RoundReason,
    RoundResult,
    WaitingRecord,
    pending_note,
)

REQUIRED = ("spec", "round", "restarts")  # written together at submit: a job never lacks one
MAX_RESTARTS_VALUE = 2**31 - 1


@dataclass(frozen=True)
class InvalidKey:
    """A key of a job that did not parse or validate; ``key`` is relative to the daemon's prefix."""

    key: str
    why: str
    revision: int = 0  # its mod revision (0: a missing key), so that it is reported once

    def describe(self) -> str:
        return f"invalid record at {self.key}: {self.why}"


@dataclass
class JobSnapshot:
    """Everything etcd holds about one job, as of one revision.

    Built by ``parse``, which never raises: a key that does not parse, does not validate or should
    not exist is recorded in ``invalid`` and the rest is read as usual. A job with an invalid key
    has ended (``ended``): the manager records it as FAILED, and no agent acts on it meanwhile.
    """

    job_id: str
    spec: JobSpec | None = None
    round: RoundInfo | None = None
    round_mod: int = 0
    restarts: int = 0
    restarts_mod: int = 0
    final: FinalRecord | None = None
    results: dict[int, RoundResult] = field(default_factory=dict)
    joins: dict[int, list[Join]] = field(default_factory=dict)
    done: dict[int, set[str]] = field(default_factory=dict)
    left: dict[int, set[str]] = field(default_factory=dict)  # stopped for good before round r
    waiting: dict[str, WaitingRecord] = field(default_factory=dict)
    node_status: dict[str, NodeStatus] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)
    drains: dict[str, DrainRecord] = field(default_factory=dict)  # nodes asked to leave this job
    last_join_revision: int = 0
    join_counts: dict[int, int] = field(default_factory=dict)  # rounds whose joins were only counted
    invalid: list[InvalidKey] = field(default_factory=list)
    found: int = 0  # how many keys the job has (0: no such job)

    @property
    def current(self) -> int:
        return self.round.round if self.round else 0

    @property
    def result(self) -> RoundResult | None:
        return self.results.get(self.current)

    @property
    def current_joins(self) -> list[Join]:
        return self.joins.get(self.current, [])

    @property
    def previous_result(self) -> RoundResult | None:
        earlier = [r for r in self.results if r < self.current]
        return self.results[max(earlier)] if earlier else None

    @property
    def ended(self) -> bool:
        """The job is over: it has a final record, or a record nothing sound can be built on."""
        return self.final is not None or bool(self.invalid)

    @property
    def final_invalid(self) -> InvalidKey | None:
        """The bad ``final`` record, if that is one of the invalid keys."""
        return next((k for k in self.invalid if k.key.endswith(f"/{self.job_id}/final")), None)

    @classmethod
    def parse(cls, keys: Keys, job_id: str, kvs: list[KeyValue]) -> JobSnapshot:
        snap = cls(job_id)
        base = keys.job(job_id)
        shown = base[len(keys.prefix) + 1 :]  # "jobs/<job>/": keys are named relative to the prefix
        seen = set()
        for kv in kvs:
            leaf = kv.key[len(base) :] if kv.key.startswith(base) else kv.key
            snap.found += 1
            seen.add(leaf)
            try:
                if not valid_job_id(job_id):
                    raise DecodeError("", "the job id in the key is not a valid job id")
                snap._take(leaf, kv)
            except (DecodeError, InvalidSpec) as exc:
                why = exc.message if isinstance(exc, InvalidSpec) else str(exc)
                snap.invalid.append(InvalidKey(shown + leaf, why[:300], kv.mod_revision))
        if snap.found:
            missing = [leaf for leaf in REQUIRED if leaf not in seen]
            snap.invalid.extend(InvalidKey(shown + leaf, "missing", 0) for leaf in missing)
        snap.invalid.sort(key=lambda k: k.key)
        for joins in snap.joins.values():
            joins.sort(key=lambda j: j.create_revision)
        snap.last_join_revision = max((j.create_revision for j in snap.current_joins), default=0)
        return snap

    def _take(self, leaf: str, kv: KeyValue) -> None:
        """Read one key into the snapshot; DecodeError (or InvalidSpec) if it is not valid."""
        value = parse_json(kv.value)
        match leaf.split("/"):
            case ["spec"]:
                spec = JobSpec.from_json(value)
                if spec.id != self.job_id:
                    raise DecodeError("id", f"is {spec.id!r}, not the job's own id")
                self.spec = spec
            case ["round"]:
                self.round, self.round_mod = RoundInfo.from_json(value), kv.mod_revision
            case ["restarts"]:
                restarts = decode(int, value)
                if not 0 <= restarts <= MAX_RESTARTS_VALUE:
                    raise DecodeError("", f"restarts must be 0..{MAX_RESTARTS_VALUE}")
                self.restarts, self.restarts_mod = restarts, kv.mod_revision
            case ["final"]:
                self.final = FinalRecord.from_json(value)
            case ["rdzv", r, "result"]:
                result = RoundResult.from_json(value)
                if result.round != _round_no(r):
                    raise DecodeError("round", f"is {result.round}, but the key is round {r}")
                self.results[result.round] = result
            case ["rdzv", r, "join", node]:
                join = Join.from_json(value, kv.create_revision, kv.lease)
                if join.node != _node(node):
                    raise DecodeError("node", f"is {join.node!r}, but the key names {node!r}")
                self.joins.setdefault(_round_no(r), []).append(join)
            case ["rdzv", r, "done", node]:
                decode(DoneRecord, value)
                self.done.setdefault(_round_no(r), set()).add(_node(node))
            case ["rdzv", r, "left", node]:
                decode(LeftRecord, value)
                self.left.setdefault(_round_no(r), set()).add(_node(node))
            case ["waiting", node]:
                self.waiting[_node(node)] = decode(WaitingRecord, value)
            case ["nodes", node]:
                self.node_status[_node(node)] = NodeStatus.from_json(value)
            case ["pending", node]:
                self.pending[_node(node)] = pending_note(value)
            case ["drain", node]:
                self.drains[_node(node)] = DrainRecord.from_json(value)
            case _:
                raise DecodeError("", "no such key: a job has no record of this name")


def _round_no(text: str) -> int:
    """A round in a key: a plain non-negative decimal, as ``Keys`` writes it."""
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0") or len(text) > 10:
        raise DecodeError("", f"{text[:20]!r} in the key is not a round number")
    number = int(text)
    if number > MAX_ROUND:
        raise DecodeError("", f"round {number} in the key is out of range")
    return number


def _node(text: str) -> str:
    if not valid_node_id(text):
        raise DecodeError("", f"{text[:80]!r} in the key is not a node id")
    return text


@dataclass(frozen=True)
class Glance:
    """What a node waiting in an open round needs, read in one small request (O(1), not O(N))."""

    round: int
    ended: bool
    closed: bool
    leader: str | None
    joined: bool

    def quiet(self, round_no: int, node: str) -> bool:
        """Nothing for ``node`` to do yet: the round is open, it joined, someone else leads."""
        return (
            self.round == round_no
            and not self.ended
            and not self.closed
            and self.joined
            and self.leader != node
        )


class JobStore:
    def __init__(self, etcd: EtcdClient, keys: Keys, job_id: str) -> None:
        self._etcd = etcd
        self._keys = keys
        self.job_id = job_id

    def snapshot(self, joins_counted_of: int | None = None) -> JobSnapshot:
        """The whole job; with ``joins_counted_of=r``, round r's join keys are only counted
        (a running member needs how many are left, not N records: O(1) instead of O(N))."""
        prefix = self._keys.job(self.job_id)
        if joins_counted_of is None:
            return JobSnapshot.parse(self._keys, self.job_id, self._etcd.get_prefix(prefix))
        joins = self._keys.joins(self.job_id, joins_counted_of)
        after = joins[:-1] + chr(ord(joins[-1]) + 1)
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        before, rest, counted = self._etcd.read_many(
            [Query(prefix, end=joins), Query(after, end=end), Query(joins, prefix=True, count_only=True)]
        )
        snap = JobSnapshot.parse(self._keys, self.job_id, before.kvs + rest.kvs)
        snap.join_counts[joins_counted_of] = counted.count
        return snap

    def glance(self, round_no: int, node: str) -> Glance:
        k, j = self._keys, self.job_id
        round_kv, final, result, oldest, mine = self._etcd.read_many(
            [
                Query(k.job_round(j)),
                Query(k.job_final(j)),
                Query(k.result(j, round_no)),
                Query(k.joins(j, round_no), prefix=True, oldest_only=True),
                Query(k.join(j, round_no, node)),
            ]
        )
        try:
            info = RoundInfo.from_json(parse_json(round_kv.kvs[0].value)) if round_kv.kvs else None
            lead = Join.from_json(parse_json(oldest.kvs[0].value)).node if oldest.kvs else None
        except DecodeError:  # not quiet: the full read that follows reports the bad key
            return Glance(-1, False, False, None, False)
        return Glance(
            round=info.round if info else -1,
            ended=bool(final.kvs),
            closed=bool(result.kvs),
            leader=lead,
            joined=bool(mine.kvs),
        )

    # -- creation and the end ------------------------------------------------------------------
    def create(self, spec: JobSpec) -> bool:
        k, j = self._keys, spec.id
        info = RoundInfo(0, RoundReason.START, time.time())
        return self._etcd.txn(
            [Compare(k.job_spec(j), "create", 0)],
            [
                Put(k.job_spec(j), spec.to_json()),
                Put(k.job_round(j), info.to_json()),
                Put(k.job_restarts(j), 0),
            ],
        )

    def finalize(
        self, state: JobState, code: EndReason, reason: str, failure: dict[str, Any] | None = None
    ) -> bool:
        """End the job once; the first caller wins and later ones change nothing."""
        final = FinalRecord(state, reason, code, failure, time.time())
        key = self._keys.job_final(self.job_id)
        return self._etcd.txn([Compare(key, "create", 0)], [Put(key, final.to_json())])

    def fail_invalid(self, snap: JobSnapshot) -> bool:
        """End a job that has an invalid record FAILED, naming the (first) bad key. A bad ``final``
        itself is replaced instead. True if this call wrote the final record."""
        bad_final = snap.final_invalid
        if bad_final is not None:
            return self.replace_final(bad_final, bad_final.describe())
        return self.finalize(JobState.FAILED, EndReason.INVALID_RECORD, snap.invalid[0].describe())

    def replace_final(self, bad: InvalidKey, reason: str) -> bool:
        """Overwrite a ``final`` that is not a record (``bad``, read at its revision) with a FAILED
        one: the job has ended either way, and a readable record stops every reader from
        re-reporting it. Only that exact revision is replaced, so a real end is never lost."""
        final = FinalRecord(JobState.FAILED, reason, EndReason.INVALID_RECORD, None, time.time())
        key = self._keys.job_final(self.job_id)
        return self._etcd.txn([Compare(key, "mod", bad.revision)], [Put(key, final.to_json())])

    # -- rounds --------------------------------------------------------------------------------
    def join(self, round_no: int, join: Join, lease: int) -> None:
        self._etcd.put_json(self._keys.join(self.job_id, round_no, join.node), join.to_json(), lease)

    def withdraw(self, round_no: int, node: str) -> None:
        self._etcd.delete(self._keys.join(self.job_id, round_no, node))

    def close(self, result: RoundResult) -> bool:
        k, j = self._keys, self.job_id
        key = k.result(j, result.round)
        return self._etcd.txn(
            [Compare(key, "create", 0), Compare(k.job_final(j), "create", 0)], [Put(key, result.to_json())]
        )

    def bump(self, snap: JobSnapshot, info: RoundInfo, spend: bool) -> bool:
        """Open round ``info.round`` if the round is still the one ``snap`` saw. True if we did."""
        k, j = self._keys, self.job_id
        puts = [Put(k.job_round(j), info.to_json())]
        if spend:
            puts.append(Put(k.job_restarts(j), snap.restarts + 1))
        return self._etcd.txn(
            [
                Compare(k.job_round(j), "mod", snap.round_mod),
                Compare(k.job_restarts(j), "mod", snap.restarts_mod),
                Compare(k.job_final(j), "create", 0),
            ],
            puts,
        )

    def mark_done(self, round_no: int, node: str) -> None:
        self._etcd.put_json(self._keys.done(self.job_id, round_no, node), {"at": time.time()})

    def join_of(self, round_no: int, node: str) -> Join | None:
        kv = self._etcd.get(self._keys.join(self.job_id, round_no, node))
        try:
            return Join.from_json(parse_json(kv.value), kv.create_revision, kv.lease) if kv else None
        except DecodeError:  # the job's next full read reports it
            return None

    def revoke(self, lease: int) -> None:
        """Revoke a dead peer's lease: its keys go at once, as if its TTL had run out."""
        self._etcd.revoke_lease(lease)

    def mark_left(self, round_no: int, node: str) -> None:
        """``node`` stopped its workers and will not join ``round_no``."""
        self._etcd.put_json(self._keys.left(self.job_id, round_no, node), {"at": time.time()})

    def forget_rounds_before(self, round_no: int) -> None:
        """Old rounds are history; keep the previous one (stable ranks need its result)."""
        for old in range(max(0, round_no - 4), round_no - 1):
            self._etcd.delete_prefix(self._keys.rounds(self.job_id, old))

    # -- per-node records ------------------------------------------------------------------------
    def set_waiting(self, node: str, lease: int) -> None:
        self._etcd.put_json(self._keys.waiting(self.job_id, node), {"at": time.time()}, lease)

    def clear_waiting(self, node: str) -> None:
        self._etcd.delete(self._keys.waiting(self.job_id, node))

    def put_node_status(self, node: str, status: dict[str, Any], lease: int) -> None:
        self._etcd.put_json(self._keys.node_status(self.job_id, node), status, lease)

    def note_pending(self, node: str, note: str | None, lease: int) -> None:
        key = self._keys.pending_note(self.job_id, node)
        if note is None:
            self._etcd.delete(key)
        else:
            self._etcd.put_json(key, note, lease)

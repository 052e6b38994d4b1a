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

from elasticd.etcd.client import Compare, EtcdClient, KeyValue, Put, Query
from elasticd.etcd.keys import Keys
from elasticd.jobs.spec import JobSpec
from elasticd.rendezvous.model import Join, RoundInfo, RoundReason, RoundResult


@dataclass
class JobSnapshot:
    """Everything etcd holds about one job, as of one revision."""

    job_id: str
    spec: JobSpec | None = None
    round: RoundInfo | None = None
    round_mod: int = 0
    restarts: int = 0
    restarts_mod: int = 0
    final: dict[str, Any] | None = None
    results: dict[int, RoundResult] = field(default_factory=dict)
    joins: dict[int, list[Join]] = field(default_factory=dict)
    done: dict[int, set[str]] = field(default_factory=dict)
    left: dict[int, set[str]] = field(default_factory=dict)  # stopped for good before round r
    waiting: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)
    drains: dict[str, dict[str, Any]] = field(default_factory=dict)  # nodes asked to leave this job
    last_join_revision: int = 0
    join_counts: dict[int, int] = field(default_factory=dict)  # rounds whose joins were only counted

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

    @classmethod
    def parse(cls, keys: Keys, job_id: str, kvs: list[KeyValue]) -> JobSnapshot:
        snap = cls(job_id)
        base = keys.job(job_id)
        for kv in kvs:
            parts = kv.key[len(base) :].split("/")
            value = kv.json()
            match parts:
                case ["spec"]:
                    snap.spec = JobSpec.from_json(value)
                case ["round"]:
                    snap.round, snap.round_mod = RoundInfo.from_json(value), kv.mod_revision
                case ["restarts"]:
                    snap.restarts, snap.restarts_mod = int(value), kv.mod_revision
                case ["final"]:
                    snap.final = value
                case ["rdzv", r, "result"]:
                    snap.results[int(r)] = RoundResult.from_json(value)
                case ["rdzv", r, "join", _]:
                    snap.joins.setdefault(int(r), []).append(
                        Join.from_json(value, kv.create_revision, kv.lease)
                    )
                case ["rdzv", r, "done", node]:
                    snap.done.setdefault(int(r), set()).add(node)
                case ["rdzv", r, "left", node]:
                    snap.left.setdefault(int(r), set()).add(node)
                case ["waiting", node]:
                    snap.waiting[node] = value
                case ["nodes", node]:
                    snap.node_status[node] = value
                case ["pending", node]:
                    snap.pending[node] = str(value)
                case ["drain", node]:
                    snap.drains[node] = value
        for joins in snap.joins.values():
            joins.sort(key=lambda j: j.create_revision)
        snap.last_join_revision = max((j.create_revision for j in snap.current_joins), default=0)
        return snap


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
        return Glance(
            round=int(round_kv.kvs[0].json()["round"]) if round_kv.kvs else -1,
            ended=bool(final.kvs),
            closed=bool(result.kvs),
            leader=oldest.kvs[0].json()["node"] if oldest.kvs else None,
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

    def finalize(self, state: str, reason: str, failure: dict[str, Any] | None = None) -> bool:
        """End the job once; the first caller wins and later ones change nothing."""
        final = {"state": state, "reason": reason, "failure": failure, "ended_at": time.time()}
        key = self._keys.job_final(self.job_id)
        return self._etcd.txn([Compare(key, "create", 0)], [Put(key, final)])

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
        return Join.from_json(kv.json(), kv.create_revision, kv.lease) if kv is not None else None

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

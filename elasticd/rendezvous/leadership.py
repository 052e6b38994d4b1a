"""Who leads an open round, known in O(log N) of etcd's work whatever the round's size: the lead
key, the join's own answer, and the sort they spare.

The round's leader is the node whose join is the oldest (``decider.leader``). etcd can answer
"the oldest join" only by reading and sorting every join of the round (a range sorted by create
revision ignores its limit), which a waiting member's glance asked every time it was woken: O(N)
per glance, O(N²) a round. So the leader, once a read of every join showed its own the oldest,
says so in its lead key (``claim``): guarded by that join (its create revision and its lease)
and put under the same lease, the key dies with the join, so it never names a node whose join is
gone; and no older join can appear later (create revisions only grow). A glance reads that
prefix's first key (at most one lives there). A join answers with a glance read in its own
transaction (``join``): every join it counts was created before it, so it is the oldest only if
it is the only one, and a joiner needs no sort either. Only a glance in an open round that no
node has claimed (its first moments, a leader gone) sorts the joins.

Reads of a glance are served by the member the client talks to (``Query.serializable``): a
stale glance only waits for the round's head, whose event comes from that same member. Blocking
calls over the ``KV`` seam (``store.KVJobStore`` runs them)."""

from __future__ import annotations

import time
from dataclasses import asdict

from elasticd.decode import DecodeError
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.types import Compare, Put, Query
from elasticd.rendezvous.glance import AN_OLDER_JOIN, Glance
from elasticd.rendezvous.model import Join, LeadRecord


def _queries(keys: Keys, job: str, round_no: int) -> list[Query]:
    """The job's round and end, whether round ``round_no`` closed, and its lead key."""
    return [
        Query(keys.job_round(job), serializable=True),
        Query(keys.job_final(job), serializable=True),
        Query(keys.result(job, round_no), count_only=True, serializable=True),  # O(N) bytes if read
        Query(keys.leads(job, round_no), prefix=True, first_only=True, serializable=True),
    ]


def glance(kv: KV, keys: Keys, job: str, round_no: int, node: str) -> Glance:
    """The small read of ``node`` waiting in round ``round_no``; the oldest join, sorted, only
    while the round is open and unclaimed."""
    queries = [*_queries(keys, job, round_no), Query(keys.join(job, round_no, node), serializable=True)]
    round_kv, final, result, lead, mine = kv.read_many(queries)
    leader: str | DecodeError | None = None
    if lead.kvs:
        leader = Glance.lead_of(keys, lead.kvs[0])
    elif not result.count:  # (a closed round needs no leader)
        oldest = kv.read_many([Query(keys.joins(job, round_no), prefix=True, oldest_only=True)])[0].kvs
        leader = Glance.join_of(oldest[0]) if oldest else None
    first = round_kv.kvs[0] if round_kv.kvs else None
    return Glance.parse(first, bool(final.kvs), result.count > 0, leader, bool(mine.kvs))


def join(kv: KV, keys: Keys, job: str, head_revision: int, round_no: int, me: Join, lease: int) -> Glance:
    """Put ``me`` under ``lease`` while the job's head is the one read last (``head_revision``;
    unguarded before any read), and answer with a glance from the same transaction: its leader
    is the lead key's node, else ``me`` when its join is the only one, else ``AN_OLDER_JOIN``.
    A join put again (a new lease) takes its lead key with it: the leader claims again after its
    next read. Not joined (the head changed): a glance that is never quiet."""
    guard = [Compare(keys.job_spec(job), "create", head_revision)] if head_revision else []
    put = Put(keys.join(job, round_no, me.node), me.to_json(), lease)
    reads = [*_queries(keys, job, round_no), Query(keys.joins(job, round_no), prefix=True, count_only=True)]
    found = kv.write_and_read(guard, [put], [keys.lead(job, round_no, me.node)], reads)
    if found is None:
        return Glance(-1, False, False, None, False)
    round_kv, final, result, lead, joins = found
    leader = Glance.lead_of(keys, lead.kvs[0]) if lead.kvs else None
    if leader is None and not result.count:
        leader = me.node if joins.count == 1 else AN_OLDER_JOIN
    first = round_kv.kvs[0] if round_kv.kvs else None
    return Glance.parse(first, bool(final.kvs), result.count > 0, leader, True)


def claim(kv: KV, keys: Keys, job: str, round_no: int, node: str, epoch: int, lease: int) -> bool:
    """``node`` leads round ``round_no``: its join (create revision ``epoch``, under ``lease``)
    was the oldest in a read of every join. False: that join changed (gone, or put again)."""
    key = keys.join(job, round_no, node)
    compare = [Compare(key, "create", epoch), Compare(key, "lease", lease)]
    put = Put(keys.lead(job, round_no, node), asdict(LeadRecord(time.time(), epoch)), lease)
    return kv.txn(compare, [put])


def withdraw(kv: KV, keys: Keys, job: str, round_no: int, node: str) -> None:
    """``node`` leaves the open round: its join and its lead key (if it led) at one revision."""
    kv.txn([], [], [keys.join(job, round_no, node), keys.lead(job, round_no, node)])

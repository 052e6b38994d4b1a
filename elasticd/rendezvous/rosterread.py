"""A closed round's members, read on demand and in pieces, for the few who need them.

The scan and the table of ``status`` read every job's round heads (size, world, master) and no
assignment (``manager/clustercopy.py``): a round of N members would cost every daemon O(N) bytes.
What does need members reads them here, for one job:

- ``read_round``: a round whole (``status <job>``, ``logs``, ``kill``), its assignments read in
  pages of ``PAGE`` keys (each request bounded, however large the round), then assembled against
  its head (``roster.assemble``); ``Rounds`` keeps the last few read (they never change);
  ``read_rosters``: each round a job's read names, whole (``JobStore.read_rosters``: a round's
  leader, a node outside a running round);
- ``membership``: whether given nodes are members of a closed round, one key each (their own
  assignments) in one request (``drain``'s check; the janitor's, remembered: ``Members``);
- ``Members.live``: a member of a running round that is still there (its join) and has work
  left (no done marker), for the janitor, which the read of every job does not tell (it carries
  no join nor done marker): the one found last time asked about alone, else the round's keys in
  growing pages until one is.

The pages are separate requests, so not of one revision. A closed round's assignments do not
change: each is written before its head and never after, and they are deleted only after their
head (``roster``). So every page asks for the head again: if it is still there, with the same
epoch, at the last page, every assignment of the round was there all along and the read is whole;
if it went, the round was forgotten meanwhile (a newer one closed) and there is nothing to show.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from elasticd.decode import DecodeError, parse_json
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV, prefix_end
from elasticd.etcd.types import KeyValue, Query
from elasticd.rendezvous.jobparse import parse_assignments, parse_parts, with_rosters
from elasticd.rendezvous.jobread import InvalidKey, JobRead, JoinsRead, Live, RostersRead
from elasticd.rendezvous.model import RoundHead, RoundResult
from elasticd.rendezvous.roster import assemble, bounded, own
from elasticd.terms.spec import MAX_NODES

PAGE = 500  # assignments per request: ~430 bytes each, ~215 KB a response
LIVE_PAGES = (8, 64, PAGE)  # joins read at a time for ``Members.live``; then PAGE, up to MAX_KEYS
ASKS = 100  # keys asked about in one request (etcd takes at most 128 operations in one)
MAX_KEYS = MAX_NODES + 1024  # keys under one round's assignments that a read takes (a bound)

Roster = RoundResult | InvalidKey | None  # the round whole; its bad key; None: it was forgotten


def read_round(kv: KV, keys: Keys, job_id: str, head: RoundHead, page: int = PAGE) -> Roster:
    """``head``'s round whole, read in pages of at most ``page`` assignments (blocking: run it in
    a thread); an ``InvalidKey`` when an assignment is bad or they do not make the head; None when
    the round was forgotten while it was read (module doc)."""
    prefix = keys.assignments(job_id, head.round)
    where = keys.relative(prefix)
    start, end = prefix, prefix_end(prefix)
    read: list[KeyValue] = []
    while True:
        found, still = kv.read_many(
            [Query(start, end=end, limit=page), Query(keys.result(job_id, head.round))]
        )
        read += found.kvs
        if len(read) + found.count - len(found.kvs) > MAX_KEYS:
            return InvalidKey(where, f"over {MAX_KEYS} keys under a round's assignments")
        if len(found.kvs) >= found.count or not found.kvs:
            break
        start = found.kvs[-1].key + "\0"  # the next key after the last one read
    if not _same_head(still.kvs, head):
        return None
    assigned, invalid = parse_assignments(keys, job_id, read)  # each checked against its key
    if invalid:
        return invalid[0]
    try:
        return assemble(head, assigned.get(head.round, {}).values())
    except DecodeError as exc:
        return InvalidKey(where, str(exc)[:300], 0)


def read_rosters(kv: KV, keys: Keys, read: JoinsRead) -> RostersRead:
    """``read`` with each closed round it names whole (``read_round``; blocking), and the bad
    keys found reading them: what a round's leader and a node outside the round read."""
    results: dict[int, RoundResult] = {}
    bad: list[InvalidKey] = []
    for head in read.heads.values():
        roster = read_round(kv, keys, read.job_id, head)
        if isinstance(roster, RoundResult):
            results[head.round] = roster
        elif isinstance(roster, InvalidKey):
            bad.append(roster)
    return with_rosters(read, results, bad)


def _same_head(found: list[KeyValue], head: RoundHead) -> bool:
    """Whether the head read with the last page is ``head`` still (not deleted, nor another)."""
    if not found:
        return False
    try:
        return RoundHead.from_json(parse_json(bounded(found[0].value, "a round's head"))).epoch == head.epoch
    except DecodeError:
        return False


def membership(kv: KV, keys: Keys, asks: Sequence[tuple[str, RoundHead, str]]) -> list[bool]:
    """For each (job, head of a closed round, node): whether the node is a member of that round,
    from its own assignment of the head's epoch; one key each, in one request (blocking). A bad
    assignment is no membership here: the member that reads its own fails the job for it."""
    if not asks:
        return []
    found = kv.read_many([Query(keys.assignment(job, head.round, node)) for job, head, node in asks])
    out = []
    for (job, head, node), got in zip(asks, found, strict=True):
        assigned, _ = parse_assignments(keys, job, got.kvs)
        out.append(own(head, assigned.get(head.round, {}).get(node)) is not None)
    return out


class Members:
    """Whether nodes are members of the jobs' running rounds, as the janitor asks at every sweep
    (is a member that has work left still there?): one key per node asked, a few at a time until
    one is, each remembered while its round is its job's current one (a closed round's members
    never change). So a running job costs a request or two per round, not its members per sweep."""

    MAX_BATCH = 64  # nodes asked in one request; the first is 1 (almost always a member), then twice as many

    def __init__(self, kv: KV, keys: Keys) -> None:
        self._kv = kv
        self._keys = keys
        self._known: dict[tuple[str, int, int], dict[str, bool]] = {}  # (job, round, epoch) -> node -> member
        self._live: dict[tuple[str, int, int], str] = {}  # (job, round, epoch) -> the member found there
        self._fetched: dict[tuple[str, int, str], list[KeyValue]] = {}  # (job, round, node) -> its join read

    async def first(self, read: JobRead, head: RoundHead, nodes: Sequence[str]) -> str | None:
        """The first of ``nodes`` that is a member of ``head``'s round (None: none is): from the
        round whole when ``read`` holds it, else from their assignments."""
        if isinstance(read, RostersRead) and head.round in read.results:
            members = set(read.results[head.round].nodes)
            return next((n for n in nodes if n in members), None)
        known = self._known.setdefault((read.job_id, head.round, head.epoch), {})
        if hit := next((n for n in nodes if known.get(n)), None):
            return hit
        ask, batch = [n for n in nodes if n not in known], 1
        while ask:
            chunk, ask, batch = ask[:batch], ask[batch:], min(2 * batch, self.MAX_BATCH)
            asks = [(read.job_id, head, n) for n in chunk]
            found = await asyncio.to_thread(membership, self._kv, self._keys, asks)
            known.update(zip(chunk, found, strict=True))
            if hit := next((n for n, member in zip(chunk, found, strict=True) if member), None):
                return hit
        return None

    async def prefetch(self, reads: Mapping[str, JobRead]) -> None:
        """Ask about the member ``live`` found last time in every running round at once (its join
        and its done marker; one request per ``ASKS`` keys, not one per round): what ``live``
        then answers from, once."""
        asks = []
        for read in reads.values():
            head = read.closed
            if head is None or read.final is not None or isinstance(read, JoinsRead):
                continue
            known = self._live.get((read.job_id, head.round, head.epoch))
            if known is not None:
                asks.append((read.job_id, head.round, known))
        self._fetched = {}
        for start in range(0, len(asks), ASKS // 2):
            chunk = asks[start : start + ASKS // 2]
            queries = [
                Query(k(job, r, node)) for job, r, node in chunk for k in (self._keys.join, self._keys.done)
            ]
            found = await asyncio.to_thread(self._kv.read_many, queries)
            for i, ask in enumerate(chunk):
                self._fetched[ask] = found[2 * i].kvs + found[2 * i + 1].kvs

    async def live(self, read: JobRead, head: RoundHead) -> Live:
        """A member of ``head``'s round (the job's current one) that is there (its join, under its
        lease) and not done; a bad key read, as the key the job fails for; or, when no member is,
        the round's done markers (only members write one). From ``read``'s joins and done
        markers when it holds them (``JoinsRead``: a read of the job alone); else the member found last time,
        asked about alone (``prefetch``), and only when it is gone or done, the round's keys
        (done markers, then joins) in growing pages (``LIVE_PAGES``) until one is: O(1) bytes a
        sweep while the round runs, whatever its size."""
        if isinstance(read, JoinsRead):
            done = read.done_in(head.round)
            nodes = [j.node for j in read.joins.get(head.round, ()) if j.node not in done]
            return await self.first(read, head, nodes) or frozenset(done)
        key = (read.job_id, head.round, head.epoch)
        known = self._live.get(key)
        if known is not None:
            kvs = self._fetched.pop((read.job_id, head.round, known), None)
            if kvs is None:
                asks = [
                    Query(self._keys.join(read.job_id, head.round, known)),
                    Query(self._keys.done(read.job_id, head.round, known)),
                ]
                kvs = [kv for f in await asyncio.to_thread(self._kv.read_many, asks) for kv in f.kvs]
            got = parse_parts(self._keys, read.job_id, kvs)
            if got.invalid:
                return got.invalid[0]
            if got.joins and not got.done:
                return known
        return await self._search(read, head, key)

    async def _search(self, read: JobRead, head: RoundHead, key: tuple[str, int, int]) -> Live:
        """``live`` from the round's keys in pages (module doc)."""
        prefix = self._keys.round_parts(read.job_id, head.round)
        start, end, pages, taken = prefix, prefix_end(prefix), list(LIVE_PAGES), 0
        done: set[str] = set()
        while taken < MAX_KEYS:
            query = Query(start, end=end, limit=pages.pop(0) if pages else PAGE)
            (found,) = await asyncio.to_thread(self._kv.read_many, [query])
            got = parse_parts(self._keys, read.job_id, found.kvs)
            if got.invalid:
                return got.invalid[0]
            done |= got.done.get(head.round, frozenset())  # (they sort before the joins)
            nodes = [j.node for j in got.joins.get(head.round, ()) if j.node not in done]
            if hit := await self.first(read, head, nodes):
                self._live[key] = hit
                return hit
            taken += len(found.kvs)
            if len(found.kvs) >= found.count or not found.kvs:
                break
            start = found.kvs[-1].key + "\0"  # the next key after the last one read
        return frozenset(done)

    def retain(self, reads: Mapping[str, JobRead]) -> None:
        """Forget every round that is not a current, closed one of ``reads``."""
        keep = {(j, s.closed.round, s.closed.epoch) for j, s in reads.items() if s.closed is not None}
        self._known = {k: v for k, v in self._known.items() if k in keep}
        self._live = {k: v for k, v in self._live.items() if k in keep}


class Rounds:
    """Closed rounds whole, as ``read_round`` read them, the last ``KEEP`` kept: a closed round's
    members never change (its head's epoch names it), so ``status <job>`` asked again, and
    ``logs -f`` (a read of the job every 0.2 s), read a round's pages once."""

    KEEP = 4  # rounds (a round of 12,500 members is ~3 MB held)

    def __init__(self, kv: KV, keys: Keys) -> None:
        self._kv = kv
        self._keys = keys
        self._held: dict[tuple[str, int, int], RoundResult] = {}  # (job, round, epoch) -> round
        self.reads = 0  # rounds read from etcd: what the tests count

    async def read(self, job_id: str, head: RoundHead) -> Roster:
        """``read_round`` of ``head``'s round, unless it is held."""
        key = (job_id, head.round, head.epoch)
        held = self._held.get(key)
        if held is not None:
            return held
        got = await asyncio.to_thread(read_round, self._kv, self._keys, job_id, head)
        self.reads += 1
        if isinstance(got, RoundResult):
            if len(self._held) >= self.KEEP:
                del self._held[next(iter(self._held))]  # the oldest kept
            self._held[key] = got
        return got

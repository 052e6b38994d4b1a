"""The reads of a job's store: one consistent read at a time, and the small reads and the watch
beside it. ``store.KVJobStore`` adds the writes.

A read is a single request over ``jobs/<job>/`` and the job's parts ``parts/<job>/`` (its joins
and pending notes), at one revision, so a read is never torn; with the rounds' assignments
(``rounds/<job>/``: every one, or a member's own), in the same request (each shape of read its
own type: ``jobread``). The nodes' statuses (``reports/<job>/``: what ``status`` shows, no
decider reads them) follow in pages (``reportread``), and so do a round's members whole
(``rosterread``): no response grows with the job.

Each read also remembers the job's head's create revision it found: the writes that must not
outlive the job (a join, a status, a done marker) are guarded by it (``KVJobStore._put_guarded``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from elasticd.decode import DecodeError, parse_json
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV, prefix_end
from elasticd.etcd.pages import read_pages
from elasticd.etcd.types import KeyValue, Query
from elasticd.rendezvous import leadership, reportread, rosterread
from elasticd.rendezvous.glance import Glance
from elasticd.rendezvous.jobparse import parse_joins, parse_member, parse_parts
from elasticd.rendezvous.jobread import JobRead, JoinsRead, MemberRead, Parts, RostersRead
from elasticd.rendezvous.model import Join, Member, NodeStatus, RoundHead, RoundResult
from elasticd.terms.head import JobHead, check_body
from elasticd.terms.spec import MAX_NODES, JobSpec

T = TypeVar("T")
R = TypeVar("R", bound=JobRead)
READ_TRIES = 3  # a member's read finds the round closed at another round than it asked for
JOIN_PAGE = 500  # keys per request when a round's are read for one job (``round_parts``)
MAX_JOINS = 2 * MAX_NODES + 1024  # joins and done markers of one round such a read takes (a bound)


class KVJobReader:
    """The reads of ``JobStore`` over any ``KV``; subclasses say how a blocking call is run."""

    def __init__(self, kv: KV, keys: Keys, job_id: str) -> None:
        self._kv = kv
        self._keys = keys
        self.job_id = job_id
        # The job's head's create revision as a read last found it (0: none found yet): a status
        # is put only while that head is there (``KVJobStore.put_node_status``).
        self._head_revision = 0

    @property
    def keys(self) -> Keys:
        return self._keys

    async def _run(self, fn: Callable[[], T]) -> T:
        raise NotImplementedError

    # Each read is one request at one revision over the job's records and its parts (all but
    # round ``joins_counted_of``'s joins, which are counted: a running member needs how many are
    # left, not N records, O(1) instead of O(N)); with ``statuses``, also its pending notes, and
    # its nodes' reports after the rest, in pages (``reportread``: what ``status`` shows, which no
    # decider reads, so an agent's read carries O(N) records fewer without them).
    async def read(self, statuses: bool = True) -> JoinsRead:
        """The job and its parts, no round's assignments (``status <job>``, ``kill``, ``rm``)."""
        read = await self._run(lambda: parse_joins(self._keys, self.job_id, *self._read_keys(None, statuses)))
        return await self._with_reports(read, statuses)

    async def read_member(
        self, node: str, joins_counted_of: int | None = None, statuses: bool = True
    ) -> MemberRead:
        """The job, its parts and ``node``'s own assignment of the current round (a member's
        read: O(1) bytes, whatever the job's size)."""
        read = await self._run(lambda: self._member_read(node, joins_counted_of, statuses))
        return await self._with_reports(read, statuses)

    async def read_rosters(self, joins_counted_of: int | None = None, statuses: bool = True) -> RostersRead:
        """The job, its parts and each closed round it names whole, in pages (``rosterread``):
        what a round's leader and a node outside the round need, with no response that grows
        with the round. A round forgotten while it was read (a newer one closed) is left out."""

        def whole() -> RostersRead:
            kvs, counts = self._read_keys(joins_counted_of, statuses)
            return rosterread.read_rosters(
                self._kv, self._keys, parse_joins(self._keys, self.job_id, kvs, counts)
            )

        return await self._with_reports(await self._run(whole), statuses)

    async def _with_reports(self, read: R, statuses: bool) -> R:
        return reportread.with_reports(read, await self.statuses()) if statuses else read

    async def statuses(self) -> dict[str, NodeStatus]:
        """Each node's status in the job (``reports/<job>/``), read in pages (``reportread``)."""
        reports = await self._run(lambda: reportread.read_reports(self._kv, self._keys, self.job_id))
        return reportread.statuses(self._keys, self.job_id, reports)

    async def node_status(self, node: str) -> NodeStatus | None:
        """``node``'s report alone (one key), None when there is none or it does not decode."""
        kv = await self._run(lambda: self._kv.get(self._keys.node_status(self.job_id, node)))
        return reportread.statuses(self._keys, self.job_id, [kv] if kv is not None else []).get(node)

    def _member_read(self, node: str, counted_of: int | None, statuses: bool) -> MemberRead:
        """One read; one that finds another round closed than it asked for (``counted_of``)
        reads again for that round's own assignment (the round moved meanwhile)."""
        hint = counted_of
        for _ in range(READ_TRIES):
            kvs, counts = self._read_keys(counted_of, statuses, node, hint)
            read = parse_member(self._keys, self.job_id, kvs, node if hint is not None else "", counts)
            closed = read.closed
            if not node or closed is None or closed.round == hint:
                return read
            hint = closed.round
        raise EtcdUnavailable(f"job {self.job_id}'s round moved {READ_TRIES} times while it was read")

    def _read_keys(
        self, counted_of: int | None, statuses: bool, node: str = "", hint: int | None = None
    ) -> tuple[list[KeyValue], dict[int, int]]:
        """The keys of one read, and how many joins round ``counted_of`` has; with ``node`` and
        ``hint``, that node's own assignment of round ``hint`` too."""
        k, j = self._keys, self.job_id
        start, end = k.job_joins(j)
        ranges = [(start, end)]
        counted = k.joins(j, counted_of) if counted_of is not None else None
        if counted is not None:  # all but round r's joins, which are counted
            ranges = [(start, counted), (prefix_end(counted), end)]
        # A member's read of its own assignment follows the round's head it was told of (a
        # glance, a watch event) from the same etcd member: served from what that member
        # applied (``Query.serializable``), it is no older than the head; etcd then skips the
        # round trip to its leader for every member of a closing round at once.
        member = bool(node) and hint is not None
        queries = [Query(k.job(j), prefix=True, serializable=member)]
        queries += [Query(a, end=b, serializable=member) for a, b in ranges]
        if statuses:
            queries.append(Query(k.job_notes(j), prefix=True, serializable=member))
        if member and hint is not None:
            queries.append(Query(k.assignment(j, hint, node), serializable=True))
        read = len(queries)
        if counted is not None:
            queries.append(Query(counted, prefix=True, count_only=True, serializable=member))
        found = self._kv.read_many(queries)
        kvs = [kv for f in found[:read] for kv in f.kvs]
        head = next((kv.create_revision for kv in found[0].kvs if kv.key == k.job_spec(j)), 0)
        self._head_revision = head or self._head_revision  # (gone: the guard fails on the old one)
        return kvs, ({counted_of: found[-1].count} if counted_of is not None else {})

    async def glance(self, round_no: int, node: str) -> Glance:
        """The small read of a node waiting in an open round (``leadership.glance``)."""
        return await self._run(lambda: leadership.glance(self._kv, self._keys, self.job_id, round_no, node))

    async def count_joins(self, round_no: int) -> int:
        """How many joins round ``round_no`` has (O(1) bytes, whatever N)."""
        query = Query(self._keys.joins(self.job_id, round_no), prefix=True, count_only=True)
        return (await self._run(lambda: self._kv.read_many([query])))[0].count

    async def round_parts(self, round_no: int) -> Parts:
        """Round ``round_no``'s joins and done markers alone, read in pages (each bad one in
        ``invalid``): for what shows them (``status <job>``)."""
        prefix = self._keys.round_parts(self.job_id, round_no)
        kvs = await self._run(lambda: read_pages(self._kv, prefix, JOIN_PAGE, MAX_JOINS))
        return parse_parts(self._keys, self.job_id, kvs)

    async def members(self, head: RoundHead) -> tuple[Member, ...] | None:
        """``head``'s round's members, read in pages (``rosterread``); None when the round was
        forgotten meanwhile or an assignment is bad (the job's next full read reports it)."""
        found = await self._run(lambda: rosterread.read_round(self._kv, self._keys, self.job_id, head))
        return found.members if isinstance(found, RoundResult) else None

    async def join_of(self, round_no: int, node: str) -> Join | None:
        kv = await self._run(lambda: self._kv.get(self._keys.join(self.job_id, round_no, node)))
        try:
            return Join.from_json(parse_json(kv.value), kv.create_revision, kv.lease) if kv else None
        except DecodeError:  # the job's next full read reports it
            return None

    async def spec(self, head: JobHead) -> JobSpec:
        """The job's full spec (``specs/<job>``), for a node about to take part: DecodeError when
        it is missing, not a spec, or disagrees with ``head`` (``check_body``)."""
        kv = await self._run(lambda: self._kv.get(self._keys.job_body(self.job_id)))
        return check_body(head, kv.value if kv is not None else None)

    async def watch_joins(
        self, round_no: int, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]:
        """Watch round ``round_no``'s joins (what its leader needs, and no other node watches):
        ``KV.watch_prefix``'s callbacks, from another thread. Returns the cancel function."""
        prefix = self._keys.joins(self.job_id, round_no)
        return await self._run(lambda: self._kv.watch_prefix(prefix, on_change, on_broken))

"""What every daemon reads of a closed round: its head, never its members' assignments.

The scan and the table of ``status`` read every job (``manager/clustercopy.py``); a round of N members
has N assignments under ``rounds/``, and when that read covered them every daemon read O(N) bytes
per round (O(N²) cluster-wide). Counted here on the in-memory KV, for 100 and 2,000 members: the
read after a round closes brings its head alone, the same bytes for both; only ``status`` of the
job reads the members, in pages; ``drain`` and the janitor ask for one assignment."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.types import Found, KeyValue, Query
from elasticd.manager.facts import NodeFacts
from elasticd.manager.service import CommandService
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous import rosterread
from elasticd.rendezvous.jobread import InvalidKey, RostersRead
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.spec import NodeRange
from tests.fakes import JOB, bare_manager, make_spec

pytestmark = pytest.mark.timeout(120)
KEYS = Keys("/t")
ROUNDS = KEYS.all_rounds()


class ReadsKV(MemoryKV):
    """``MemoryKV`` that keeps every range asked for and every key its answers carried."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[Query] = []
        self.got: list[KeyValue] = []
        self.answers: list[Found] = []

    def get(self, key: str) -> KeyValue | None:
        (found,) = self.read_many([Query(key)])
        return found.kvs[0] if found.kvs else None

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        return self.read_many([Query(prefix, prefix=True)])[0].kvs

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        found = super().read_many(queries)
        self.asked += queries
        self.answers += found
        self.got += [kv for f in found for kv in f.kvs]
        return found

    def bytes_read(self, under: str = "") -> int:
        return sum(len(kv.key) + len(kv.value) for kv in self.got if kv.key.startswith(under))

    def forget(self) -> None:
        self.asked, self.got, self.answers = [], [], []


def node(i: int) -> str:
    return f"m{i:05d}"


def running_job(kv: MemoryKV, n: int) -> InlineJobStore:
    """A job whose round 0 closed with ``n`` members (8 ranks each), all of them live."""
    store = InlineJobStore(kv, KEYS, JOB)
    assert run_inline(store.create(make_spec(nnodes=NodeRange(n, n), nproc_per_node=8)))
    lease = kv.grant_lease(3600)
    for i in range(n):
        run_inline(store.join(0, Join(node(i), f"10.0.{i // 250}.{i % 250 + 1}", 29500, 8), lease))
    close(store)
    return store


def close(store: InlineJobStore) -> None:
    joins = run_inline(store.read()).current_joins
    first = min(joins, key=lambda j: j.create_revision)
    assert run_inline(store.close(rdzv.build_result(0, joins, 5.0, first.create_revision), first.node))


def service_on(kv: MemoryKV, tmp: Path) -> CommandService:
    m = bare_manager(kv, KEYS, tmp, lease=kv.grant_lease(3600))
    facts = NodeFacts("n1", 0.0, (), True, True, 10.0, tmp)
    return CommandService(facts, m, SimpleNamespace(records=lambda: []), kv, KEYS)  # type: ignore[arg-type]


def round_closes(n: int, tmp: Path) -> tuple[int, dict[str, Any], ReadsKV]:
    """The bytes the scan's and the table's read brings once a round of ``n`` closed (the job
    read before, while it formed), and the table's row of the job."""
    kv = ReadsKV()
    store = InlineJobStore(kv, KEYS, JOB)
    assert run_inline(store.create(make_spec(nnodes=NodeRange(n, n), nproc_per_node=8)))
    lease = kv.grant_lease(3600)
    for i in range(n):
        run_inline(store.join(0, Join(node(i), f"10.0.{i // 250}.{i % 250 + 1}", 29500, 8), lease))
    service = service_on(kv, tmp)
    m = service.jobs._manager

    async def run() -> tuple[int, dict[str, Any]]:
        await m.scan(clean_up=False)  # every job read once (the joins with them)
        close(store)
        kv.forget()
        m.wake()  # what the watch does for the head's news
        await m.scan(clean_up=False)
        (row,) = json.loads(await service.jobs.views_json(rows=True))
        return kv.bytes_read(), row

    got, row = asyncio.run(run())
    return got, row, kv


@pytest.mark.parametrize("n", [100, 2000])
def test_a_closed_round_reaches_every_daemon_as_its_head_whatever_its_size(n: int, tmp_path: Path) -> None:
    got, row, kv = round_closes(n, tmp_path)
    assert not any(kv.key.startswith(ROUNDS) for kv in kv.got)
    assert not any(q.key.startswith(ROUNDS) or (q.prefix and ROUNDS.startswith(q.key)) for q in kv.asked)
    assert got < 2048  # the head and the scan's own records: a few hundred bytes
    assert (row["state"], row["size"], row["world_size"]) == ("RUNNING", n, 8 * n)
    assert "nodes" not in row  # the table shows sizes; ``status <job>`` the members


def test_the_bytes_a_closed_round_costs_a_daemon_do_not_grow_from_100_to_2000_members(tmp_path: Path) -> None:
    small, _, _ = round_closes(100, tmp_path / "small")
    large, _, _ = round_closes(2000, tmp_path / "large")
    assert abs(large - small) <= 16  # (only the digits of sizes and ranks differ)


def test_status_of_the_job_shows_every_member_read_in_pages(tmp_path: Path) -> None:
    kv = ReadsKV()
    running_job(kv, 2000)
    service = service_on(kv, tmp_path)

    async def run() -> tuple[dict[str, Any], dict[str, Any], bool, list[tuple[Query, Found]]]:
        await service.jobs._manager.scan(clean_up=False)
        kv.forget()
        view = await service.jobs.view(JOB)
        (row,) = json.loads(await service.jobs.views_json(rows=True))
        held = service.jobs._manager.cluster.jobs()[0]
        asked = list(zip(kv.asked, kv.answers, strict=True))
        kv.forget()
        again = await service.jobs.view(JOB)  # (``logs -f`` asks every 0.2 s): the round is kept
        assert again["nodes"] == view["nodes"] and not any(q.key.startswith(ROUNDS) for q in kv.asked)
        return view, row, isinstance(held[JOB], RostersRead), asked

    view, row, held_members, asked = asyncio.run(run())
    assert view["nodes"] == [node(i) for i in range(2000)] and view["size"] == 2000
    assert [m["ranks"] for m in view["members"][:2]] == [[0, 7], [8, 15]]
    pages = [f for q, f in asked if q.key.startswith(ROUNDS) and q.limit]
    assert len(pages) == 4 and all(len(f.kvs) <= rosterread.PAGE for f in pages)
    assert "nodes" not in row and not held_members  # the read of every job is left as it was


def test_drain_asks_for_the_one_assignment_of_the_node(tmp_path: Path) -> None:
    kv = ReadsKV()
    running_job(kv, 300)
    service = service_on(kv, tmp_path)
    for n in (node(7), "outsider"):
        kv.put_json(KEYS.node(n), {})

    async def run(n: str) -> dict[str, Any]:
        kv.forget()
        return await service.nodes.drain(n, None, None, True, "root")

    member = asyncio.run(run(node(7)))
    assert member["jobs"] == [JOB] and member["forced"]  # 299 left of the 300 the job needs
    assert [kv.key for kv in kv.got if kv.key.startswith(ROUNDS)] == [KEYS.assignment(JOB, 0, node(7))]
    assert asyncio.run(run("outsider"))["jobs"] == []


def test_the_janitor_asks_whether_a_member_lives_once_per_round(tmp_path: Path) -> None:
    kv = ReadsKV()
    running_job(kv, 500)
    m = service_on(kv, tmp_path).jobs._manager

    async def run() -> list[int]:
        reads = []
        for _ in range(2):
            kv.forget()
            await m.scan()  # the janitor's: elected on the first
            reads.append(sum(kv.key.startswith(ROUNDS) for kv in kv.got))
        return reads

    assert asyncio.run(run()) == [1, 0]
    read = run_inline(InlineJobStore(kv, KEYS, JOB).read())
    assert (read.current, read.final) == (0, None)  # a member lives: the job is left alone


class Forgetting(MemoryKV):
    """Deletes round 0's head, then its assignments, after the first page is read: a newer
    round closed meanwhile (the order ``forget_rounds_before`` deletes in)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        found = super().read_many(queries)
        if self.armed and any(q.limit for q in queries):
            self.armed = False
            self.delete(KEYS.result(JOB, 0))
            self.delete_prefix(KEYS.assignments(JOB, 0))
        return found


def test_a_round_forgotten_while_its_pages_are_read_is_none_not_invalid() -> None:
    kv = Forgetting()
    store = running_job(kv, 30)
    head = run_inline(store.read()).closed
    assert head is not None
    whole = rosterread.read_round(kv, KEYS, JOB, head, page=7)
    assert whole is not None and not isinstance(whole, InvalidKey) and len(whole.members) == 30
    kv.armed = True
    assert rosterread.read_round(kv, KEYS, JOB, head, page=7) is None


def test_a_missing_or_bad_assignment_is_named() -> None:
    kv = MemoryKV()
    store = running_job(kv, 12)
    head = run_inline(store.read()).closed
    assert head is not None
    kv.delete(KEYS.assignment(JOB, 0, node(3)))
    missing = rosterread.read_round(kv, KEYS, JOB, head, page=5)
    assert isinstance(missing, InvalidKey) and "11 of its 12" in missing.why
    kv.put_json(KEYS.assignment(JOB, 0, node(3)), {"round": 0})
    bad = rosterread.read_round(kv, KEYS, JOB, head, page=5)
    assert isinstance(bad, InvalidKey) and bad.key == KEYS.relative(KEYS.assignment(JOB, 0, node(3)))


def test_a_leaders_read_of_the_rosters_comes_in_pages() -> None:
    """The read a round's leader (or a node outside the round) makes of the rosters holds every
    member of the closed round, but no answer carries more than a page of assignments."""
    kv = ReadsKV()
    store = running_job(kv, 2000)
    kv.forget()
    read = run_inline(store.read_rosters())
    assert read.result is not None and len(read.result.members) == 2000
    assert [m.node for m in read.result.members] == sorted(node(i) for i in range(2000))
    pages = [sum(kv.key.startswith(ROUNDS) for kv in f.kvs) for f in kv.answers]
    assert max(pages) <= rosterread.PAGE and sum(pages) == 2000, pages

"""What every daemon reads of a round's members: nothing per member, whatever the round's size.

A round of N members has N joins (``parts/``), N statuses (``reports/``, rewritten at every step
and progress publish) and N assignments (``rounds/``). When the read of every job (the scan, the
table of ``status``) covered the joins and statuses, every daemon read ~645 bytes per member per
round, and every status change again at its safety net. Counted here on the in-memory KV, for
100 and 2,000 members: the read after the round formed and closed, and the safety net's read
after every member published its progress, carry no member's key and the same bytes at both
sizes; what needs members asks for them: ``status <job>`` (in pages), the janitor (one key a
sweep), the admitter (a count, only where it would act)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from elasticd.etcd.keys import Keys
from elasticd.etcd.types import Found, Query
from elasticd.manager.facts import NodeFacts
from elasticd.manager.service import CommandService
from elasticd.progress.protocol import Phase
from elasticd.progress.tracker import RankProgress
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous import reportread
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.spec import NodeRange
from tests.fakes import JOB, bare_manager, make_spec
from tests.unit.test_unit_scan_rosters import ReadsKV, node

pytestmark = pytest.mark.timeout(120)
KEYS = Keys("/t")
MEMBERS = (KEYS.all_parts(), KEYS.all_reports(), KEYS.all_rounds())  # one key per member each


def status(i: int, step: int = 0) -> dict[str, object]:
    """Member ``i``'s status; with ``step``, its rank's progress as a publish carries it."""
    progress = RankProgress(8 * i, step, 1.0 + step, 2.0, 0.5, 3, Phase.STEP).to_json() if step else None
    return {"state": "RUNNING", "round": 0, "devices": "0,1", "pids": [100 + i], "updated_at": 1.0,
            "progress": [progress] if progress else []}  # fmt: skip


def service_on(kv: ReadsKV, tmp: Path) -> CommandService:
    m = bare_manager(kv, KEYS, tmp, lease=kv.grant_lease(3600))
    facts = NodeFacts("n1", 0.0, (), True, True, 10.0, tmp)
    return CommandService(facts, m, SimpleNamespace(records=lambda: []), kv, KEYS)  # type: ignore[arg-type]


def form(kv: ReadsKV, n: int, job: str = JOB) -> InlineJobStore:
    """``n`` members join round 0 of ``job`` and publish their statuses; the round closes."""
    store = InlineJobStore(kv, KEYS, job)
    run_inline(store.read_rosters(statuses=False))  # (the head its joins and statuses are put under)
    lease = kv.grant_lease(3600)
    for i in range(n):
        run_inline(store.join(0, Join(node(i), f"10.0.{i // 250}.{i % 250 + 1}", 29500, 8), lease))
        run_inline(store.put_node_status(node(i), status(i), lease))
    joins = run_inline(store.read(statuses=False)).current_joins
    first = min(joins, key=lambda j: j.create_revision)
    assert run_inline(store.close(rdzv.build_result(0, joins, 5.0, first.create_revision), first.node))
    return store


def round_of(n: int, tmp: Path) -> tuple[int, int, ReadsKV, CommandService]:
    """The bytes the scan reads once a round of ``n`` formed and closed (the job read before),
    then at the safety net once every member published its progress again and marked done."""
    kv = ReadsKV()
    assert run_inline(
        InlineJobStore(kv, KEYS, JOB).create(make_spec(nnodes=NodeRange(n, n), nproc_per_node=8))
    )
    service = service_on(kv, tmp)
    m = service.jobs._manager

    async def run() -> tuple[int, int]:
        await m.scan(clean_up=False)  # every job read once, before the round
        store = form(kv, n)
        kv.forget()
        m.wake()  # what the watch does for the head's news
        await m.scan(clean_up=False)
        closed = kv.bytes_read()
        assert not any(kv.key.startswith(MEMBERS) for kv in kv.got)
        lease = kv.grant_lease(3600)
        for i in range(n):
            await store.put_node_status(node(i), status(i, step=7), lease)
        for i in range(n):  # every member's workers end well (the last one then ends the job)
            await store.mark_done(0, node(i))
        kv.forget()
        await m.scan(clean_up=False, quiet=True)  # the safety net: it trusts no news
        assert not any(kv.key.startswith(MEMBERS) for kv in kv.got)
        return closed, kv.bytes_read()

    closed, net = asyncio.run(run())
    return closed, net, kv, service


def test_a_round_reaches_every_other_daemon_as_the_same_bytes_at_100_and_2000_members(tmp_path: Path) -> None:
    small, small_net, _, _ = round_of(100, tmp_path / "small")
    large, large_net, _, _ = round_of(2000, tmp_path / "large")
    assert small < 4096 and abs(large - small) <= 16  # the head and the job's own records
    assert small_net == large_net == 0  # progress and done of every member: nothing read


def test_no_read_of_every_job_asks_for_a_members_range(tmp_path: Path) -> None:
    _, _, kv, service = round_of(50, tmp_path)
    kv.forget()
    asyncio.run(service.jobs.views_json(rows=True))
    asked = [q.key for q in kv.asked]
    assert not any(k.startswith(MEMBERS) or any(m.startswith(k) for m in MEMBERS) for k in asked), asked


def test_status_of_the_job_shows_every_members_state_read_in_pages(tmp_path: Path) -> None:
    _, _, kv, service = round_of(1200, tmp_path)

    async def run() -> tuple[dict[str, object], list[tuple[Query, Found]]]:
        kv.forget()
        view = await service.jobs.view(JOB)
        return view, list(zip(kv.asked, kv.answers, strict=True))

    view, asked = asyncio.run(run())
    members = view["members"]
    assert isinstance(members, list) and len(members) == 1200
    assert {m["state"] for m in members} == {"RUNNING"} and members[3]["pids"] == [103]
    pages = [f for q, f in asked if q.key.startswith(KEYS.all_reports())]
    assert len(pages) == 3 and all(len(f.kvs) <= reportread.PAGE for f in pages)


def test_a_bad_status_is_left_out_of_the_view_and_fails_nothing(tmp_path: Path) -> None:
    _, _, kv, service = round_of(3, tmp_path)
    kv.put_json(KEYS.node_status(JOB, node(1)), {"state": "RUNNING", "pids": [-1]})
    view = asyncio.run(service.jobs.view(JOB))
    assert view["state"] == "RUNNING" and "invalid_records" not in view
    assert [m["state"] for m in view["members"]] == ["RUNNING", "GONE", "RUNNING"]


class Counting(ReadsKV):
    """``ReadsKV`` that counts the count-only ranges asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = 0

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        self.counts += sum(q.count_only for q in queries)
        return super().read_many(queries)


def test_the_admitter_counts_joins_only_where_it_would_act(tmp_path: Path) -> None:
    """A node with too few slots notes so once; later scans count nothing while the note holds.
    A job it fits is counted once before it joins (a seat left?)."""
    kv = Counting()
    wide = make_spec(id="wide-1", nnodes=NodeRange(1, 3), nproc_per_node=4)  # more than its 2 slots
    assert run_inline(InlineJobStore(kv, KEYS, wide.id).create(wide))
    m = service_on(kv, tmp_path).jobs._manager

    async def scans() -> list[int]:
        seen = []
        for _ in range(3):
            kv.counts = 0
            m.wake()
            await m.scan(clean_up=False)
            seen.append(kv.counts)
        return seen

    assert asyncio.run(scans()) == [1, 0, 0]
    note = run_inline(InlineJobStore(kv, KEYS, wide.id).read_rosters()).pending
    assert note == {"n1": "n1 is waiting for 4 free CPU slots (2 of 2 free now)"}


class Calls(Counting):
    """``Counting`` that keeps how many requests asked about joins."""

    def __init__(self) -> None:
        super().__init__()
        self.join_requests = 0

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        self.join_requests += any(q.key.startswith(KEYS.all_parts()) for q in queries)
        return super().read_many(queries)


def test_the_janitor_asks_about_one_member_of_each_running_round_in_one_request(tmp_path: Path) -> None:
    """Whether each running round still has a member there: after the first sweep found one per
    round, each sweep (the quiet safety net's too) asks about that one's join, every round's in
    one request, whatever the rounds' sizes."""
    kv = Calls()
    jobs = {"big-1": 600, "mid-1": 40, "one-1": 1}
    for job, n in jobs.items():
        spec = make_spec(id=job, nnodes=NodeRange(n, n), nproc_per_node=8)
        assert run_inline(InlineJobStore(kv, KEYS, job).create(spec))
        form(kv, n, job)
    m = service_on(kv, tmp_path).jobs._manager

    async def sweeps() -> list[tuple[int, int]]:
        seen = []
        for quiet in (False, False, True):
            kv.forget()
            kv.join_requests = 0
            if not quiet:
                m.wake()
            await m.scan(quiet=quiet)
            seen.append((kv.join_requests, sum(kv.key.startswith(KEYS.all_parts()) for kv in kv.got)))
        return seen

    first, again, net = asyncio.run(sweeps())
    assert first[1] <= 8 * len(jobs)  # the first page of each round's joins
    assert again == net == (1, len(jobs))
    for job in jobs:
        assert run_inline(InlineJobStore(kv, KEYS, job).read_rosters(statuses=False)).final is None

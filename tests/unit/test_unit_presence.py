"""A node's presence in its jobs (elasticd.node.registry: ``enter``, ``leave``, ``present``): under
its lease, written before the node's first key of a job, deleted once its agent left, written
again with every new lease; and what a job's agents read as its live nodes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.agent.record import presence_asked
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.types import Found, Query
from elasticd.node.registry import NodeRegistry, parse_presences
from elasticd.rendezvous.jobread import MemberRead, RostersRead
from elasticd.rendezvous.model import RoundInfo, WaitingRecord
from elasticd.terms.state import RoundReason

pytestmark = pytest.mark.timeout(30)

KEYS = Keys("/t")


def registry(kv: MemoryKV, node: str = "n1") -> NodeRegistry:
    reaper = SimpleNamespace(set_deadline=lambda _: None)
    return NodeRegistry(kv, KEYS, node, 2.0, lambda: {"slots": 1}, reaper)  # type: ignore[arg-type]


async def until(check: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def test_presence_is_under_the_lease_read_per_job_and_deleted_when_left() -> None:
    async def scenario() -> None:
        kv = MemoryKV()
        a, b = registry(kv, "n1"), registry(kv, "n2")
        await a.start()
        await b.start()
        loops = [asyncio.create_task(r.run()) for r in (a, b)]
        try:
            await a.enter("j")
            await b.enter("j")
            await b.enter("k")
            assert kv.get(KEYS.presence("j", "n1")).lease == a.lease_id  # type: ignore[union-attr]
            assert await a.in_job("j").alive() == {"n1", "n2"}
            assert await a.in_job("k").alive() == {"n2"}  # only the job's own nodes, whatever the cluster
            b.leave("j")  # deleted by the registry's loop, at once
            await until(lambda: kv.get(KEYS.presence("j", "n2")) is None, "n2's presence deleted")
            assert await a.present("j") == {"n1"}
            assert kv.get(KEYS.presence("k", "n2")) is not None
            await b.stop()  # the lease revoked: every presence of n2 goes with it
            assert await a.present("k") == frozenset()
        finally:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await a.stop()

    asyncio.run(scenario())


def test_a_new_lease_writes_every_presence_again_before_it_is_used() -> None:
    """A fence (the lease lost) and a new lease: the node is present in its jobs again under the
    new lease, in the same transaction as its record, before ``lease_id`` names the lease."""

    async def scenario() -> None:
        kv = MemoryKV()
        r = registry(kv)
        await r.start()
        await r.enter("j")
        await r.enter("k")
        old = r.lease_id
        assert old is not None
        kv.revoke_lease(old)  # its presences go with it
        assert await r.present("j") == frozenset()
        r.lease_id = None
        await r._register()
        assert r.lease_id not in (None, old)
        for job in ("j", "k"):
            found = kv.get(KEYS.presence(job, "n1"))
            assert found is not None and found.lease == r.lease_id
        await r.stop()

    asyncio.run(scenario())


def test_an_entry_etcd_refuses_is_no_presence_and_raises() -> None:
    async def scenario() -> None:
        kv = MemoryKV()
        r = registry(kv)
        await r.start()
        kv.fail_next(1)
        with pytest.raises(EtcdUnavailable):
            await r.enter("j")
        lease = r.lease_id
        r.lease_id = None
        await r._register()  # the refused job is not written with the next lease either
        assert kv.get(KEYS.presence("j", "n1")) is None and lease != r.lease_id
        await r.stop()

    asyncio.run(scenario())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["j", "k"]), st.booleans()), max_size=10))
def test_presence_follows_the_last_enter_or_leave_of_each_job(ops: list[tuple[str, bool]]) -> None:
    async def scenario() -> None:
        kv = MemoryKV()
        r = registry(kv)
        await r.start()
        loop = asyncio.create_task(r.run())
        want: dict[str, bool] = {}
        try:
            for job, enter in ops:
                if enter:
                    await r.enter(job)
                else:
                    r.leave(job)
                want[job] = enter
            for job, present in want.items():
                await until(lambda j=job, p=present: (kv.get(KEYS.presence(j, "n1")) is not None) == p, job)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            await r.stop()

    asyncio.run(scenario())


def test_a_bad_presence_key_names_no_node() -> None:
    kv = MemoryKV()
    kv.put_json(KEYS.presence("j", "n1"), {})
    kv.put_json(KEYS.presences("j") + "bad node!", {})
    kv.put_json(KEYS.presences("j") + "n2/extra", {})
    assert parse_presences(KEYS, "j", kv.get_prefix(KEYS.presences("j"))) == {"n1"}


class ReadsKV(MemoryKV):
    """``MemoryKV`` that keeps the keys its reads returned (``get_prefix`` is a ``read_many``)."""

    def __init__(self) -> None:
        super().__init__()
        self.got: list[str] = []

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        found = super().read_many(queries)
        self.got += [kv.key for f in found for kv in f.kvs]
        return found


def test_liveness_asked_about_some_nodes_reads_their_presences_alone() -> None:
    """A member's read asks about the waiting nodes and a round's newcomers (``presence_asked``),
    not every member of the job: O(1) keys for a job of 500 nodes, and none for none asked."""
    kv = ReadsKV()
    lease = kv.grant_lease(30)
    for i in range(500):
        kv.put_json(KEYS.presence("j", f"m{i:03d}"), None, lease)
    r = registry(kv)
    kv.got.clear()
    assert asyncio.run(r.present("j", frozenset({"m007", "gone"}))) == {"m007"}
    assert sorted(kv.got) == [KEYS.presence("j", "m007")]
    kv.got.clear()
    assert asyncio.run(r.present("j", frozenset())) == frozenset() and kv.got == []
    many = frozenset(f"m{i:03d}" for i in range(100))  # past PRESENCE_KEYS: one read of them all
    assert asyncio.run(r.present("j", many)) == many and len(kv.got) == 500


def test_a_members_read_in_a_running_round_asks_about_the_waiting_nodes_and_newcomers_only() -> None:
    info = RoundInfo(3, RoundReason.SCALE_UP, 1.0, expect=("new1",))
    read = MemberRead("j", round=info, waiting={"w1": WaitingRecord(2.0)})
    assert presence_asked(read) == frozenset({"w1", "new1"})
    assert presence_asked(MemberRead("j")) == frozenset()
    assert presence_asked(RostersRead("j")) is None  # whom to expect or probe: all

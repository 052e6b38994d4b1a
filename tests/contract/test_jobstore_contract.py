"""The ``JobStore`` contract: the same tests against ``EtcdJobStore`` (a real etcd) and
``InlineJobStore`` over ``MemoryKV``. Every write that must not race is won exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from elasticd.decode import DecodeError
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.memory import MemoryKV
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.glance import Seen
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import Join, RoundInfo
from elasticd.rendezvous.store import EtcdJobStore, InlineJobStore
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason, WorkerFailure
from tests.contract.test_kv_contract import Events
from tests.fakes import JOB, head_of, make_spec

pytestmark = pytest.mark.timeout(60)
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def store(kv: KV, base: str) -> JobStore:
    keys = Keys(base)
    return InlineJobStore(kv, keys, JOB) if isinstance(kv, MemoryKV) else EtcdJobStore(kv, keys, JOB)


def _join(node: str, port: int = 29500) -> Join:
    return Join(node, "127.0.0.1", port, 2)


def test_a_job_is_created_once(store: JobStore) -> None:
    assert run(store.create(make_spec()))
    assert not run(store.create(make_spec(env={"OTHER": "1"})))
    read = run(store.read_rosters())
    assert read.head == head_of(make_spec()) and read.current == 0 and read.restarts == 0 and not read.invalid
    assert read.head is not None and run(store.spec(read.head)) == make_spec()  # the first one's


def test_the_head_and_the_full_spec_are_created_and_removed_together(
    store: JobStore, kv: KV, base: str
) -> None:
    keys = Keys(base)
    spec = make_spec(env={f"V{i}": "x" * 100 for i in range(50)})
    assert run(store.create(spec))
    head, body = kv.get(keys.job_spec(JOB)), kv.get(keys.job_body(JOB))
    assert head is not None and body is not None and head.mod_revision == body.mod_revision
    assert len(head.value) < 1024 < len(body.value)  # the environment stays out of the head
    read = run(store.read_rosters())
    assert read.head is not None and read.head.spec_bytes == len(body.value)
    assert run(store.spec(read.head)) == spec
    run(store.finalize(JobState.KILLED, EndReason.KILLED, "by u"))
    run(store.remove())
    assert kv.get(keys.job_body(JOB)) is None and kv.get_prefix(keys.job(JOB)) == []
    with pytest.raises(DecodeError, match="missing"):
        run(store.spec(read.head))


def test_a_full_spec_that_disagrees_with_its_head_is_refused(store: JobStore, kv: KV, base: str) -> None:
    keys = Keys(base)
    run(store.create(make_spec()))
    head = run(store.read_rosters()).head
    assert head is not None
    rogue = make_spec(uid=0, user="root")  # written around the daemon: the head still says u
    kv.put_json(keys.job_body(JOB), rogue.to_json())
    with pytest.raises(DecodeError, match="uid"):
        run(store.spec(head))
    kv.put_json(keys.job_body(JOB), {"not": "a spec"})
    with pytest.raises(DecodeError):
        run(store.spec(head))


def test_joins_are_ordered_by_arrival_and_the_oldest_leads(store: JobStore, kv: KV) -> None:
    run(store.create(make_spec()))
    lease = kv.grant_lease(30)
    for node in ("n3", "n1", "n2"):
        run(store.join(0, _join(node), lease))
    read = run(store.read_rosters())
    assert [j.node for j in read.current_joins] == ["n3", "n1", "n2"]
    assert all(j.lease == lease for j in read.current_joins)
    glance = run(store.glance(0, "n2"))
    assert glance.leader == "n3" and glance.joined and not glance.closed and glance.quiet(0, "n2")
    assert not run(store.glance(0, "n3")).quiet(0, "n3")  # the leader is never quiet


def test_the_lead_key_names_the_leader_and_dies_with_its_join(store: JobStore, kv: KV, base: str) -> None:
    keys = Keys(base)
    run(store.create(make_spec()))
    mine, other = kv.grant_lease(30), kv.grant_lease(30)
    for node, lease in (("n3", mine), ("n1", other), ("n2", other)):
        run(store.join(0, _join(node), lease))
    n3 = run(store.read_rosters()).current_joins[0]
    assert not run(store.claim_lead(0, "n3", n3.create_revision, other))  # not its join's lease
    assert not run(store.claim_lead(0, "n3", n3.create_revision + 1, mine))  # not its join
    assert run(store.glance(0, "n2")).leader == "n3"  # no lead key yet: the oldest join
    assert run(store.claim_lead(0, "n3", n3.create_revision, mine))
    lead = kv.get(keys.lead(JOB, 0, "n3"))
    assert lead is not None and lead.lease == mine and run(store.read_rosters()).leads == {0: "n3"}
    assert run(store.glance(0, "n2")).leader == "n3" and run(store.glance(0, "n2")).quiet(0, "n2")
    run(store.join(0, _join("n3", 29501), mine))  # its join put again: the claim goes with it
    assert kv.get(keys.lead(JOB, 0, "n3")) is None and run(store.read_rosters()).leads == {}
    assert run(store.claim_lead(0, "n3", n3.create_revision, mine))
    run(store.withdraw(0, "n3"))  # withdrawn: join and claim at one revision
    assert kv.get(keys.lead(JOB, 0, "n3")) is None
    assert run(store.glance(0, "n2")).leader == "n1"
    n1 = run(store.read_rosters()).current_joins[0]
    assert run(store.claim_lead(0, "n1", n1.create_revision, other))
    kv.revoke_lease(other)  # its lease ended: the join and the claim with it
    assert kv.get(keys.lead(JOB, 0, "n1")) is None and run(store.glance(0, "n2")).leader is None


def test_a_bad_lead_key_makes_the_glance_read_the_job_whole(store: JobStore, kv: KV, base: str) -> None:
    run(store.create(make_spec()))
    lease = kv.grant_lease(30)
    run(store.join(0, _join("n1"), lease))
    run(store.join(0, _join("n2"), lease))
    kv.put_json(Keys(base).lead(JOB, 0, "n1"), {"at": "soon"})
    glance = run(store.glance(0, "n2"))
    assert not glance.quiet(0, "n2")  # not quiet: the full read that follows names the bad key
    assert run(store.read_rosters()).invalid[0].key.endswith("/lead/n1")


def test_a_counted_read_counts_joins_without_reading_them(store: JobStore, kv: KV) -> None:
    run(store.create(make_spec()))
    lease = kv.grant_lease(30)
    run(store.join(0, _join("n1"), lease))
    run(store.join(0, _join("n2"), lease))
    read = run(store.read_rosters(0))
    assert read.join_counts == {0: 2} and read.current_joins == () and read.head is not None


def test_a_round_result_is_written_once_and_never_after_the_end(store: JobStore, kv: KV) -> None:
    run(store.create(make_spec()))
    lease = kv.grant_lease(30)
    run(store.join(0, _join("n1"), lease))
    joins = run(store.read_rosters()).current_joins
    epoch = joins[0].create_revision
    result = rdzv.build_result(0, joins, 1.0, epoch)
    assert run(store.close(result, "n1"))
    assert not run(store.close(rdzv.build_result(0, joins, 2.0, epoch), "n1"))
    assert run(store.read_rosters()).result == result
    assert run(store.glance(0, "n1")).closed
    run(store.finalize(JobState.KILLED, EndReason.KILLED, "by u"))
    late = rdzv.build_result(1, joins, 3.0, epoch)
    assert not run(store.close(late, "n1"))


def test_a_bump_wins_once_per_observed_revision_and_spends_with_it(store: JobStore) -> None:
    run(store.create(make_spec()))
    seen = Seen.of(run(store.read_rosters()))
    info = RoundInfo(1, RoundReason.WORKER_FAILED, 5.0, (), "rank 1 failed")
    assert run(store.bump(seen, info, spend=True))
    assert not run(store.bump(seen, info, spend=True))  # a second observer of the same event
    read = run(store.read_rosters())
    assert read.current == 1 and read.restarts == 1 and read.round == info
    assert run(store.bump(Seen.of(read), RoundInfo(2, RoundReason.SCALE_UP, 6.0), spend=False))
    assert run(store.read_rosters()).restarts == 1


def test_a_job_ends_once_and_no_round_moves_after(store: JobStore) -> None:
    run(store.create(make_spec()))
    seen = Seen.of(run(store.read_rosters()))
    failure = WorkerFailure.from_exit(
        node="n1", attempt=0, rank=1, local_rank=1, returncode=1, message="", tail=""
    )
    assert run(store.finalize(JobState.FAILED, EndReason.WORKER_FAILED, "first", failure.to_json()))
    assert not run(store.finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, "second"))
    assert not run(store.bump(seen, RoundInfo(1, RoundReason.MEMBER_LOST, 1.0), spend=True))
    final = run(store.read_rosters()).final
    assert final is not None and final.reason == "first" and final.code is EndReason.WORKER_FAILED


def test_node_records_under_a_lease_go_with_it(store: JobStore, kv: KV) -> None:
    run(store.create(make_spec()))
    lease = kv.grant_lease(30)
    run(store.join(0, _join("n1"), lease))
    run(store.set_waiting("n2", lease))
    status = {"state": "RUNNING", "round": 0, "devices": "", "pids": [7], "updated_at": 1.0}
    run(store.put_node_status("n1", status, lease))
    run(store.note_pending("n3", "no free slots", lease))
    read = run(store.read_rosters())
    assert read.waiting and read.node_status and read.pending == {"n3": "no free slots"}
    assert run(store.join_of(0, "n1")) is not None
    run(store.revoke(lease))
    read = run(store.read_rosters())
    assert not read.current_joins and not read.waiting and not read.node_status and not read.pending


def test_done_left_withdraw_and_old_rounds_forgotten(store: JobStore, kv: KV) -> None:
    run(store.create(make_spec()))
    lease = kv.grant_lease(30)
    for r in range(4):
        run(store.join(r, _join("n1"), lease))
    run(store.mark_done(3, "n1"))
    run(store.mark_left(3, "n2"))
    run(store.withdraw(3, "n1"))
    run(store.forget_rounds_before(3))  # keeps round 2 (stable ranks) and later
    read = run(store.read_rosters())
    assert sorted(read.joins) == [2] and read.done == {3: {"n1"}} and read.left == {3: {"n2"}}


def test_an_unreadable_final_is_replaced_once(store: JobStore, kv: KV, base: str) -> None:
    run(store.create(make_spec()))
    kv.put_json(Keys(base).job_final(JOB), "not a record")
    read = run(store.read_rosters())
    assert read.final_invalid is not None
    assert run(store.fail_invalid(read))
    assert not run(store.fail_invalid(read))  # only that exact revision is replaced
    final = run(store.read_rosters()).final
    assert final is not None and final.code is EndReason.INVALID_RECORD


STATUS = {"state": "RUNNING", "round": 0, "devices": "", "pids": [7], "updated_at": 1.0}


def test_parts_live_apart_from_the_job_and_are_read_with_it_at_one_revision(
    store: JobStore, kv: KV, base: str
) -> None:
    keys = Keys(base)
    run(store.create(make_spec()))
    lease = kv.grant_lease(30)
    for round_no, node in ((0, "n1"), (0, "n2"), (1, "n1"), (1, "n3")):
        run(store.join(round_no, _join(node), lease))
    run(store.put_node_status("n1", STATUS, lease))
    run(store.note_pending("n4", "no free slots", lease))
    assert [kv.key for kv in kv.get_prefix(keys.job_parts(JOB))] == [
        *(keys.join(JOB, r, n) for r, n in ((0, "n1"), (0, "n2"), (1, "n1"), (1, "n3"))),
    ]
    assert [kv.key for kv in kv.get_prefix(keys.job_notes(JOB))] == [keys.pending_note(JOB, "n4")]
    assert [kv.key for kv in kv.get_prefix(keys.job_reports(JOB))] == [keys.node_status(JOB, "n1")]
    assert [x.key for x in kv.get_prefix(keys.job(JOB))] == [
        keys.job_restarts(JOB),
        keys.job_round(JOB),
        keys.job_spec(JOB),
    ]
    read = run(store.read_rosters())
    assert {r: [j.node for j in joins] for r, joins in read.joins.items()} == {
        0: ["n1", "n2"],
        1: ["n1", "n3"],
    }
    assert list(read.node_status) == ["n1"] and read.pending == {"n4": "no free slots"}
    counted = run(store.read_rosters(1))  # round 1's only counted, the rest read
    assert counted.join_counts == {1: 2} and list(counted.joins) == [0] and counted.head is not None
    assert list(counted.node_status) == ["n1"] and counted.pending == {"n4": "no free slots"}
    for r in (None, 0, 1):  # an agent's read: every join (or all but round r's, counted), no status
        agents = run(store.read_rosters(r, statuses=False))
        assert not agents.node_status and not agents.pending and agents.head is not None
        assert {q: [j.node for j in js] for q, js in agents.joins.items()} == {
            q: [j.node for j in js] for q, js in read.joins.items() if q != r
        }
        assert agents.join_counts == ({r: 2} if r is not None else {})
    run(store.note_pending("n4", None, lease))  # the note is withdrawn
    assert kv.get(keys.pending_note(JOB, "n4")) is None and not run(store.read_rosters()).pending


def test_a_nodes_own_report_is_read_alone_and_a_bad_one_reads_as_none(
    store: JobStore, kv: KV, base: str
) -> None:
    keys = Keys(base)
    run(store.create(make_spec()))
    lease = kv.grant_lease(30)
    assert run(store.node_status("n1")) is None
    run(store.put_node_status("n1", STATUS | {"round": 3}, lease))
    run(store.put_node_status("n2", STATUS, lease))
    mine = run(store.node_status("n1"))
    assert mine is not None and mine.round == 3 and mine.ledger is None
    kv.put_json(keys.node_status(JOB, "n2"), STATUS | {"ledger": {"kept": -1}})
    assert run(store.node_status("n2")) is None  # left out, as a read of them all leaves it out
    assert run(store.node_status("n3")) is None


def test_old_rounds_are_forgotten_with_their_joins_and_a_removed_job_leaves_nothing(
    store: JobStore, kv: KV, base: str
) -> None:
    keys = Keys(base)
    run(store.create(make_spec()))
    other = (
        InlineJobStore(kv, keys, JOB + "x") if isinstance(kv, MemoryKV) else EtcdJobStore(kv, keys, JOB + "x")
    )
    run(other.create(make_spec(id=JOB + "x")))
    lease = kv.grant_lease(30)
    for r in range(3):
        run(store.join(r, _join("n1"), lease))
        run(other.join(r, _join("n1"), lease))
        joined = run(store.read_rosters()).joins[r]
        run(store.close(rdzv.build_result(r, joined, 1.0, joined[0].create_revision), "n1"))
    for s in (store, other):
        run(s.put_node_status("n1", STATUS, lease))
        run(s.note_pending("n2", "no free slots", lease))
    run(store.forget_rounds_before(2))
    read = run(store.read_rosters())
    assert sorted(read.joins) == sorted(read.results) == [1, 2]
    assert kv.get(keys.join(JOB, 0, "n1")) is None and kv.get(keys.result(JOB, 0)) is None
    assert list(read.node_status) == ["n1"] and list(read.pending) == ["n2"]  # no round's: kept
    run(store.remove())
    assert kv.get_prefix(keys.job(JOB)) == kv.get_prefix(keys.job_parts(JOB)) == []
    assert kv.get_prefix(keys.job_reports(JOB)) == kv.get_prefix(keys.job_notes(JOB)) == []
    assert kv.get(keys.job_body(JOB)) is None and kv.get(keys.job_body(JOB + "x")) is not None
    assert not run(store.read_rosters()).found
    kept = run(other.read_rosters())  # a job whose id extends ours: untouched
    assert (
        sorted(kept.joins) == [0, 1, 2] and list(kept.node_status) == ["n1"] and list(kept.pending) == ["n2"]
    )


def test_a_join_watch_sees_its_rounds_joins_and_nothing_else(store: JobStore, kv: KV, base: str) -> None:
    keys = Keys(base)
    run(store.create(make_spec()))
    lease = kv.grant_lease(30)
    events = Events()
    cancel = run(store.watch_joins(1, events.on_change, events.on_broken))
    try:
        run(store.join(0, _join("n1"), lease))
        run(store.join(1, _join("n2"), lease))
        run(store.set_waiting("n3", lease))
        run(store.put_node_status("n2", STATUS, lease))  # parts, but no join
        run(store.note_pending("n3", "no free slots", lease))
        run(store.mark_done(1, "n2"))
        run(store.join(10, _join("n4"), lease))
        run(store.withdraw(1, "n2"))
        seen = events.wait(keys.join(JOB, 1, "n2"), True)
    finally:
        cancel()
    assert seen == [(keys.join(JOB, 1, "n2"), False), (keys.join(JOB, 1, "n2"), True)]
    assert events.broken == 0


# -- a round as a head and one assignment per member --------------------------------------------------
def _close_big_round(store: JobStore, kv: KV, n: int) -> tuple[int, tuple[Join, ...]]:
    """Round 0 of ``n`` nodes closed by its oldest join (more members than one transaction holds)."""
    run(store.create(make_spec(nnodes=NodeRange(1, 300))))
    lease = kv.grant_lease(30)
    for i in range(n):
        run(store.join(0, _join(f"n{i:03d}", 29500 + i), lease))
    joins = run(store.read_rosters()).current_joins
    return lease, joins


def test_a_member_reads_the_head_and_its_own_assignment_and_status_reads_the_round_whole(
    store: JobStore, kv: KV
) -> None:
    _, joins = _close_big_round(store, kv, 250)  # three transactions of assignments, then the head
    result = rdzv.build_result(0, joins, 1.0, joins[0].create_revision)
    assert run(store.close(result, joins[0].node))
    mine = run(store.read_member("n117", 0, statuses=False))
    assert mine.assignment is not None and mine.closed == result.head()
    assert mine.me("n117") == result.member("n117") and mine.me("n118") is None  # only its own was read
    assert [p.node for p in mine.peers("n117")] == ["n116", "n118"]
    assert run(store.read_member("n117", None, statuses=False)).me("n117") is not None
    whole = run(store.read_rosters())
    assert whole.result == result and not whole.invalid


def test_a_half_written_round_is_not_closed_and_a_leader_that_lost_its_join_writes_nothing(
    store: JobStore, kv: KV, base: str
) -> None:
    lease, joins = _close_big_round(store, kv, 3)
    keys = Keys(base)
    stale = rdzv.build_result(0, joins, 1.0, joins[0].create_revision)
    run(store.withdraw(0, joins[0].node))  # the leader left before it closed: its guard fails
    assert not run(store.close(stale, joins[0].node))
    assert kv.get_prefix(keys.assignments(JOB, 0)) == [] and run(store.glance(0, "n001")).closed is False
    rest = run(store.read_rosters()).current_joins
    result = rdzv.build_result(0, rest, 2.0, rest[0].create_revision)
    assert run(store.close(result, rest[0].node))
    read = run(store.read_rosters())
    assert read.result == result and read.me("n000") is None and not read.invalid
    run(store.join(1, _join("n001"), lease))


def test_a_round_missing_an_assignment_fails_the_job_naming_the_round(
    store: JobStore, kv: KV, base: str
) -> None:
    _, joins = _close_big_round(store, kv, 3)
    result = rdzv.build_result(0, joins, 1.0, joins[0].create_revision)
    assert run(store.close(result, joins[0].node))
    kv.delete(Keys(base).assignment(JOB, 0, "n002"))  # someone with the prefix's rights
    read = run(store.read_rosters())
    assert read.ended and [k.key for k in read.invalid] == [f"rounds/{JOB}/0/"]
    assert "2 of its 3 assignments" in read.invalid[0].why
    assert run(store.read_member("n002", 0)).me("n002") is None  # not a member

"""The janitor: one node, elected by a key under its lease, does the cluster-wide clean-up."""

from __future__ import annotations

import asyncio

import pytest

from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.manager import janitorrule as rule
from elasticd.manager.janitor import MAX_TXN_DELETES, SOLO_GRACE_S, Janitor
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.jobparse import parse_jobs
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import EndReason, JobState
from tests.fakes import JOB, make_spec

pytestmark = pytest.mark.timeout(30)
KEYS = Keys("/x")


def janitor(kv: MemoryKV, node: str) -> Janitor:
    def store_of(job: str) -> JobStore:
        return InlineJobStore(kv, KEYS, job)

    return Janitor(kv, KEYS, node, store_of)


def test_one_node_is_elected_and_the_next_takes_over_when_its_lease_goes() -> None:
    kv = MemoryKV()
    a, b = janitor(kv, "a"), janitor(kv, "b")
    lease_a, lease_b = kv.grant_lease(30), kv.grant_lease(30)
    assert asyncio.run(a.elected(lease_a))
    assert not asyncio.run(b.elected(lease_b))
    assert asyncio.run(a.elected(lease_a))  # it keeps the role
    kv.revoke_lease(lease_a)  # its node died or stopped
    assert asyncio.run(b.elected(lease_b))
    assert not asyncio.run(a.elected(kv.grant_lease(30)))  # back with a new lease: not janitor


def _running(kv: MemoryKV, nodes: tuple[str, ...], nnodes: NodeRange, round_no: int = 0) -> list[int]:
    """Round ``round_no`` of the job closed with ``nodes`` as members; their leases."""
    store = InlineJobStore(kv, KEYS, JOB)
    if round_no == 0:
        run_inline(store.create(make_spec(nnodes=nnodes, max_restarts=1)))
    leases = [kv.grant_lease(30) for _ in nodes]
    for i, (node, lease) in enumerate(zip(nodes, leases, strict=True)):
        run_inline(store.join(round_no, Join(node, "127.0.0.1", 29500 + i, 2), lease))
    joins = run_inline(store.read_rosters()).current_joins
    first = min(joins, key=lambda j: j.create_revision)
    run_inline(
        store.close(rdzv.build_result(round_no, joins, 1.0 + round_no, first.create_revision), first.node)
    )
    return leases


def test_a_job_whose_only_member_stays_gone_past_the_grace_is_restarted_once_then_failed() -> None:
    kv = MemoryKV()
    store = InlineJobStore(kv, KEYS, JOB)
    now = [1000.0]
    j = Janitor(kv, KEYS, "n2", lambda job: InlineJobStore(kv, KEYS, job), clock=lambda: now[0])
    (lease,) = _running(kv, ("n1",), NodeRange(1, 1))
    kv.revoke_lease(lease)  # the only member's daemon died (or is frozen, or cut off from etcd)
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))
    now[0] += SOLO_GRACE_S - 1
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))
    assert run_inline(store.read_rosters()).current == 0  # within the grace: it may still come back
    now[0] += 1
    reads = {JOB: run_inline(store.read_rosters())}
    asyncio.run(j.sweep(reads))
    asyncio.run(j.sweep(reads))  # a second sweep of the same read changes nothing
    read = run_inline(store.read_rosters())
    assert read.current == 1 and read.restarts == 1 and read.final is None
    (lease2,) = _running(kv, ("n1",), NodeRange(1, 1), round_no=1)
    kv.revoke_lease(lease2)
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))  # a new round: a new grace
    assert run_inline(store.read_rosters()).final is None
    now[0] += SOLO_GRACE_S
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))
    final = run_inline(store.read_rosters()).final
    assert final is not None and final.state is JobState.FAILED and final.code is EndReason.NODES_LOST


def test_an_only_member_that_reasserts_within_the_grace_keeps_its_round() -> None:
    kv = MemoryKV()
    store = InlineJobStore(kv, KEYS, JOB)
    now = [1000.0]
    j = Janitor(kv, KEYS, "n2", lambda job: InlineJobStore(kv, KEYS, job), clock=lambda: now[0])
    (lease,) = _running(kv, ("n1",), NodeRange(1, 3))  # the job may grow: still its only member
    kv.revoke_lease(lease)
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))
    now[0] += SOLO_GRACE_S - 1
    run_inline(store.join(0, Join("n1", "127.0.0.1", 29500, 2), kv.grant_lease(30)))  # back
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))
    now[0] += SOLO_GRACE_S
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))
    read = run_inline(store.read_rosters())
    assert (read.current, read.restarts, read.final) == (0, 0, None)


def test_a_round_whose_several_members_are_all_gone_is_restarted_at_once() -> None:
    kv = MemoryKV()
    store = InlineJobStore(kv, KEYS, JOB)
    j = Janitor(kv, KEYS, "n3", lambda job: InlineJobStore(kv, KEYS, job), clock=lambda: 1000.0)
    for lease in _running(kv, ("n1", "n2"), NodeRange(2, 2)):
        kv.revoke_lease(lease)  # fenced before their leases expired: nothing of theirs runs
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))
    read = run_inline(store.read_rosters())
    assert read.current == 1 and read.restarts == 1


def test_a_job_with_an_invalid_record_is_failed_naming_the_key() -> None:
    kv = MemoryKV()
    store = InlineJobStore(kv, KEYS, JOB)
    run_inline(store.create(make_spec()))
    kv.put_json(KEYS.job(JOB) + "rdzv/0/result", {"garbage": True})
    asyncio.run(janitor(kv, "n1").sweep({JOB: run_inline(store.read_rosters())}))
    final = run_inline(store.read_rosters()).final
    assert final is not None and final.code is EndReason.INVALID_RECORD and "rdzv/0/result" in final.reason


def test_an_end_the_jobs_lifecycle_does_not_allow_is_refused() -> None:
    """A job that never ran cannot succeed: the janitor writes no such final record; it can fail."""
    kv = MemoryKV()
    store = InlineJobStore(kv, KEYS, JOB)
    run_inline(store.create(make_spec()))
    pending = run_inline(store.read_rosters())
    j = janitor(kv, "n1")
    asyncio.run(j._act(pending, rule.Finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, "")))
    assert run_inline(store.read_rosters()).final is None
    asyncio.run(j._act(pending, rule.Finalize(JobState.FAILED, EndReason.JOIN_TIMEOUT, "no nodes")))
    final = run_inline(store.read_rosters()).final
    assert final is not None and final.state is JobState.FAILED


def test_ended_jobs_are_deleted_after_the_retention_and_not_before() -> None:
    kv = MemoryKV()
    now = [1000.0]
    j = Janitor(
        kv, KEYS, "n1", lambda job: InlineJobStore(kv, KEYS, job), retention_s=60, clock=lambda: now[0]
    )
    store = InlineJobStore(kv, KEYS, JOB)
    run_inline(store.create(make_spec()))
    run_inline(store.finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, ""))
    ended_at = run_inline(store.read_rosters()).final.ended_at  # type: ignore[union-attr]
    now[0] = ended_at + 59
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))
    assert run_inline(store.read_rosters()).found
    now[0] = ended_at + 61
    asyncio.run(j.sweep({JOB: run_inline(store.read_rosters())}))
    assert not run_inline(store.read_rosters()).found
    running = InlineJobStore(kv, KEYS, "other-1")
    run_inline(running.create(make_spec(id="other-1")))
    now[0] += 10**6
    asyncio.run(j.sweep({"other-1": run_inline(running.read_rosters())}))
    assert run_inline(running.read_rosters()).found  # a job that has not ended is never expired


STATUS = {"state": "STOPPING", "round": 0, "devices": "", "pids": [], "updated_at": 1.0}


def test_parts_left_of_a_removed_job_are_deleted_and_other_jobs_keep_theirs() -> None:
    kv = MemoryKV()
    lease = kv.grant_lease(30)  # a daemon's lease: it lasts as long as the daemon
    store, kept = InlineJobStore(kv, KEYS, JOB), InlineJobStore(kv, KEYS, "kept-1")
    for s in (store, kept):
        run_inline(s.create(make_spec(id=s.job_id)))
        run_inline(s.join(0, Join("n1", "127.0.0.1", 29500, 2), lease))
    run_inline(store.read_rosters())  # (as an agent's store has read its job)
    run_inline(store.remove())
    for i in range(MAX_TXN_DELETES + 3):  # written late by leaving agents: more than one txn holds
        run_inline(store.note_pending(f"n{i}", "no free slots", lease))
    run_inline(store.put_node_status("n1", STATUS, lease))  # after a read of the job: not put
    run_inline(store.join(1, Join("n1", "127.0.0.1", 29500, 2), lease))  # nor a join
    assert kv.get_prefix(KEYS.job_reports(JOB)) == kv.get_prefix(KEYS.job_parts(JOB)) == []
    reads, strays = parse_jobs(KEYS, kv.get_prefix(KEYS.jobs()) + kv.get_prefix(KEYS.all_notes()))
    assert list(reads) == ["kept-1"] and list(strays) == [JOB] and len(strays[JOB]) == MAX_TXN_DELETES + 3
    asyncio.run(janitor(kv, "n1").drop_strays(strays))
    assert kv.get_prefix(KEYS.job_notes(JOB)) == []
    assert run_inline(kept.read_rosters()).current_joins  # a job's own parts stay


def test_parts_of_a_job_submitted_again_meanwhile_are_kept() -> None:
    kv = MemoryKV()
    lease = kv.grant_lease(30)
    store = InlineJobStore(kv, KEYS, JOB)
    run_inline(store.note_pending("n1", "no free slots", lease))
    _, strays = parse_jobs(KEYS, kv.get_prefix(KEYS.all_notes()))
    run_inline(store.create(make_spec()))  # after the janitor's read
    asyncio.run(janitor(kv, "n1").drop_strays(strays))
    assert list(run_inline(store.read_rosters()).pending) == ["n1"]


def test_a_waiting_job_fails_at_its_join_timeout_though_its_read_is_the_same() -> None:
    """What the janitor knows of a waiting job is kept per read of it (a queue of a thousand waits
    at every sweep); the time is not: the same read, swept after the join timeout, fails."""
    kv = MemoryKV()
    now = [0.0]
    j = Janitor(kv, KEYS, "n1", lambda job: InlineJobStore(kv, KEYS, job), clock=lambda: now[0])
    store, joined = InlineJobStore(kv, KEYS, JOB), InlineJobStore(kv, KEYS, "joined-1")
    run_inline(store.create(make_spec(join_timeout_s=30.0)))
    run_inline(joined.create(make_spec(id="joined-1", join_timeout_s=30.0)))
    run_inline(joined.join(0, Join("n1", "127.0.0.1", 29500, 2), kv.grant_lease(30)))
    reads = {JOB: run_inline(store.read_rosters()), "joined-1": run_inline(joined.read_rosters())}
    opened = reads[JOB].round
    assert opened is not None
    deadline = opened.opened_at + 30.0
    now[0] = deadline - 1
    asyncio.run(j.sweep(reads))
    assert run_inline(store.read_rosters()).final is None and j.next_due(reads) == deadline
    now[0] = deadline + 1
    assert j.next_due(reads) is None  # (past: the sweep acts on it)
    asyncio.run(j.sweep(reads))
    final = run_inline(store.read_rosters()).final
    assert final is not None and final.code is EndReason.JOIN_TIMEOUT
    assert run_inline(joined.read_rosters()).final is None  # a job with a join waits on

"""The per-user limits' pure rules (elasticd.jobs.quota) and the ticket adapter (jobs.ticket)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.config import Settings
from elasticd.decode import DecodeError
from elasticd.errors import ErrorCode
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.types import KeyValue
from elasticd.jobs import quota
from elasticd.jobs.quota import Limit, Limits, Quotas, over_limits
from elasticd.jobs.ticket import JobTicket, ticket_of, tickets_of
from elasticd.manager import quotacheck as quotas
from elasticd.manager.access import Admins
from elasticd.rendezvous.decider import build_result
from elasticd.rendezvous.jobparse import parse_job
from elasticd.rendezvous.jobread import InvalidKey, RostersRead
from elasticd.rendezvous.model import FinalRecord, Join, RoundInfo
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.head import body_bytes, check_body
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason
from tests import fakes

USER = Limits(
    Limit(2, "max_jobs_per_user"), Limit(3, "max_submits_per_minute"), Limit(1024, "max_spec_bytes")
)
ADMIN = Limits(Limit(5, "admin_max_jobs_per_user"), Limit(0, "admin_max_submits_per_minute"), USER.spec_bytes)
QUOTAS = Quotas(USER, ADMIN)


def ticket(
    job: str, uid: int = 1000, at: float = 0.0, state: JobState = JobState.PENDING, size: int = 100, **kw: int
) -> JobTicket:
    return JobTicket(job, f"u{uid}", uid, at, kw.get("priority", 0), size, state, kw.get("slots", 1),
                     kw.get("held", 0))  # fmt: skip


# -- settings ---------------------------------------------------------------------------------------
def test_quotas_come_from_the_settings_with_their_names() -> None:
    q = Quotas.from_settings(Settings())
    assert q.user.jobs == Limit(100, "max_jobs_per_user")
    assert q.user.submits_per_minute == Limit(60, "max_submits_per_minute")
    assert q.admin.jobs == Limit(1000, "admin_max_jobs_per_user")
    assert q.admin.submits_per_minute == Limit(600, "admin_max_submits_per_minute")
    assert q.user.spec_bytes == q.admin.spec_bytes == Limit(65536, "max_spec_bytes")
    assert q.of(True) is q.admin and q.of(False) is q.user


def test_zero_is_no_limit() -> None:
    assert not Limit(0, "x").exceeded_by(10**9)
    assert Limit(2, "x").exceeded_by(3) and not Limit(2, "x").exceeded_by(2)


# -- at submit --------------------------------------------------------------------------------------
def test_a_spec_over_the_size_names_the_limit_the_setting_and_the_largest_variables() -> None:
    env = {"SMALL": "x", "HUGE": "y" * 5000, "BIG": "z" * 2000, "MID": "w" * 900, "TINY": ""}
    err = quota.size_refusal(9000, env, USER)
    assert err is not None and err.code is ErrorCode.TOO_LARGE
    assert "8.8 KiB" in err.message and "1.0 KiB" in err.message and "max_spec_bytes" in err.message
    assert "HUGE (4.9 KiB), BIG (2.0 KiB), MID (909 bytes)" in err.message
    assert err.details["limit"] == 1024 and err.details["used"] == 9000
    assert err.details["setting"] == "max_spec_bytes"
    assert [e["name"] for e in err.details["largest_env"]] == ["HUGE", "BIG", "MID"]
    assert quota.size_refusal(1024, env, USER) is None


def test_size_is_the_stored_json() -> None:
    spec = fakes.make_spec(env={"A": "é" * 10})
    assert quota.stored_size(spec.to_json()) == len(
        json.dumps(spec.to_json(), separators=(",", ":")).encode()
    )
    assert quota.largest_env({"A": "é"}) == [("A", len('"A"') + len('"\\u00e9"') + 2)]


def test_one_job_too_many_names_the_count_the_limit_and_the_setting() -> None:
    assert quota.jobs_refusal("alice", 1, USER) is None
    err = quota.jobs_refusal("alice", 2, USER)
    assert err is not None and err.code is ErrorCode.QUOTA_EXCEEDED
    assert "alice has 2 jobs pending or running; the limit is 2 (setting max_jobs_per_user)" in err.message
    assert err.details == {"limit": 2, "used": 2, "setting": "max_jobs_per_user"}
    assert quota.jobs_refusal("root", 10**6, quota.UNLIMITED) is None


def test_the_rate_refusal_names_the_setting() -> None:
    err = quota.rate_refusal("bob", 3, 12.3, USER)
    assert err.code is ErrorCode.QUOTA_EXCEEDED and "setting max_submits_per_minute" in err.message
    assert err.details["limit"] == 3 and err.details["used"] == 3 and err.details["retry_after_s"] == 12.3


# -- on the scan ------------------------------------------------------------------------------------
def test_pending_jobs_past_the_limit_fail_newest_first_and_running_ones_never() -> None:
    tickets = [
        ticket("a1", at=1),
        ticket("a2", at=2),
        ticket("a3", at=3),
        ticket("a0", at=0, state=JobState.RUNNING),
        ticket("b1", uid=1001, at=1),
    ]
    verdicts = over_limits(tickets, QUOTAS, admins=())
    assert [(v.job_id, v.code) for v in verdicts] == [
        ("a2", EndReason.QUOTA_EXCEEDED),
        ("a3", EndReason.QUOTA_EXCEEDED),
    ]
    assert (
        "already has 2 jobs pending or running; the limit is 2 (setting max_jobs_per_user)"
        in verdicts[0].reason
    )


def test_admins_get_their_own_limit() -> None:
    tickets = [ticket(f"r{i}", uid=0, at=i) for i in range(7)]
    assert [v.job_id for v in over_limits(tickets, QUOTAS, admins={0})] == ["r5", "r6"]
    assert "admin_max_jobs_per_user" in over_limits(tickets, QUOTAS, admins={0})[0].reason


def test_a_spec_over_the_size_fails_and_does_not_count() -> None:
    tickets = [ticket("a1", at=1, size=5000), ticket("a2", at=2), ticket("a3", at=3)]
    verdicts = over_limits(tickets, QUOTAS, admins=())
    assert [(v.job_id, v.code) for v in verdicts] == [("a1", EndReason.TOO_LARGE)]
    assert "the limit is 1.0 KiB (setting max_spec_bytes)" in verdicts[0].reason
    # A job that runs is never stopped for its size (a node with a larger limit admitted it).
    assert over_limits([ticket("r", size=5000, state=JobState.RESTARTING)], QUOTAS, admins=()) == []


USERS = st.sampled_from([0, 1000, 1001, 1002])
TICKETS = st.lists(
    st.builds(
        ticket,
        job=st.text("abcdef0123", min_size=1, max_size=6),
        uid=USERS,
        at=st.integers(0, 20).map(float),
        state=st.sampled_from([JobState.PENDING, JobState.PENDING, JobState.RUNNING, JobState.RESTARTING]),
        size=st.sampled_from([10, 1024, 1025, 60000]),
    ),
    max_size=30,
    unique_by=lambda t: t.id,
)


@settings(max_examples=300, deadline=None)
@given(TICKETS, st.integers(0, 4), st.integers(0, 6), st.sets(USERS))
def test_after_the_verdicts_no_user_holds_more_than_the_limit_or_what_runs(
    tickets: list[JobTicket], user_limit: int, admin_limit: int, admins: set[int]
) -> None:
    limits = Quotas(
        Limits(Limit(user_limit, "u"), USER.submits_per_minute, USER.spec_bytes),
        Limits(Limit(admin_limit, "a"), ADMIN.submits_per_minute, USER.spec_bytes),
    )
    verdicts = over_limits(tickets, limits, admins)
    failed = {v.job_id for v in verdicts}
    assert len(failed) == len(verdicts)  # each job once
    by_id = {t.id: t for t in tickets}
    assert all(not by_id[j].started for j in failed)  # never a job that ran
    for v in verdicts:
        t = by_id[v.job_id]
        assert (v.code is EndReason.TOO_LARGE) == (t.spec_bytes > 1024)
    for uid in {t.uid for t in tickets}:
        mine = [t for t in tickets if t.uid == uid]
        kept = [t for t in mine if t.id not in failed]
        limit = (admin_limit if uid in admins else user_limit) or len(mine)
        assert len(kept) <= max(limit, sum(t.started for t in mine))
        # The pending jobs kept are the oldest ones that fit: no failed job is older than a kept one.
        over = [
            by_id[v.job_id]
            for v in verdicts
            if v.code is EndReason.QUOTA_EXCEEDED and by_id[v.job_id].uid == uid
        ]
        waiting = [t for t in kept if not t.started]
        assert all((o.submitted_at, o.id) > (k.submitted_at, k.id) for o in over for k in waiting)
        if len(kept) < limit:  # under the limit: only too-large specs failed
            assert not over


@given(TICKETS)
def test_the_rule_does_not_depend_on_the_order_it_is_given(tickets: list[JobTicket]) -> None:
    forward = over_limits(tickets, QUOTAS, {0})
    backward = over_limits(list(reversed(tickets)), QUOTAS, {0})
    assert sorted(forward, key=lambda v: v.job_id) == sorted(backward, key=lambda v: v.job_id)


# -- the adapter ------------------------------------------------------------------------------------
def _snap(job: str, round_no: int = 0, members: int = 0, **spec: object) -> RostersRead:
    read = RostersRead(job, head=replace(fakes.make_head(id=job, **spec), spec_bytes=777))
    read = replace(read, round=RoundInfo(round_no, RoundReason.START, 0.0))
    if members:
        joins = [Join(f"n{i}", "10.0.0.1", 29400 + i, 2, 0) for i in range(members)]
        read = replace(read, results={**read.results, round_no: build_result(round_no, joins, 1.0)})
    return read


def test_a_ticket_says_who_when_how_large_and_what_it_holds() -> None:
    t = ticket_of(_snap("j", nnodes=NodeRange(2, 4), nproc_per_node=3, priority=7, uid=1234, user="al"))
    assert t == JobTicket("j", "al", 1234, 1700000000.5, 7, 777, JobState.PENDING, slots=6, held=0)
    running = ticket_of(_snap("r", members=2))
    assert running is not None and running.state is JobState.RUNNING and running.held == 4 and running.started
    restarting = ticket_of(_snap("s", round_no=1))
    assert restarting is not None and restarting.state is JobState.RESTARTING and restarting.held == 0


def test_ended_and_unreadable_jobs_have_no_ticket() -> None:
    ended = _snap("e")
    ended = replace(ended, final=FinalRecord(JobState.KILLED, "", EndReason.KILLED, None, 1.0))
    invalid = _snap("i")
    invalid = replace(invalid, invalid=(InvalidKey("jobs/i/round", "bad"),))
    assert tickets_of([ended, invalid, RostersRead("x"), _snap("ok")]) == [ticket_of(_snap("ok"))]


def test_the_size_counted_is_the_one_the_head_states_and_its_body_must_have() -> None:
    """The scan counts what the head says the full spec takes; a node about to run the job reads
    the body, and a body of another size than its head says fails the job (``check_body``)."""
    keys = Keys("/p")
    spec = fakes.make_spec()
    head = fakes.head_of(spec)
    kvs = [KeyValue(keys.job_spec(spec.id), json.dumps(head.to_json()).encode(), 1, 1, 0)]
    parsed = parse_job(keys, spec.id, kvs).head
    assert parsed == head
    read = RostersRead(spec.id, head=parsed)
    read = replace(read, round=RoundInfo(0, RoundReason.START, 0.0))
    ticket = ticket_of(read)
    assert ticket is not None and ticket.spec_bytes == len(body_bytes(spec))
    padded = json.dumps(spec.to_json(), indent=1).encode()  # the same spec, written around the daemon
    with pytest.raises(DecodeError, match="spec_bytes"):
        check_body(head, padded)


def test_settings_like_objects_work() -> None:
    s = SimpleNamespace(max_spec_bytes=2048, max_jobs_per_user=1, max_submits_per_minute=2,
                        admin_max_jobs_per_user=3, admin_max_submits_per_minute=4)  # fmt: skip
    q = Quotas.from_settings(s)
    assert (q.user.jobs.value, q.admin.submits_per_minute.value, q.admin.spec_bytes.value) == (1, 4, 2048)


# -- the executor: every node fails what the rule names, once ---------------------------------------
def test_the_scan_fails_the_named_jobs_once_whoever_sees_them() -> None:
    kv, keys = MemoryKV(), Keys("/q")

    def store(job: str) -> InlineJobStore:
        return InlineJobStore(kv, keys, job)

    specs = [fakes.make_spec(id=f"j{i}", uid=1000, submitted_at=float(i)) for i in range(4)]
    specs.append(fakes.make_spec(id="admin", uid=0, submitted_at=9.0))
    for spec in specs:
        assert run_inline(store(spec.id).create(spec))
    reads = [run_inline(store(s.id).read_rosters()) for s in specs]
    admins = Admins(4242, groups_of=lambda uid: frozenset())
    tickets = tickets_of(reads)
    assert asyncio.run(quotas.enforce(tickets, QUOTAS, admins, store)) == {"j2", "j3"}
    assert asyncio.run(quotas.enforce(tickets, QUOTAS, admins, store)) == {"j2", "j3"}  # a no-op
    ended = {s.id: run_inline(store(s.id).read_rosters()).final for s in specs}
    assert {j for j, f in ended.items() if f is not None} == {"j2", "j3"}
    final = ended["j3"]
    assert final is not None and final.state is JobState.FAILED and final.code is EndReason.QUOTA_EXCEEDED
    assert "(setting max_jobs_per_user)" in final.reason

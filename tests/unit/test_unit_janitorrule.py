"""The janitor's rule: what it does about each job, from facts alone (no etcd, no clock)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from elasticd.manager import janitorrule as rule
from elasticd.rendezvous.jobread import InvalidKey, JobRead, JoinsRead, Live, fields_of
from elasticd.rendezvous.model import FinalRecord, Join, RoundHead, RoundInfo
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason
from tests.fakes import JOB, make_head

POLICY = rule.Policy(retention_s=60.0, solo_grace_s=30.0)
HEAD = make_head(nnodes=NodeRange(1, 2), max_restarts=1)
OPENED = 1000.0  # when the current round opened
TIMEOUT = HEAD.join_timeout_s


def closed(size: int = 1, round_no: int = 0) -> RoundHead:
    return RoundHead(round_no, 1, size, size, "127.0.0.1", 29500)


def read(*, heads: int | None = None, restarts: int = 0, joins: int | None = None, **kw: object) -> JobRead:
    """A running job, round 0 opened at ``OPENED``; closed with ``heads`` members; ``joins``: read
    with that many joins (None: the read of every job, which carries none)."""
    joined = tuple(Join(f"n{i}", "127.0.0.1", 29500 + i, 1) for i in range(joins or 0))
    base = JobRead(
        JOB,
        head=HEAD,
        round=RoundInfo(0, RoundReason.START, OPENED),
        restarts=restarts,
        heads={0: closed(heads)} if heads else {},
        **kw,  # type: ignore[arg-type]
    )
    return base if joins is None else JoinsRead(**fields_of(base), joins={0: joined} if joined else {})


def triage(s: JobRead, now: float) -> rule.Triage:
    return rule.triage(s, rule.wait_of(s), now, POLICY)


def test_an_ended_job_is_removed_after_its_retention_and_not_before() -> None:
    s = read(final=FinalRecord(JobState.SUCCEEDED, "", EndReason.SUCCEEDED, ended_at=OPENED))
    assert triage(s, OPENED + 60) == rule.Nothing()
    assert triage(s, OPENED + 60.5) == rule.Remove(OPENED)
    assert rule.triage(s, False, 1e12, rule.Policy(None, 30.0)) == rule.Nothing()  # kept for ever


def test_an_invalid_record_fails_the_job_before_anything_else_is_asked() -> None:
    s = read(heads=1, invalid=[InvalidKey("jobs/j/round", "bad")])
    assert triage(s, OPENED) == rule.FailInvalid()


def test_a_closed_round_asks_who_looks_after_it() -> None:
    assert triage(read(heads=2), OPENED) == rule.AskMembers(closed(2))


def test_an_open_round_is_left_be_until_its_join_timeout_then_its_joins_are_counted() -> None:
    s = read()
    assert rule.wait_of(s) == (OPENED, TIMEOUT)
    assert triage(s, OPENED + TIMEOUT) == rule.Nothing()
    assert triage(s, OPENED + TIMEOUT + 1) == rule.AskJoins()
    assert rule.judge_joins(s, joined=True) == rule.Nothing()  # its leader closes or fails it
    failed = rule.judge_joins(s, joined=False)
    assert isinstance(failed, rule.Finalize) and failed.reason is EndReason.JOIN_TIMEOUT
    assert failed.why == f"only 0 of the 1 nodes needed joined within {TIMEOUT:g}s"


def test_joins_already_read_are_not_counted_again() -> None:
    assert rule.wait_of(read(joins=1)) is True
    assert triage(read(joins=1), OPENED + TIMEOUT + 1) == rule.Nothing()
    ended = triage(read(joins=0), OPENED + TIMEOUT + 1)
    assert isinstance(ended, rule.Finalize) and ended.reason is EndReason.JOIN_TIMEOUT


def judge(
    alive: Live, size: int = 1, since: float | None = None, now: float = OPENED, r: int = 0
) -> rule.Judged:
    return rule.judge_members(read(heads=size, restarts=r), closed(size), alive, since, now, POLICY)


def test_a_member_there_looks_after_the_round_and_one_counted_gone_is_back() -> None:
    assert judge("n1") == rule.Judged(rule.Nothing(), None)
    assert judge("n1", since=OPENED - 5) == rule.Judged(rule.MemberBack("n1"), None)


def test_every_member_done_is_a_success() -> None:
    assert judge(frozenset({"a", "b"}), size=2).action == rule.Finalize(
        JobState.SUCCEEDED, EndReason.SUCCEEDED, ""
    )


def test_a_bad_join_read_fails_the_job_naming_it() -> None:
    bad = InvalidKey("parts/j/0/join/n1", "bad")
    assert judge(bad, since=3.0) == rule.Judged(rule.FailInvalid(bad), 3.0)


def test_an_only_member_gone_waits_its_grace_noted_once_then_is_given_up() -> None:
    first = judge(frozenset())
    assert first == rule.Judged(rule.Nothing(), OPENED, noted=True)
    assert judge(frozenset(), since=OPENED, now=OPENED + 29.9) == rule.Judged(rule.Nothing(), OPENED)
    later = judge(frozenset(), since=OPENED, now=OPENED + 30)
    assert later.missing_since is None and not later.noted
    assert later.action == rule.Bump(
        RoundInfo(1, RoundReason.MEMBER_LOST, OPENED + 30, (), "every node of round 0 was lost"), True
    )


def test_a_round_of_several_lost_is_restarted_at_once_then_the_job_fails_with_no_restart_left() -> None:
    assert isinstance(judge(frozenset({"a"}), size=3).action, rule.Bump)
    failed = judge(frozenset(), size=3, r=1).action
    assert isinstance(failed, rule.Finalize) and failed.reason is EndReason.NODES_LOST
    assert "no restarts left (1 of 1 used)" in failed.why


def test_gone_members_are_forgotten_when_their_job_ends_or_moves_on() -> None:
    reads = {"a": read(heads=1), "b": read(heads=1, invalid=[InvalidKey("k", "x")])}
    missing = {("a", 0): 1.0, ("a", 1): 2.0, ("b", 0): 3.0, ("c", 0): 4.0}
    assert rule.still_missing(missing, reads) == {("a", 0): 1.0}


def test_next_due_is_the_earliest_time_ahead() -> None:
    ended = read(final=FinalRecord(JobState.FAILED, "", EndReason.NODES_LOST, ended_at=OPENED))
    jobs = [ended, read()]
    assert rule.next_due([OPENED + 5], jobs, rule.wait_of, OPENED, POLICY) == OPENED + 35
    assert rule.next_due([], jobs, rule.wait_of, OPENED, POLICY) == min(OPENED + 60, OPENED + TIMEOUT)
    assert rule.next_due([], jobs, rule.wait_of, OPENED + 1e9, POLICY) is None  # all past: acted on
    assert rule.next_due([], [read(joins=1)], rule.wait_of, OPENED, POLICY) is None  # joined: none due


LIVE = st.one_of(
    st.sampled_from(["n1", "n2"]),
    st.frozensets(st.sampled_from(["a", "b", "c", "d"]), max_size=4),
    st.just(InvalidKey("parts/j/0/join/n1", "bad")),
)
TIMES = st.floats(0, 1e6, allow_nan=False)


@given(LIVE, st.integers(1, 4), st.one_of(st.none(), TIMES), TIMES, st.integers(0, 2), st.floats(0, 100))
def test_a_closed_round_judged(
    alive: Live, size: int, since: float | None, now: float, used: int, grace: float
) -> None:
    """Whatever the facts: a live member is never given up; a gone only member is counted from
    the first time it is seen gone and given up exactly when its grace is over; only a round with
    no member there ever restarts or fails, and never beyond the restart budget."""
    policy = rule.Policy(None, grace)
    judged = rule.judge_members(read(heads=size, restarts=used), closed(size), alive, since, now, policy)
    action = judged.action
    if isinstance(alive, str):
        assert action == (rule.Nothing() if since is None else rule.MemberBack(alive))
        assert judged.missing_since is None
    elif isinstance(alive, InvalidKey):
        assert action == rule.FailInvalid(alive) and judged.missing_since == since
    elif len(alive) >= size:
        assert action.__class__ is rule.Finalize and judged.missing_since == since
    else:
        started = now if since is None else since
        waits = size == 1 and now - started < grace
        assert judged.noted == (size == 1 and since is None)
        assert isinstance(action, rule.Nothing) == waits
        assert judged.missing_since == (started if waits else None if size == 1 else since)
        if isinstance(action, rule.Bump):
            assert used < HEAD.max_restarts and action.info.round == 1 and action.spend
        elif not waits:
            assert isinstance(action, rule.Finalize) and action.state is JobState.FAILED
            assert used >= HEAD.max_restarts


@given(
    st.one_of(st.none(), TIMES),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 2)),
    st.one_of(st.none(), st.integers(1, 3)),
    TIMES,
)
def test_triage_precedence(
    ended: float | None, bad: bool, joins: int | None, heads: int | None, now: float
) -> None:
    """Expired first, then invalid, then a job no one may look after; a job that waits in time,
    or one that ended, is never asked about (no read is made for it)."""
    final = FinalRecord(JobState.KILLED, "", EndReason.KILLED, ended_at=ended) if ended is not None else None
    invalid = [InvalidKey("jobs/j/round", "bad")] if bad else []
    s = read(heads=heads, joins=joins, final=final, invalid=invalid)
    got = triage(s, now)
    if final is not None:
        assert got == (rule.Remove(final.ended_at) if final.ended_at < now - 60 else rule.Nothing())
    elif bad:
        assert got == rule.FailInvalid()
    elif heads:
        assert got == rule.AskMembers(closed(heads))
    elif now - OPENED <= TIMEOUT or joins:
        assert got == rule.Nothing()
    elif joins is None:
        assert got == rule.AskJoins()
    else:
        assert isinstance(got, rule.Finalize) and got.reason is EndReason.JOIN_TIMEOUT

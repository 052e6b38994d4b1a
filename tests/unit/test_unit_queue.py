"""The fair queue (elasticd.jobs.queue): priority, then users take turns, then submission time."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.jobs.queue import Turns, admission_order, places, queue_order
from elasticd.jobs.ticket import JobTicket
from elasticd.terms.state import JobState


def ticket(
    job: str, uid: int, at: float, priority: int = 0, state: JobState = JobState.PENDING, held: int = 0
) -> JobTicket:
    return JobTicket(job, f"u{uid}", uid, at, priority, 100, state, 1, held)


def ids(tickets: list[JobTicket]) -> list[str]:
    return [t.id for t in tickets]


def test_one_users_hundred_jobs_hold_another_user_back_by_at_most_one() -> None:
    flood = [ticket(f"a{i:03}", 1000, float(i)) for i in range(100)]
    late = ticket("b", 1001, 500.0)
    order = ids(queue_order([*flood, late]))
    assert order.index("b") == 1 and order[0] == "a000"
    assert order[2:] == [f"a{i:03}" for i in range(1, 100)]


def test_users_take_turns_in_submission_order_and_priority_comes_first() -> None:
    tickets = [
        ticket("a1", 1, 1),
        ticket("a2", 1, 2),
        ticket("a3", 1, 3),
        ticket("b1", 2, 4),
        ticket("b2", 2, 5),
        ticket("c1", 3, 6),
        ticket("urgent", 3, 9, priority=10),
    ]
    assert ids(queue_order(tickets)) == ["urgent", "a1", "b1", "c1", "a2", "b2", "a3"]


def test_the_user_admitted_least_recently_goes_first_then_fewer_slots_held() -> None:
    tickets = [ticket("a1", 1, 1), ticket("b1", 2, 2), ticket("c1", 3, 3)]
    turns = Turns()
    assert ids(queue_order(tickets, turns.last)) == ["a1", "b1", "c1"]  # none admitted: oldest first
    turns.admitted(1)
    assert ids(queue_order(tickets, turns.last)) == ["b1", "c1", "a1"]  # never admitted come first
    turns.admitted(3)
    turns.admitted(2)
    assert ids(queue_order(tickets, turns.last)) == ["a1", "c1", "b1"]


def test_turns_are_bounded() -> None:
    turns = Turns(max_users=2)
    for uid in (1, 2, 1, 3):
        turns.admitted(uid)
    assert list(turns.last) == [1, 3]  # 2 was admitted least recently: forgotten (first again)


def test_in_each_turn_users_holding_fewer_slots_go_first() -> None:
    tickets = [
        ticket("big-run", 1, 0, state=JobState.RUNNING, held=16),
        ticket("a1", 1, 1),
        ticket("a2", 1, 2),
        ticket("b1", 2, 3),
        ticket("b2", 2, 4),
    ]
    assert ids(queue_order(tickets)) == ["b1", "a1", "b2", "a2"]


def test_jobs_that_ran_come_before_the_queue() -> None:
    tickets = [
        ticket("new", 2, 1),
        ticket("restarting", 1, 5, state=JobState.RESTARTING),
        ticket("running", 1, 3, state=JobState.RUNNING, held=2),
    ]
    assert admission_order(tickets) == ["running", "restarting", "new"]


def test_places_say_where_and_why() -> None:
    tickets = [
        ticket("a1", 1, 1),
        ticket("a2", 1, 2),
        ticket("b1", 2, 3),
        ticket("hi", 2, 4, priority=5),
        ticket("run", 1, 0, state=JobState.RUNNING, held=4),
    ]
    got = places(tickets)
    assert set(got) == {"a1", "a2", "b1", "hi"}
    assert [(got[j].place, got[j].of) for j in ("hi", "b1", "a1", "a2")] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert got["hi"].why.startswith("priority 5; u2's waiting job 1: users take turns")
    assert "1 waiting job(s) of higher priority first" in got["a2"].why
    assert "u1's waiting job 2" in got["a2"].why and "(u1 holds 4 slots)" in got["a2"].why
    turns = Turns()
    turns.admitted(1)
    assert "(u1 holds 4 slots, had a job admitted here lately)" in places(tickets, turns.last)["a1"].why
    assert got["a1"].to_json() == {"place": 3, "of": 4, "why": got["a1"].why}


TICKETS = st.lists(
    st.builds(
        ticket,
        job=st.text("abcdefgh", min_size=1, max_size=5),
        uid=st.integers(0, 4),
        at=st.integers(0, 30).map(float),
        priority=st.sampled_from([0, 0, 0, 1, 5]),
        state=st.sampled_from([JobState.PENDING, JobState.PENDING, JobState.RUNNING]),
        held=st.integers(0, 8),
    ),
    max_size=40,
    unique_by=lambda t: t.id,
)


@settings(max_examples=300, deadline=None)
@given(TICKETS)
def test_the_queue_is_a_permutation_of_the_waiting_jobs(tickets: list[JobTicket]) -> None:
    order = queue_order(tickets)
    assert sorted(ids(order)) == sorted(t.id for t in tickets if not t.started)
    assert sorted(admission_order(tickets)) == sorted(t.id for t in tickets)
    assert [p.place for p in sorted(places(tickets).values(), key=lambda p: p.place)] == list(
        range(1, len(order) + 1)
    )


@settings(max_examples=300, deadline=None)
@given(TICKETS)
def test_priority_wins_and_a_users_own_jobs_keep_their_order(tickets: list[JobTicket]) -> None:
    order = queue_order(tickets)
    assert [t.priority for t in order] == sorted((t.priority for t in order), reverse=True)
    for uid in {t.uid for t in order}:
        for priority in {t.priority for t in order}:
            mine = [t for t in order if t.uid == uid and t.priority == priority]
            assert mine == sorted(mine, key=lambda t: (t.submitted_at, t.id))


@settings(max_examples=300, deadline=None)
@given(TICKETS)
def test_a_users_kth_job_is_behind_at_most_k_jobs_of_any_other_user_of_its_priority(
    tickets: list[JobTicket],
) -> None:
    """The bound on waiting: a user's first waiting job has at most one job of any other user
    of its priority ahead of it (users take turns, whatever one user queued)."""
    order = queue_order(tickets)
    seen: Counter[tuple[int, int]] = Counter()  # (priority, uid) -> waiting jobs met so far
    for i, t in enumerate(order):
        seen[(t.priority, t.uid)] += 1
        k = seen[(t.priority, t.uid)]
        ahead = Counter(o.uid for o in order[:i] if o.priority == t.priority and o.uid != t.uid)
        assert all(n <= k for n in ahead.values()), (t, ahead)


@given(TICKETS)
def test_every_node_orders_alike_whatever_order_it_read_the_jobs_in(tickets: list[JobTicket]) -> None:
    assert admission_order(tickets) == admission_order(list(reversed(tickets)))


@settings(max_examples=300, deadline=None)
@given(TICKETS, st.lists(st.integers(0, 4), max_size=5))
def test_across_admissions_a_waiting_user_is_next_after_at_most_one_of_anyone_elses(
    tickets: list[JobTicket], earlier: list[int]
) -> None:
    """Admit the head of the queue, again and again (as nodes free up one slot at a time): between
    two admissions of one user, every user who waited all along at the top priority had one."""
    waiting = [t for t in tickets if not t.started]
    top = max((t.priority for t in waiting), default=0)
    waiting = [replace(t, priority=top) for t in waiting]  # one priority: turns alone decide
    turns = Turns()
    for uid in earlier:  # what this node admitted before
        turns.admitted(uid)
    admitted: list[int] = []
    while waiting:
        head = queue_order(waiting, turns.last)[0]
        waiting.remove(head)
        turns.admitted(head.uid)
        admitted.append(head.uid)
        still = {t.uid for t in waiting}
        previous = [i for i, uid in enumerate(admitted[:-1]) if uid == head.uid]
        if previous:
            between = set(admitted[previous[-1] + 1 : -1])
            assert still - {head.uid} <= between, (admitted, still)

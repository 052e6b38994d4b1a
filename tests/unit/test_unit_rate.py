"""Submits per user per minute (elasticd.jobs.rate): exact to the second, bounded in memory."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.jobs.rate import SubmitWindow


def test_the_limit_holds_within_a_minute_and_frees_up_after_it() -> None:
    w = SubmitWindow()
    assert [w.admit(1, 3, t).allowed for t in (100.0, 100.5, 110.0)] == [True, True, True]
    refused = w.admit(1, 3, 130.0)
    assert not refused.allowed and refused.used == 3
    assert refused.retry_after_s == pytest.approx(100 + 1 + 60 - 130.0)
    assert w.admit(2, 3, 130.0).allowed  # another user has a window of their own
    assert not w.admit(1, 3, 160.9).allowed  # the bucket of second 100 counts until 161
    assert w.admit(1, 3, 161.0).allowed  # both submits of second 100 left the window
    assert w.admit(1, 3, 161.0).allowed
    assert not w.admit(1, 3, 161.5).allowed  # 110, 161, 161


def test_zero_is_no_limit_but_still_bounded() -> None:
    w = SubmitWindow()
    for i in range(10_000):
        assert w.admit(7, 0, 1000.0 + i * 0.01).allowed
    assert len(w._users[7]) <= 61  # one bucket a second, a minute's worth


def test_a_refused_submit_is_not_counted() -> None:
    w = SubmitWindow()
    assert w.admit(1, 1, 0.0).allowed
    for t in range(1, 60):
        assert not w.admit(1, 1, float(t)).allowed
    assert w.admit(1, 1, 61.0).allowed


def test_idle_users_are_forgotten_and_active_ones_bounded() -> None:
    w = SubmitWindow(max_users=3)
    for uid in range(3):
        w.admit(uid, 5, 0.0)
    assert len(w) == 3
    w.admit(99, 5, 61.0)  # everyone else has been idle for a whole window
    assert len(w) == 1
    for uid in range(10):
        w.admit(uid, 5, 62.0 + uid)
    assert len(w) == 3  # the least recently active are dropped past max_users
    assert set(w._users) == {7, 8, 9}


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        SubmitWindow(window_s=0)
    with pytest.raises(ValueError):
        SubmitWindow(max_users=0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.floats(0, 5, allow_nan=False)), max_size=200),
    st.integers(1, 6),
)
def test_no_minute_ever_holds_more_admitted_submits_than_the_limit(
    steps: list[tuple[int, float]], limit: int
) -> None:
    w = SubmitWindow()
    now = 1000.0
    admitted: dict[int, list[float]] = {}
    for uid, gap in steps:
        now += gap
        used_before = sum(1 for t in admitted.get(uid, []) if t > now - 60)
        decision = w.admit(uid, limit, now)
        if decision.allowed:
            admitted.setdefault(uid, []).append(now)
        else:  # refused only when the exact count is at least close to the limit
            assert decision.used == limit and decision.retry_after_s > 0
        if used_before < limit and not decision.allowed:
            # a refusal under the exact count: only because of the one-second rounding
            assert any(now - 61 < t <= now - 60 for t in admitted[uid])
    for times in admitted.values():
        for i, start in enumerate(times):
            assert sum(1 for t in times[i:] if t < start + 60) <= limit

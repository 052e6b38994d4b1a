"""The goodput ledger: every second since submission in exactly one cause, each cause as defined."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.decode import DecodeError
from elasticd.progress.accounts import Accounts, Books
from elasticd.progress.goodput import (
    Cause,
    Entered,
    Event,
    Hung,
    Launched,
    Stepped,
    Stopped,
    Tally,
    combine,
    replay,
    seconds,
)
from elasticd.progress.protocol import Phase, PhaseReport, StepReport
from elasticd.rendezvous.model import NodeStatus

T0 = 1000.0


def steps(start: float, first: int, count: int, every: float = 1.0) -> list[Event]:
    return [Stepped(start + i * every, first + i) for i in range(count)]


def test_a_quiet_run_is_waiting_startup_then_productive() -> None:
    ledger = replay(T0, [Launched(T0 + 10, 0), *steps(T0 + 15, 0, 10)])  # the last step at +24
    tally = seconds(ledger, T0 + 24)
    assert (tally.waiting_s, tally.startup_s, tally.productive_s) == (10, 5, 9)
    assert tally.total_s == 24 and tally.ratio == pytest.approx(9 / 24)
    assert seconds(ledger, T0 + 24.5).productive_s == 9.5  # the step in flight counts as its step would


def test_a_crash_is_restart_to_the_first_step_and_the_redo_is_redone() -> None:
    events: list[Event] = [Launched(T0, 0), *steps(T0 + 1, 0, 10)]  # steps 0..9 at +1..+10
    events += [Stopped(T0 + 10.5, failed=True), Launched(T0 + 12, 1)]
    events += steps(T0 + 14, 6, 6)  # restored at 6 (its first step ends the restart): 7..9 redone
    tally = seconds(replay(T0, events), T0 + 19)
    assert tally.startup_s == 1 and tally.restart_s == 4  # 10 -> 14 (the lost half step included)
    assert tally.redone_s == 3 and tally.productive_s == 9 + 2  # 1..9, then steps 10 and 11
    assert tally.total_s == 19


def test_a_jump_over_the_highest_step_is_redone_in_proportion() -> None:
    events: list[Event] = [Launched(T0, 0), Stepped(T0 + 1, 0), Stepped(T0 + 2, 4)]
    events += [Stopped(T0 + 2, failed=True), Launched(T0 + 3, 1), Stepped(T0 + 4, 2), Stepped(T0 + 8, 6)]
    tally = seconds(replay(T0, events), T0 + 8)
    assert tally.redone_s == 2 and tally.productive_s == 1 + 2  # 2 -> 6: 3, 4 redone; 5, 6 new


def test_a_hang_is_hung_from_the_last_report_to_its_detection() -> None:
    events: list[Event] = [Launched(T0, 0), *steps(T0 + 1, 0, 5), Hung(T0 + 35)]  # last step at +5
    events += [Stopped(T0 + 36, failed=True), Launched(T0 + 37, 1), Stepped(T0 + 40, 5)]
    tally = seconds(replay(T0, events), T0 + 40)
    assert tally.hung_s == 30 and tally.restart_s == 5 and tally.productive_s == 4


def test_a_drain_or_a_peer_failure_is_told_by_the_next_launch() -> None:
    base: list[Event] = [Launched(T0, 0), *steps(T0 + 1, 0, 5), Stopped(T0 + 6, failed=False)]
    drained = seconds(replay(T0, [*base, Launched(T0 + 8, 0), Stepped(T0 + 10, 5)]), T0 + 10)
    assert drained.waiting_s == 3 and drained.startup_s == 1 + 2  # 5 -> 8 waiting; 8 -> 10 startup
    peer = seconds(replay(T0, [*base, Launched(T0 + 8, 1), Stepped(T0 + 10, 5)]), T0 + 10)
    assert peer.restart_s == 5 and peer.waiting_s == 0
    assert seconds(replay(T0, base), T0 + 9).waiting_s == 4  # no launch yet: waiting, for now


def test_checkpoint_phases_count_apart_from_the_step_around_them() -> None:
    events: list[Event] = [Launched(T0, 0), Stepped(T0 + 1, 0), Entered(T0 + 1.5, Phase.CHECKPOINT)]
    events += [Entered(T0 + 3.5, Phase.STEP), Stepped(T0 + 4, 1), Entered(T0 + 4, Phase.CHECKPOINT)]
    tally = seconds(replay(T0, events), T0 + 5)
    assert tally.checkpoint_s == 2 + 1 and tally.productive_s == 1 and tally.startup_s == 1


def test_a_node_that_joins_late_waited_and_is_no_restart() -> None:
    tally = seconds(replay(T0, [Launched(T0 + 50, 3), Stepped(T0 + 52, 100)]), T0 + 52)
    assert (tally.waiting_s, tally.startup_s, tally.restart_s) == (50, 2, 0)


def test_combine_weights_by_ranks_and_scales_to_the_wall() -> None:
    a, b = Tally(productive_s=80, waiting_s=20), Tally(productive_s=30, hung_s=20)
    job = combine([(a, 2), (b, 1)], wall_s=100)
    assert job.total_s == pytest.approx(100)
    assert job.productive_s == pytest.approx(100 * (160 + 30) / 250)
    assert combine([], 10) == Tally() and combine([(a, 1)], 0) == Tally()


def test_a_tally_read_back_is_bounded() -> None:
    assert Tally.from_json(Tally(productive_s=1.5).to_json()) == Tally(productive_s=1.5)
    bad: object
    for bad in ({"hung_s": -1}, {"hung_s": math.inf}, {"hung_s": 1e11}, {"hung_s": "1"}, []):
        with pytest.raises((DecodeError, ValueError)):
            Tally.from_json(bad)


def test_losses_are_the_largest_first() -> None:
    tally = Tally(productive_s=5, restart_s=2, hung_s=3)
    assert tally.losses() == [(Cause.HUNG, 3), (Cause.RESTART, 2)]


# -- properties ------------------------------------------------------------------------------------
_times = st.floats(min_value=0, max_value=50, allow_nan=False)
_event = st.one_of(
    st.builds(Launched, _times, st.integers(0, 5)),
    st.builds(Stepped, _times, st.integers(0, 30)),
    st.builds(Entered, _times, st.sampled_from(list(Phase))),
    st.builds(Hung, _times),
    st.builds(Stopped, _times, st.booleans()),
)


def _timeline(deltas_and_events: list[tuple[float, Event]]) -> list[Event]:
    """Events at increasing times (each ``at`` is a delta from the previous event)."""
    out, at = [], T0
    for delta, event in deltas_and_events:
        at += delta
        out.append(type(event)(at, *[getattr(event, f) for f in event.__dataclass_fields__ if f != "at"]))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_times, _event), max_size=40), _times)
def test_the_causes_always_add_up_to_the_wall_time_and_none_is_negative(
    timed: list[tuple[float, Event]], after: float
) -> None:
    events = _timeline(timed)
    now = (events[-1].at if events else T0) + after
    tally = seconds(replay(T0, events), now)
    assert tally.total_s == pytest.approx(now - T0, abs=1e-6)
    assert all(tally.of(c) >= 0 for c in Cause)


@settings(max_examples=200, deadline=None)
@given(st.lists(_event, max_size=30), _times)
def test_events_out_of_order_never_lose_or_invent_time(events: list[Event], now: float) -> None:
    ledger = replay(T0, events)  # every time here is before T0: each counts as the open start
    tally = seconds(ledger, T0 + now)
    assert tally.total_s == pytest.approx(now, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_times, _event), max_size=40))
def test_the_ledger_only_ever_adds(timed: list[tuple[float, Event]]) -> None:
    events, before = _timeline(timed), Tally()
    for i, event in enumerate(events):  # by position: equal events may repeat
        ledger = replay(T0, events[: i + 1])
        now = seconds(ledger, event.at)
        assert all(now.of(c) >= ledger.tally.of(c) - 1e-9 for c in Cause)
        assert all(ledger.tally.of(c) >= before.of(c) - 1e-9 for c in Cause)
        before = ledger.tally


def test_accounts_follow_the_first_ranks_reports_and_the_launcher() -> None:
    now = [T0]
    accounts = Accounts(T0 - 10, lambda: now[0])
    accounts.launched(0)
    accounts.reported(StepReport(None), 0, T0 + 2)
    accounts.reported(PhaseReport(Phase.CHECKPOINT), 0, T0 + 3)
    accounts.reported(PhaseReport(Phase.STEP), 0, T0 + 4)
    accounts.reported(StepReport(None), 1, T0 + 5)
    now[0] = T0 + 6
    accounts.hung()
    accounts.stopped(True)
    assert accounts.settled() == Tally(productive_s=2, checkpoint_s=1, waiting_s=10, hung_s=1, startup_s=2)
    now[0] = T0 + 8
    assert accounts.tally().restart_s == 2 and accounts.tally().total_s == 18


def test_a_node_back_in_a_job_picks_its_ledger_up_where_it_stood() -> None:
    now = [T0]
    books = Books(most=2)
    first = books.of("j", T0 - 10, lambda: now[0])
    first.launched(0)
    first.reported(StepReport(None), 0, T0 + 2)
    now[0] = T0 + 3
    first.stopped(False)  # drained: the next launch says what the gap was
    again = books.of("j", T0 - 10, lambda: now[0])
    assert again is first
    now[0] = T0 + 7
    again.launched(0)  # no restart spent: the drain's time waited
    assert again.settled() == Tally(waiting_s=15, startup_s=2)  # the step in flight was lost
    books.of("k", T0, lambda: now[0])
    books.of("l", T0, lambda: now[0])
    assert books.of("j", T0, lambda: now[0]) is not first  # the least recently used, forgotten


def test_a_node_report_with_a_bad_tally_is_refused() -> None:
    status = {"state": "RUNNING", "round": 0, "devices": "", "pids": [], "updated_at": T0}
    assert NodeStatus.from_json(status | {"goodput": Tally(hung_s=2).to_json()}).goodput == Tally(hung_s=2)
    assert NodeStatus.from_json(status).goodput is None
    with pytest.raises(DecodeError):
        NodeStatus.from_json(status | {"goodput": {"hung_s": -5}})

"""The goodput ledger across what a node's memory does not see: a restart of its daemon (picked
up from the mark its report carries) and a hang on another node of its round (read from the
round's record)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from elasticd.agent import blame
from elasticd.agent.actions import StartWorkers
from elasticd.decode import DecodeError
from elasticd.progress.accounts import Books
from elasticd.progress.goodput import (
    Cause,
    Entered,
    Event,
    Hung,
    Launched,
    Mark,
    Silence,
    Stepped,
    Stopped,
    Tally,
    apply,
    marked,
    published,
    replay,
    resumed,
    seconds,
)
from elasticd.progress.protocol import Phase
from elasticd.rendezvous.model import NodeStatus, RoundInfo
from elasticd.terms.state import FailureKind, RoundReason, WorkerFailure
from tests.agent_steps import decide, failure, job_read, joining, member

T0 = 1000.0


def steps(start: float, first: int, count: int, every: float = 1.0) -> list[Event]:
    return [Stepped(start + i * every, first + i) for i in range(count)]


# -- a daemon restart ------------------------------------------------------------------------------
def _ran_to_step_9() -> list[Event]:
    return [Launched(T0 + 10, 0), *steps(T0 + 11, 0, 10)]  # steps 0..9 at +11..+20


def test_a_restarted_daemon_keeps_the_settled_seconds_and_its_down_time_is_the_restart() -> None:
    mark = marked(replay(T0, _ran_to_step_9()))  # published at +20.5: the half step after 9 unsettled
    assert mark == Mark(Tally(productive_s=9, waiting_s=10, startup_s=1), kept=9, restarts=0)
    ledger = resumed(T0, mark, written_at=T0 + 20.5, now=T0 + 25)
    assert seconds(ledger, T0 + 25).total_s == 25  # undecided until the launch: waiting, for now
    for event in [Launched(T0 + 27, 1), *steps(T0 + 29, 8, 3)]:  # restored at 8: 9 redone, 10 new
        ledger = apply(ledger, event)
    tally = seconds(ledger, T0 + 31)
    assert tally == Tally(productive_s=9 + 1, redone_s=1, restart_s=7 + 2, waiting_s=10, startup_s=1)


def test_a_restart_that_spent_none_of_the_jobs_restarts_waited() -> None:
    mark = marked(replay(T0, [*_ran_to_step_9(), Stopped(T0 + 21, failed=False)]))  # drained
    ledger = apply(resumed(T0, mark, T0 + 22, T0 + 25), Launched(T0 + 27, 0))
    assert seconds(ledger, T0 + 27) == Tally(productive_s=9, waiting_s=10 + 7, startup_s=1)


def test_a_node_restarting_from_its_own_failure_or_never_launched_keeps_what_it_was() -> None:
    failed = marked(replay(T0, [*_ran_to_step_9(), Stopped(T0 + 20.5, failed=True)]))
    assert failed.restarting
    assert seconds(resumed(T0, failed, T0 + 21, T0 + 25), T0 + 25).restart_s == 0.5 + 4.5
    never = marked(replay(T0, []))
    assert never == Mark(Tally()) and seconds(resumed(T0, never, T0 + 3, T0 + 5), T0 + 5).waiting_s == 5


@pytest.mark.parametrize(
    ("written_at", "now"),
    [(T0 - 1, T0 + 30), (T0 + 10, T0 + 30), (T0 + 20.5, T0 + 15)],
    ids=["before-the-submission", "more-than-it-had-then", "more-than-it-has-now"],
)
def test_a_mark_that_cannot_be_this_jobs_is_ignored(written_at: float, now: float) -> None:
    mark = marked(replay(T0, _ran_to_step_9()))  # 20 settled seconds
    ledger = resumed(T0, mark, written_at, now)
    assert ledger.tally == Tally() and seconds(ledger, now).total_s == max(0, now - T0)


def test_the_mark_is_published_with_the_report_and_read_back_bounded() -> None:
    ledger = replay(T0, _ran_to_step_9())
    report = {"state": "RUNNING", "round": 0, "devices": "", "pids": [], "updated_at": T0 + 20}
    report |= published(ledger, T0 + 20)
    status = NodeStatus.from_json(report)
    assert status.ledger == marked(ledger) and status.goodput == seconds(ledger, T0 + 20)
    assert published(None, T0) == {"goodput": None, "ledger": None}
    assert NodeStatus.from_json(report | {"ledger": None}).ledger is None
    settled = Tally().to_json()
    for bad in ({"settled": settled, "kept": -1}, {"settled": settled, "restarts": 10**6}, {"kept": 3}):
        with pytest.raises(DecodeError):
            NodeStatus.from_json(report | {"ledger": bad})


def test_books_pick_a_job_up_from_a_mark_unless_they_hold_it() -> None:
    now = [T0 + 25]
    books = Books()
    mark = marked(replay(T0, _ran_to_step_9()))
    assert not books.holds("j")
    picked = books.resume("j", T0, lambda: now[0], mark, T0 + 20.5)
    assert books.holds("j") and books.of("j", T0, lambda: now[0]) is picked
    assert picked.settled() == mark.settled
    assert books.resume("j", T0, lambda: now[0], Mark(Tally()), T0) is picked  # the newer one kept


_times = st.floats(min_value=0, max_value=50, allow_nan=False)
_silence = st.builds(Silence, st.floats(T0 - 100, T0 + 2500), st.floats(T0 - 100, T0 + 2500))
_event = st.one_of(
    st.builds(Launched, _times, st.integers(0, 5), st.none() | _silence),
    st.builds(Stepped, _times, st.integers(0, 30)),
    st.builds(Entered, _times, st.sampled_from(list(Phase))),
    st.builds(Hung, _times),
    st.builds(Stopped, _times, st.booleans()),
)


def _timeline(timed: list[tuple[float, Event]], start: float) -> list[Event]:
    out, at = [], start
    for delta, event in timed:
        at += delta
        out.append(replace(event, at=at))
    return out


@settings(max_examples=200, deadline=None)
@example(  # a report read back at once: its settled seconds end a float's rounding after it
    before=[(0.4998583912830036, Launched(0.0, 0, None)), (24.0, Launched(0.0, 0, None)),
            (1.2565828419084735, Stepped(0.0, 0))],
    after=[], written=0.0, down=0.0, tail=0.0,
)  # fmt: skip
@given(
    st.lists(st.tuples(_times, _event), max_size=25),
    st.lists(st.tuples(_times, _event), max_size=25),
    _times,
    _times,
    _times,
)
def test_across_a_restart_the_causes_add_up_and_what_was_settled_stays(
    before: list[tuple[float, Event]],
    after: list[tuple[float, Event]],
    written: float,
    down: float,
    tail: float,
) -> None:
    first = _timeline(before, T0)
    mark = marked(replay(T0, first))
    written_at = (first[-1].at if first else T0) + written
    back = written_at + down
    ledger = resumed(T0, mark, written_at, back)
    second = _timeline(after, back)
    for event in second:
        ledger = apply(ledger, event)
    end = (second[-1].at if second else back) + tail
    tally = seconds(ledger, end)
    assert tally.total_s == pytest.approx(end - T0, abs=1e-6)
    assert all(tally.of(c) >= mark.settled.of(c) - 1e-9 for c in Cause)


# -- a hang on another node -------------------------------------------------------------------------
def test_a_peer_blocked_by_a_hang_books_it_as_hung_from_the_silence_to_the_rounds_move() -> None:
    events: list[Event] = [Launched(T0, 0), *steps(T0 + 1, 0, 5)]  # its last step at +5
    events += [Stopped(T0 + 35.5, failed=False)]  # told by the round, which moved at +35
    events += [Launched(T0 + 37, 1, Silence(T0 + 5.2, T0 + 35)), Stepped(T0 + 40, 5)]
    tally = seconds(replay(T0, events), T0 + 40)
    assert tally.hung_s == pytest.approx(29.8) and tally.restart_s == pytest.approx(0.2 + 2 + 3)
    assert tally.productive_s == 4 and tally.total_s == pytest.approx(40)
    alone = seconds(replay(T0, [*events[:-2], Launched(T0 + 37, 1), Stepped(T0 + 40, 5)]), T0 + 40)
    assert alone.hung_s == 0 and alone.restart_s == 35  # no silence: a peer's failure is restart


def test_the_hung_node_adds_only_the_time_from_its_detection_to_the_rounds_move() -> None:
    events: list[Event] = [Launched(T0, 0), *steps(T0 + 1, 0, 5), Hung(T0 + 35)]
    events += [Stopped(T0 + 36, failed=True), Launched(T0 + 37, 1, Silence(T0 + 5, T0 + 35.3))]
    tally = seconds(replay(T0, [*events, Stepped(T0 + 40, 5)]), T0 + 40)
    assert tally.hung_s == pytest.approx(30.3) and tally.restart_s == pytest.approx(4.7)


def test_a_silence_outside_the_undecided_time_books_nothing() -> None:
    events: list[Event] = [Launched(T0, 0), *steps(T0 + 1, 0, 5), Stopped(T0 + 6, failed=False)]
    for silence in (Silence(T0 - 50, T0 + 2), Silence(T0 + 9, T0 + 8), Silence(T0 + 100, T0 + 200)):
        tally = seconds(replay(T0, [*events, Launched(T0 + 8, 1, silence)]), T0 + 8)
        assert tally.hung_s == 0 and tally.restart_s == 3
    with pytest.raises(ValueError):
        Silence(float("nan"), T0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_times, _event), max_size=40))
def test_with_silences_the_causes_still_add_up_and_none_is_negative(timed: list[tuple[float, Event]]) -> None:
    events = _timeline(timed, T0)
    now = (events[-1].at if events else T0) + 1
    tally = seconds(replay(T0, events), now)
    assert tally.total_s == pytest.approx(now - T0, abs=1e-6)
    assert all(tally.of(c) >= 0 for c in Cause)


def _hang(failed_at: float | None, kind: FailureKind = FailureKind.HANG) -> dict[str, object]:
    hang = WorkerFailure(
        node="n2", attempt=0, rank=1, local_rank=0, exit_code=None, signal=None, message="rank 1 hung",
        output_tail="", failed_at=failed_at, kind=kind,
    )  # fmt: skip
    return hang.to_json()


def test_the_silence_is_read_from_a_round_a_hang_opened() -> None:
    info = RoundInfo(1, RoundReason.WORKER_FAILED, T0 + 35, failure=_hang(T0 + 5))
    assert blame.silence(info) == Silence(T0 + 5, T0 + 35)
    assert blame.silence(replace(info, failure=_hang(T0 + 5, FailureKind.USER_CODE))) is None
    assert blame.silence(replace(info, failure=_hang(None))) is None
    assert blame.silence(replace(info, failure=_hang(T0 + 36))) is None  # after the round moved
    assert blame.silence(replace(info, failure=None)) is None and blame.silence(None) is None


def test_every_member_launches_with_the_silence_of_the_hang_that_opened_its_round() -> None:
    read = job_read(2, joins=("n2", "n1"), members=("n2", "n1"), restarts=1)
    assert read.round is not None and read.result is not None
    hung = replace(read.round, reason=RoundReason.WORKER_FAILED, failure=_hang(read.round.opened_at - 30))
    read = replace(read, round=hung)
    assert read.round is not None and read.result is not None
    _, actions = decide(joining(2, ran=1, failure=failure()), read)
    start = StartWorkers(
        read.result.head(), member(read), 1, Silence(read.round.opened_at - 30, read.round.opened_at)
    )
    assert start in actions

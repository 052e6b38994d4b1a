"""elasticd.agent.conduct: the executor's own rules, pure (the lease gate, the state a node shows,
progress pacing, how long a wait sleeps, the writes on leaving, the events of writes that took)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.agent import actions as act
from elasticd.agent import conduct
from elasticd.agent.conduct import PROGRESS_PUBLISH_S, Dropped, Leased, ProgressSent
from elasticd.agent.record import AgentState
from elasticd.happenings.records import JobFailed, JobSucceeded, RootCauseAmended, RoundBumped, RoundComplete
from elasticd.jobs.decider import GroupOutcome
from elasticd.rendezvous.glance import Seen
from elasticd.rendezvous.model import Join as JoinRecord
from elasticd.rendezvous.model import RoundInfo
from elasticd.terms.state import EndReason, JobState, RoundReason
from tests.agent_steps import JOB, LEASE, NOW, failure, record, result

POLL_S = 5.0
LEASED = [
    act.Publish(),
    act.Join(2),
    act.Reassert(1, JoinRecord("n1", "10.0.0.1", 29500, 2)),
    act.SetWaiting(),
    act.NotePending("why"),
    act.NotePending(None),
]
UNLEASED = [
    act.ReadGlance(1),
    act.ReadJob(),
    act.Wait(),
    act.Exit(),
    act.StopWorkers(1.0),
    act.Withdraw(1),
    act.ClearWaiting(),
    act.Probe(1, ()),
    act.Finalize(JobState.FAILED, EndReason.WORKER_FAILED, "x"),
    act.MarkDone(1),
    act.MarkLeft(1),
    act.WatchPeers(1, ()),
    act.WatchJoins(None),
]


@pytest.mark.parametrize("action", LEASED, ids=lambda a: type(a).__name__)
def test_a_leased_write_goes_under_the_lease_or_is_dropped_with_a_reason(action: act.Action) -> None:
    assert conduct.gate(action, LEASE) == Leased(action, LEASE)  # type: ignore[arg-type]
    dropped = conduct.gate(action, None)
    assert isinstance(dropped, Dropped) and dropped.action == action and "no lease" in dropped.why


@pytest.mark.parametrize("action", UNLEASED, ids=lambda a: type(a).__name__)
def test_every_other_action_passes_as_it_is(action: act.Action) -> None:
    assert conduct.gate(action, LEASE) is action and conduct.gate(action, None) is action


@pytest.mark.parametrize(
    ("note", "joined", "writes"),
    [
        (None, -1, [act.ClearWaiting()]),
        ("waiting for n2", -1, [act.ClearWaiting(), act.NotePending(None)]),
        (None, 3, [act.ClearWaiting(), act.Withdraw(3)]),
        ("x", 0, [act.ClearWaiting(), act.NotePending(None), act.Withdraw(0)]),
    ],
)
def test_farewell(note: str | None, joined: int, writes: list[act.Action]) -> None:
    rec = record(AgentState.LEFT, 1, note=note, joined_round=joined)
    assert conduct.farewell(rec) == writes


@pytest.mark.parametrize(
    ("state", "has_workers", "pids", "exited", "shown"),
    [
        (AgentState.RUNNING, True, 2, None, "RUNNING"),  # they run: as the record says
        (AgentState.RUNNING, True, 0, GroupOutcome.SUCCEEDED, "DONE"),  # ended, not yet stepped
        (AgentState.RUNNING, True, 0, GroupOutcome.FAILED, "FAILED"),
        (AgentState.RUNNING, True, 0, GroupOutcome.RUNNING, "FAILED"),  # (a hang's kill, settling)
        (AgentState.STOPPING, True, 0, None, "STOPPING"),  # only RUNNING reads the exits
        (AgentState.DONE, True, 0, None, "DONE"),
        (AgentState.RUNNING, False, 0, None, "RUNNING"),  # no workers: nothing to read
    ],
)
def test_the_state_a_node_shows(
    state: AgentState, has_workers: bool, pids: int, exited: GroupOutcome | None, shown: str
) -> None:
    assert conduct.shows_exit(state, has_workers, pids) == (exited is not None)
    assert conduct.shown_state(state, exited) == shown


def test_progress_is_due_every_period_while_workers_run_under_a_lease() -> None:
    sent = ProgressSent(at=NOW)
    assert not conduct.progress_due(sent, True, LEASE, NOW + PROGRESS_PUBLISH_S - 0.001)
    assert conduct.progress_due(sent, True, LEASE, NOW + PROGRESS_PUBLISH_S)  # the edge: due
    assert not conduct.progress_due(sent, False, LEASE, NOW + 100)  # not running
    assert not conduct.progress_due(sent, True, None, NOW + 100)  # no lease
    assert conduct.progress_due(ProgressSent(), True, LEASE, NOW)  # never checked: due at once


def test_only_changed_progress_is_published() -> None:
    step = {"rank": 0, "step": 3}
    assert conduct.progress_changed(ProgressSent(), [step])
    assert not conduct.progress_changed(ProgressSent(progress=(step,)), [step])
    assert not conduct.progress_changed(ProgressSent(), [])


@given(
    st.floats(0, 2 * NOW),
    st.none() | st.floats(0, 2 * NOW),
    st.floats(0, 2 * NOW),
    st.booleans(),
)
def test_a_wait_sleeps_at_most_the_poll_and_until_progress_is_due(
    now: float, until: float | None, at: float, running: bool
) -> None:
    timeout = conduct.sleep_s(now, until, ProgressSent(at=at), running, POLL_S)
    assert 0.0 <= timeout <= POLL_S
    if until is not None:
        assert timeout <= max(0.0, until - now)
    if running:
        assert timeout <= max(0.0, at + PROGRESS_PUBLISH_S - now) + 0.01
    else:
        assert timeout == (POLL_S if until is None else max(0.0, min(POLL_S, until - now)))


# whole seconds and tenths: the period's edge is exact in floating point
@given(
    st.integers(0, 10_000).map(float), st.integers(0, 150).map(lambda t: t / 10), st.booleans(), st.booleans()
)
def test_progress_is_checked_at_most_once_a_period(
    at: float, later: float, running: bool, leased: bool
) -> None:
    due = conduct.progress_due(ProgressSent(at=at), running, LEASE if leased else None, at + later)
    assert due == (running and leased and later >= PROGRESS_PUBLISH_S)


def test_the_event_a_write_records_once_it_took() -> None:
    res = result(2, ("n1", "n2"), closed_at=NOW)
    opened = RoundInfo(2, RoundReason.WORKER_FAILED, NOW - 1.5, (), "")
    assert conduct.took(act.CloseRound(res, "full", opened), JOB, "n1", 1) == RoundComplete(
        JOB, 2, res.world_size, ("n1", "n2"), "full", RoundReason.WORKER_FAILED, 1.5
    )
    closed = conduct.took(act.CloseRound(res, "full"), JOB, "n1", 1)
    assert isinstance(closed, RoundComplete) and (closed.reason, closed.rendezvous_s) == (None, None)
    info = RoundInfo(3, RoundReason.SCALE_UP, NOW, (), "n4 waiting")
    bumped = conduct.took(act.Bump(Seen(1, 1, 2), info, True), JOB, "n1", 2)
    assert bumped == RoundBumped(JOB, 3, RoundReason.SCALE_UP, True, 3, "n4 waiting")
    assert conduct.took(act.Amend(7, info), JOB, "n1", 2) == RootCauseAmended(JOB, "n1", "RoundInfo")


def test_the_end_of_a_job_names_its_root_cause_when_one_decodes() -> None:
    why = failure()
    end = act.Finalize(JobState.FAILED, EndReason.WORKER_FAILED, "out of restarts", why.to_json())
    assert conduct.took(end, JOB, "n1", 4) == JobFailed(
        JOB, EndReason.WORKER_FAILED, "out of restarts", 4, why.kind, why.summary()
    )
    bad = act.Finalize(JobState.FAILED, EndReason.WORKER_FAILED, "x", {"rank": "not a number"})
    assert conduct.took(bad, JOB, "n1", 4) == JobFailed(JOB, EndReason.WORKER_FAILED, "x", 4)
    ok = act.Finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, "")
    assert conduct.took(ok, JOB, "n1", 4) == JobSucceeded(JOB, EndReason.SUCCEEDED, "", 4)

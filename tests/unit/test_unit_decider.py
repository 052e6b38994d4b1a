"""elasticd.jobs.decider: what a local group's worker exits mean, the settle window, hang versus
exit, and the full-disk ending."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.jobs.decider import (
    SETTLE_S,
    Exited,
    Group,
    GroupOutcome,
    Judgement,
    Verdict,
    group_outcome,
    judge,
    report,
    settle_left,
)
from elasticd.terms.state import EndReason, SetupFailure, WorkerFailure


@pytest.mark.parametrize(
    ("codes", "running", "outcome"),
    [
        ([0], 3, GroupOutcome.RUNNING),
        ([0, 0], 1, GroupOutcome.RUNNING),
        ([0], 0, GroupOutcome.SUCCEEDED),
        ([0, 0, 0, 0], 0, GroupOutcome.SUCCEEDED),
        ([1], 3, GroupOutcome.FAILED),
        ([-9], 2, GroupOutcome.FAILED),  # killed by a signal is a failure
        ([137], 0, GroupOutcome.FAILED),
        ([0, 1], 0, GroupOutcome.FAILED),  # seen together: the failure wins
        ([1, 0], 0, GroupOutcome.FAILED),
        ([0, -11], 3, GroupOutcome.FAILED),
    ],
)
def test_group_outcome(codes: list[int], running: int, outcome: GroupOutcome) -> None:
    assert group_outcome(codes, running) is outcome


# -- the settle window, hang versus exit, the full disk (``judge``, ``settle_left``, ``report``) ---
T = 1000.0


@pytest.mark.parametrize(
    ("exited", "running", "now", "left"),
    [
        ([Exited(1, T)], 2, T, SETTLE_S),  # just failed, siblings run: the whole window
        ([Exited(1, T)], 2, T + SETTLE_S / 2, SETTLE_S / 2),
        ([Exited(1, T)], 2, T + SETTLE_S, 0.0),  # the window's end: report now
        ([Exited(1, T)], 2, T + 10 * SETTLE_S, 0.0),
        ([Exited(1, T)], 0, T, 0.0),  # no sibling runs: nothing to wait for
        ([Exited(0, T)], 2, T, 0.0),  # a success waits for nobody
        ([Exited(1, None)], 2, T, 0.0),  # exit time not known yet: not held back
        ([Exited(1, T + 0.5), Exited(1, T)], 1, T + 0.5, SETTLE_S - 0.5),  # from the first failure
        ([Exited(0, T - 5), Exited(1, T)], 1, T, SETTLE_S),  # a success's time does not count
        ([Exited(-9, T)], 2, T, 0.0),  # SIGKILL: no sibling caused it, none is waited for
        ([Exited(-9, T + 0.5), Exited(1, T)], 1, T + 0.5, SETTLE_S - 0.5),  # the first failure's kind
        ([Exited(-9, T), Exited(1, T + 0.5)], 1, T + 0.5, 0.0),
        ([Exited(-6, T)], 2, T, SETTLE_S),  # SIGABRT: often a watchdog's, for a sibling's failure
    ],
)
def test_settle_left_edges(exited: list[Exited], running: int, now: float, left: float) -> None:
    assert settle_left(exited, running, now) == pytest.approx(left)


def test_judge_a_failure_settles_then_is_reported_with_the_disk_checked() -> None:
    exited = [Exited(1, T)]
    assert judge(exited, 1, False, T, True) == Judgement(Verdict.SETTLING, describe_exits=True)
    assert judge(exited, 1, False, T + SETTLE_S, True) == Judgement(
        Verdict.FAILED, describe_exits=True, check_disk=True
    )
    assert judge(exited, 0, False, T, True).verdict is Verdict.FAILED  # nobody left to wait for
    assert judge(exited, 1, False, T + SETTLE_S, False) == Judgement(Verdict.FAILED)  # reads nothing


def test_judge_an_exit_speaks_over_a_hang_seen_in_the_same_observation() -> None:
    assert judge([Exited(1, T)], 0, True, T, True).verdict is Verdict.FAILED
    assert judge([Exited(1, T)], 2, True, T, True).verdict is Verdict.SETTLING
    assert judge([Exited(0, T)], 2, True, T, True) == Judgement(Verdict.HUNG, describe_hang=True)
    assert judge([], 2, True, T, False) == Judgement(Verdict.HUNG)
    # ... and so does a success: every worker exited 0, so nothing named hung still runs
    assert judge([Exited(0, T)], 0, True, T, True) == Judgement(Verdict.SUCCEEDED)


FAILURE = WorkerFailure.from_exit(
    node="n1", attempt=0, rank=0, local_rank=0, returncode=1, message="", tail="", failed_at=T
)
FULL = SetupFailure(EndReason.LOG_DISK_FULL, "the log disk is full")


def test_report_carries_a_full_disk_only_with_a_reported_failure() -> None:
    assert report(Verdict.FAILED, FAILURE, FULL) == Group(GroupOutcome.FAILED, FAILURE, FULL)
    assert report(Verdict.FAILED, FAILURE, None) == Group(GroupOutcome.FAILED, FAILURE)
    assert report(Verdict.FAILED, None, FULL) == Group(GroupOutcome.FAILED, None, FULL)  # not described
    assert report(Verdict.SETTLING, FAILURE, FULL) == Group(GroupOutcome.RUNNING, FAILURE)
    assert report(Verdict.HUNG, FAILURE, FULL) == Group(GroupOutcome.FAILED, FAILURE)
    assert report(Verdict.RUNNING, FAILURE, FULL) == Group(GroupOutcome.RUNNING)
    assert report(Verdict.SUCCEEDED, None, FULL) == Group(GroupOutcome.SUCCEEDED)


exits = st.lists(
    st.builds(Exited, st.sampled_from([0, 0, 1, -9, 137]), st.none() | st.floats(T - 5, T + 5)),
    max_size=6,
)


@given(exits, st.integers(0, 4), st.booleans(), st.floats(T - 5, T + 10), st.booleans())
def test_judge_properties(exited: list[Exited], running: int, hung: bool, now: float, describe: bool) -> None:
    got = judge(exited, running, hung, now, describe)
    failed = any(e.returncode != 0 for e in exited)
    # a failed exit always wins over a hang, as does a success; a hang fails the group otherwise
    assert (got.verdict in (Verdict.SETTLING, Verdict.FAILED)) == failed
    if hung and not failed:
        assert got.verdict is (Verdict.SUCCEEDED if running == 0 else Verdict.HUNG)
    # settling exactly while siblings run inside the window
    assert (got.verdict is Verdict.SETTLING) == (failed and settle_left(exited, running, now) > 0)
    if got.verdict is Verdict.SETTLING:
        assert running > 0
    # nothing is read unless the step asked for a description; the disk only for a reported failure
    assert describe or not (got.describe_exits or got.describe_hang or got.check_disk)
    assert not got.check_disk or got.verdict is Verdict.FAILED
    # what the step sees: the outcome as ``group_outcome`` has it, but running while settling
    base = group_outcome([e.returncode for e in exited], running)
    if got.verdict is Verdict.SETTLING:
        assert got.verdict.outcome is GroupOutcome.RUNNING
    elif not hung or failed:
        assert got.verdict.outcome is base
    assert report(got.verdict, FAILURE, FULL).disk_full == (FULL if got.verdict is Verdict.FAILED else None)


@given(exits, st.integers(1, 4), st.floats(T - 5, T + 10), st.floats(0, 5))
def test_settle_left_only_shrinks_as_time_passes(
    exited: list[Exited], running: int, now: float, later: float
) -> None:
    before, after = settle_left(exited, running, now), settle_left(exited, running, now + later)
    assert 0.0 <= after <= before
    if all(e.at is None or e.at <= now for e in exited):  # an exit stamped ahead of ``now`` waits longer
        assert before <= SETTLE_S

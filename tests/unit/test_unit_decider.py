"""elasticd.jobs.decider.on_exits: what the supervisor does when workers of an attempt exit."""

from __future__ import annotations

import pytest

from elasticd.jobs.decider import Action, on_exits


@pytest.mark.parametrize(
    ("returncodes", "still_running", "restarts_used", "max_restarts", "expected"),
    [
        # success: wait for the rest, succeed when the last one exits 0
        ([0], 3, 0, 3, Action.WAIT),
        ([0, 0], 1, 0, 3, Action.WAIT),
        ([0], 0, 0, 3, Action.SUCCEED),
        ([0, 0, 0, 0], 0, 0, 0, Action.SUCCEED),
        ([0], 0, 3, 3, Action.SUCCEED),  # an exhausted budget does not matter when all succeed
        # failure restarts while budget is left, even with siblings still running
        ([1], 3, 0, 3, Action.RESTART),
        ([1], 0, 2, 3, Action.RESTART),
        ([-9], 2, 0, 1, Action.RESTART),  # killed by a signal is a failure
        ([-15], 0, 0, 1, Action.RESTART),
        # budget exhausted
        ([1], 3, 3, 3, Action.FAIL),
        ([1], 0, 0, 0, Action.FAIL),
        ([137], 1, 5, 3, Action.FAIL),  # more used than allowed is still exhausted
        # exits seen together are judged together: a failure is never hidden by a success
        ([0, 1], 0, 0, 3, Action.RESTART),
        ([1, 0], 0, 0, 3, Action.RESTART),
        ([0, 1], 2, 0, 3, Action.RESTART),
        ([0, 0, 2], 0, 3, 3, Action.FAIL),
        ([0, -11], 0, 0, 0, Action.FAIL),
    ],
)
def test_on_exits(
    returncodes: list[int], still_running: int, restarts_used: int, max_restarts: int, expected: Action
) -> None:
    assert on_exits(returncodes, still_running, restarts_used, max_restarts).action is expected


def test_restart_reason_counts_the_next_restart() -> None:
    decision = on_exits([1], 0, restarts_used=1, max_restarts=3)
    assert decision.action is Action.RESTART
    assert decision.reason == "restart 2 of 3"


def test_fail_reason_reports_the_budget() -> None:
    decision = on_exits([1], 0, restarts_used=3, max_restarts=3)
    assert decision.action is Action.FAIL
    assert "3 of 3" in decision.reason


def test_decider_never_returns_stop() -> None:
    seen = {
        on_exits(rcs, running, used, 2).action
        for rcs in ([0], [1], [0, 1], [-9])
        for running in (0, 1)
        for used in (0, 2)
    }
    assert Action.STOP not in seen
    assert seen == {Action.WAIT, Action.SUCCEED, Action.RESTART, Action.FAIL}

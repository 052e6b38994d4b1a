"""elasticd.jobs.decider.group_outcome: what a local group's worker exits mean."""

from __future__ import annotations

import pytest

from elasticd.jobs.decider import GroupOutcome, group_outcome


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

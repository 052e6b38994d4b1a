"""Pure decision about a local worker group: what its exits mean. No I/O, no clock.

Whether a failure restarts the job or ends it is a job-wide question (the restart budget is
counted per job, not per node); that rule lives in ``elasticd.rendezvous.decider.plan_bump``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from elasticd.terms.state import SetupFailure, WorkerFailure


class GroupOutcome(StrEnum):
    RUNNING = "running"  # nothing decided yet: others still run
    SUCCEEDED = "succeeded"  # every local worker exited 0
    FAILED = "failed"  # a worker exited non-zero or by a signal: the group is done for


@dataclass(frozen=True)
class Group:
    """This node's worker group as observed before a step (the executor owns the processes)."""

    outcome: GroupOutcome
    failure: WorkerFailure | None = None  # described once the group failed (or while it settles)
    disk_full: SetupFailure | None = None  # the log disk is full: the likely cause of a failure


def group_outcome(returncodes: Sequence[int], still_running: int) -> GroupOutcome:
    """Workers exited with ``returncodes``; ``still_running`` others remain.

    As in torchelastic, one failed worker fails the whole local group, and a worker that exits 0
    waits for the rest. Exits seen together are judged together, so a failure is never hidden
    behind a sibling's success.
    """
    if any(rc != 0 for rc in returncodes):
        return GroupOutcome.FAILED
    return GroupOutcome.SUCCEEDED if still_running == 0 else GroupOutcome.RUNNING

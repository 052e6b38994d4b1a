"""Pure decisions for a job's attempts: what to do when workers exit. No I/O, no clock.

The supervisor feeds events in and carries out the returned action, so every rule here is
unit-tested without processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    WAIT = "wait"  # keep supervising: others still run
    SUCCEED = "succeed"  # every worker exited 0
    RESTART = "restart"  # stop the group and start the next attempt
    FAIL = "fail"  # stop the group; the job has failed
    STOP = "stop"  # asked from outside (kill, daemon shutdown); never returned by a decider


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str = ""


def on_exits(
    returncodes: Sequence[int], still_running: int, restarts_used: int, max_restarts: int
) -> Decision:
    """Workers of the current attempt exited with ``returncodes``; ``still_running`` others remain.

    As in torchelastic, one failed worker fails the whole local group, and a worker that exits 0
    waits for the rest. Exits seen together are judged together, so a failure is never hidden
    behind a sibling's success.
    """
    if all(rc == 0 for rc in returncodes):
        return Decision(Action.SUCCEED) if still_running == 0 else Decision(Action.WAIT)
    if restarts_used < max_restarts:
        return Decision(Action.RESTART, f"restart {restarts_used + 1} of {max_restarts}")
    return Decision(Action.FAIL, f"no restarts left ({restarts_used} of {max_restarts} used)")

"""Job states as replies carry them: which are terminal, what a waiting job waits for, how a
member's part ended, and which reply fields hold times."""

from __future__ import annotations

from enum import StrEnum

from elasticd.terms.state import JobState

# ``JobState`` (its transitions are in its docstring) and ``EndReason`` (a final job's ``code``)
# live in ``elasticd.terms.state``; which states are terminal is decided there, once.
TERMINAL_STATES: frozenset[JobState] = frozenset(s for s in JobState if s.terminal)


def is_terminal(state: str | None) -> bool:
    """Whether a reply's ``state`` is one a job never leaves."""
    return state is not None and state in TERMINAL_STATES


class WaitsFor(StrEnum):
    """What a job that is not running waits for (``JobView.waits_for``; None when it waits for
    nothing a user can act on: it is running, ended, or its round is about to close)."""

    CAPACITY = "capacity"  # an allowed node has too few free slots (``short_of_capacity`` names them)
    NODES = "nodes"  # fewer than its minimum of nodes have joined the current round


class MemberEndState(StrEnum):
    """How a member's part in the job's last round ended: ``MemberView.state`` once the job has
    ended (while it runs, that is the member's agent state, or GONE when it publishes none)."""

    SUCCEEDED = "SUCCEEDED"  # its workers all exited 0 (its ``done`` marker)
    FAILED = "FAILED"  # its workers failed: the job's root cause is there, or it reported a failure
    KILLED = "KILLED"  # the job was killed: its workers were stopped
    STOPPED = "STOPPED"  # the job ended otherwise (another member failed, ...): its workers were stopped
    LOST = "LOST"  # no status from it: its daemon was gone at the end (or has restarted since)


# Every field of a reply that holds a time (seconds since the epoch), in any reply type.
TIME_FIELDS = frozenset(
    {
        "submitted_at",
        "started_at",
        "ended_at",
        "updated_at",
        "failed_at",
        "exited_at",
        "opened_at",
        "closed_at",
        "attempt_started_at",
        "last_step_at",
        "evidence_at",
        "happened_at",
        "read_at",
    }
)

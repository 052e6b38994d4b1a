"""The root cause across nodes and rounds: exception names, amending a record that names a later
failure of another node, and stopping a job that fails the same way with no progress."""

from __future__ import annotations

from dataclasses import replace

import pytest

from elasticd.agent import blame
from elasticd.agent.actions import Amend, Bump, Finalize, Publish
from elasticd.agent.record import AgentState
from elasticd.jobs.decider import Group, GroupOutcome
from elasticd.jobs.rootcause import (
    PROGRESS_WITHOUT_STEPS_S,
    earlier,
    exception_of,
    same_way,
    with_also_failed,
)
from elasticd.rendezvous.model import FinalRecord, RoundInfo
from elasticd.terms.state import EndReason, FailureKind, JobState, RoundReason, WorkerFailure
from tests.agent_steps import NOW, acts, decide, failed, job_read, local, record, spec

TRACEBACK = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/w/train.py", line 9, in <module>
[rank1]:     main()
[rank1]: ZeroDivisionError: division by zero
"""
CHAINED = """\
Traceback (most recent call last):
  File "a.py", line 2, in f
KeyError: 'x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "a.py", line 4, in <module>
torch.distributed.DistBackendError: Connection closed by peer
"""


@pytest.mark.parametrize(
    ("message", "tail", "expected"),
    [
        ("ValueError: bad batch", "", "ValueError"),
        ("", TRACEBACK, "ZeroDivisionError"),
        ("", CHAINED, "torch.distributed.DistBackendError"),
        (
            "",
            "Traceback (most recent call last):\n  File 'x', line 1\nKeyboardInterrupt\n",
            "KeyboardInterrupt",
        ),
        ("exit code 1", "loss 0.3\nloss 0.2\n", ""),
        ("", "no traceback: just output\n", ""),
        ("", "Traceback (most recent call last):\n  File 'x', line 1\n", ""),
    ],
)
def test_exception_of_names_the_type_from_the_error_file_or_the_last_traceback(
    message: str, tail: str, expected: str
) -> None:
    assert exception_of(message, tail) == expected


def fail(node: str, at: float, rank: int = 0, attempt: int = 1, **fields: object) -> WorkerFailure:
    base = WorkerFailure.from_exit(
        node=node, attempt=attempt, rank=rank, local_rank=0, returncode=1, message="", tail="", failed_at=at
    )
    return replace(base, exited_at=at, **fields)  # type: ignore[arg-type]


def test_earlier_needs_the_same_round_another_node_and_a_strictly_earlier_failure() -> None:
    first, later = fail("b", 100.2, rank=1), fail("a", 100.4)
    assert earlier(first, later)
    assert not earlier(later, first)
    assert not earlier(first, replace(later, node="b"))  # our own record
    assert not earlier(first, replace(later, attempt=2))  # another round's
    assert not earlier(first, replace(first, node="a"))  # a tie keeps the record


def test_error_file_seconds_do_not_beat_a_precise_exit_in_the_same_second() -> None:
    """torch writes whole seconds: rank 0's "Connection closed" error at 100 (written at 100.9)
    did not come before rank 1's crash seen at 100.3."""
    crash = fail("b", 100.3, rank=1)
    echo = replace(fail("a", 100.0), exited_at=100.9)
    assert earlier(crash, echo)
    assert not earlier(echo, crash)


def test_the_displaced_failure_and_its_list_are_also_failed_with_their_node() -> None:
    other = replace(fail("a", 101.0), also_failed=(replace(fail("a", 102.0, rank=3), node="").also_failed))
    root = with_also_failed(fail("b", 100.0, rank=1), other)
    assert [(f.rank, f.node) for f in root.also_failed] == [(0, "a")]
    assert root.summary().endswith("also failed: rank 0 on a")


def test_amendment_rewrites_the_round_naming_the_first_failure() -> None:
    theirs, mine = fail("n2", 100.5), fail("n1", 100.1, rank=1)
    read = job_read(2, reason=RoundReason.WORKER_FAILED)
    assert read.round is not None
    read = replace(read, round=replace(read.round, failure=theirs.to_json(), detail=theirs.summary()))
    amend = blame.amendment(read, mine)
    assert isinstance(amend, Amend) and isinstance(amend.record, RoundInfo)
    assert amend.seen_mod == read.round_mod
    assert amend.record.failure is not None and amend.record.failure["node"] == "n1"
    assert amend.record.detail == with_also_failed(mine, theirs).summary()
    assert blame.amendment(read, fail("n1", 101.0)) is None  # ours came later
    assert blame.amendment(read, None) is None


def test_amendment_rewrites_the_final_record_keeping_the_rest_of_its_reason() -> None:
    theirs, mine = fail("n2", 100.5), fail("n1", 100.1, rank=1)
    read = job_read(1, final=JobState.FAILED)
    read = replace(read, final_mod=321)
    read = replace(
        read,
        final=FinalRecord(
            JobState.FAILED,
            f"{theirs.summary()}; no restarts left",
            EndReason.WORKER_FAILED,
            theirs.to_json(),
            NOW,
        ),
    )
    amend = blame.amendment(read, mine)
    assert amend is not None and isinstance(amend.record, FinalRecord)
    assert amend.seen_mod == 321
    assert amend.record.reason == f"{with_also_failed(mine, theirs).summary()}; no restarts left"


def test_a_round_opened_by_something_else_is_not_amended() -> None:
    read = job_read(2, reason=RoundReason.MEMBER_LOST)
    assert blame.amendment(read, fail("n1", 1.0)) is None


def test_same_way_means_same_kind_exception_and_exit_without_progress() -> None:
    a = fail("n1", 1.0, exception="KeyError", ran_s=5.0)
    assert same_way(a, replace(a, rank=3, message="other text"))
    assert not same_way(a, replace(a, exception="ValueError"))
    assert not same_way(a, replace(a, kind=FailureKind.HANG))
    assert not same_way(a, replace(a, ran_s=PROGRESS_WITHOUT_STEPS_S + 1))  # ran long: progress
    stepped = replace(a, step=10)
    assert same_way(stepped, replace(a, step=10))
    assert not same_way(stepped, replace(a, step=11))


def _round_opened_by(why: WorkerFailure, repeats: int) -> RoundInfo:
    return RoundInfo(2, RoundReason.WORKER_FAILED, NOW, (), why.summary(), why.to_json(), None, repeats)


def test_a_failure_repeating_max_same_failures_times_ends_the_job_with_restarts_left() -> None:
    why = fail("n1", NOW, exception="KeyError", ran_s=2.0)
    job = spec(max_same_failures=3, max_restarts=10)
    read = job_read(2, job=job, joins=("n1", "n2"), members=("n1", "n2"), counted=True, restarts=2)
    read = replace(read, round=_round_opened_by(why, 2))
    _, actions = decide(record(AgentState.RUNNING, 2, job=job), read, local(failed(why)))
    end = acts(actions)[-1]
    assert isinstance(end, Finalize) and end.code is EndReason.REPEATED_FAILURE
    assert "failed the same way 3 times in a row with no progress" in end.reason
    assert "8 of 10 restarts left" in end.reason


def test_a_different_failure_or_progress_starts_the_count_again() -> None:
    why = fail("n1", NOW, exception="KeyError", ran_s=2.0)
    job = spec(max_same_failures=3, max_restarts=10)
    for previous in (replace(why, exception="OSError"), replace(why, ran_s=None, step=1)):
        read = job_read(2, job=job, joins=("n1", "n2"), members=("n1", "n2"), counted=True, restarts=2)
        read = replace(read, round=_round_opened_by(previous, 2))
        now = replace(why, step=5) if previous.step is not None else why
        _, actions = decide(record(AgentState.RUNNING, 2, job=job), read, local(failed(now)))
        bump = acts(actions)[-1]
        assert isinstance(bump, Bump) and bump.info.repeats == 1


def test_max_same_failures_zero_never_stops_early() -> None:
    why = fail("n1", NOW, exception="KeyError", ran_s=2.0)
    job = spec(max_same_failures=0, max_restarts=10)
    read = job_read(2, job=job, joins=("n1", "n2"), members=("n1", "n2"), counted=True, restarts=2)
    read = replace(read, round=_round_opened_by(why, 7))
    _, actions = decide(record(AgentState.RUNNING, 2, job=job), read, local(failed(why)))
    assert [type(a) for a in acts(actions)] == [Publish, Bump]


def test_a_node_whose_failure_came_first_amends_the_moved_round_before_rejoining() -> None:
    """n2 bumped first with its rank's echo of our crash; our group is still settling."""
    mine, theirs = fail("n1", NOW - 2.0, rank=1), fail("n2", NOW - 1.5)
    read = job_read(2, joins=("n2",), reason=RoundReason.WORKER_FAILED, restarts=1)
    assert read.round is not None
    read = replace(read, round=replace(read.round, failure=theirs.to_json(), detail=theirs.summary()))
    settling = Group(GroupOutcome.RUNNING, mine)
    _, actions = decide(record(AgentState.RUNNING, 1), read, local(settling))
    amend = acts(actions)[0]
    assert isinstance(amend, Amend) and isinstance(amend.record, RoundInfo)
    assert amend.record.failure is not None and amend.record.failure["node"] == "n1"

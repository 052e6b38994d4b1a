"""elasticd.terms.state: the JobState machine, exit descriptions and WorkerFailure."""

from __future__ import annotations

import itertools

import pytest

from elasticd.terms.state import (
    FailureKind,
    IllegalTransition,
    JobState,
    WorkerFailure,
    can_transition,
    check_transition,
    describe_exit,
    exit_text,
)

S = JobState
ALLOWED: set[tuple[JobState, JobState]] = {
    (S.PENDING, S.RUNNING),
    (S.PENDING, S.KILLED),
    (S.PENDING, S.FAILED),  # the daemon shuts down before a queued job starts
    (S.RUNNING, S.RESTARTING),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.KILLED),
    (S.RESTARTING, S.RUNNING),
    (S.RESTARTING, S.FAILED),
    (S.RESTARTING, S.KILLED),
}
ALL_PAIRS = list(itertools.product(JobState, JobState))


@pytest.mark.parametrize(("old", "new"), ALL_PAIRS, ids=[f"{o}->{n}" for o, n in ALL_PAIRS])
def test_transition_table(old: JobState, new: JobState) -> None:
    assert can_transition(old, new) is ((old, new) in ALLOWED)


@pytest.mark.parametrize(("old", "new"), ALL_PAIRS, ids=[f"{o}->{n}" for o, n in ALL_PAIRS])
def test_check_transition_refuses_what_the_table_does_not_have(old: JobState, new: JobState) -> None:
    if (old, new) in ALLOWED:
        check_transition("j1", old, new)
    else:
        with pytest.raises(IllegalTransition, match=f"^job j1 is {old.value}: it cannot become {new.value}$"):
            check_transition("j1", old, new)


@pytest.mark.parametrize("state", list(JobState))
def test_no_self_transitions(state: JobState) -> None:
    assert not can_transition(state, state)


@pytest.mark.parametrize("state", list(JobState))
def test_terminal_states_have_no_way_out(state: JobState) -> None:
    expected_terminal = state in (S.SUCCEEDED, S.FAILED, S.KILLED)
    assert state.terminal is expected_terminal
    if state.terminal:
        assert not any(can_transition(state, new) for new in JobState)
    else:
        assert any(can_transition(state, new) for new in JobState)


def test_every_non_terminal_state_can_be_killed_and_failed() -> None:
    for state in JobState:
        if not state.terminal:
            assert can_transition(state, S.KILLED)
            assert can_transition(state, S.FAILED)


def test_state_values_are_their_names() -> None:
    assert [s.value for s in JobState] == [s.name for s in JobState]


@pytest.mark.parametrize(
    ("returncode", "text"),
    [
        (0, "exit code 0"),
        (1, "exit code 1"),
        (137, "exit code 137"),
        (-9, "killed by SIGKILL"),
        (-15, "killed by SIGTERM"),
        (-11, "killed by SIGSEGV"),
        (-6, "killed by SIGABRT"),
        (-200, "killed by signal 200"),  # not a known signal number
    ],
)
def test_describe_exit(returncode: int, text: str) -> None:
    assert describe_exit(returncode) == text


def _failure(returncode: int, message: str = "", tail: str = "last words\n") -> WorkerFailure:
    return WorkerFailure.from_exit(
        node="n1", attempt=2, rank=5, local_rank=1, returncode=returncode, message=message, tail=tail
    )


@pytest.mark.parametrize(
    ("returncode", "exit_code", "sig", "message"),
    [
        (1, 1, None, "exit code 1"),
        (0, 0, None, "exit code 0"),
        (255, 255, None, "exit code 255"),
        (-9, None, "SIGKILL", "killed by SIGKILL"),
        (-15, None, "SIGTERM", "killed by SIGTERM"),
        (-200, None, "200", "killed by signal 200"),
    ],
)
def test_worker_failure_from_exit(
    returncode: int, exit_code: int | None, sig: str | None, message: str
) -> None:
    f = _failure(returncode)
    assert (f.exit_code, f.signal, f.message) == (exit_code, sig, message)
    assert (f.node, f.attempt, f.rank, f.local_rank, f.output_tail) == ("n1", 2, 5, 1, "last words\n")


def test_worker_failure_keeps_the_error_file_message() -> None:
    f = _failure(1, message="ValueError: boom")
    assert f.message == "ValueError: boom"
    assert f.exit_code == 1


@pytest.mark.parametrize(
    ("returncode", "message", "summary"),
    [
        (3, "", "rank 5 (local 1 on n1) failed with exit code 3"),
        (3, "exit code 3", "rank 5 (local 1 on n1) failed with exit code 3"),
        (3, "RuntimeError: x", "rank 5 (local 1 on n1) failed with exit code 3: RuntimeError: x"),
        (-9, "", "rank 5 (local 1 on n1) failed with signal SIGKILL"),
        (-200, "", "rank 5 (local 1 on n1) failed with signal 200"),
    ],
)
def test_summary(returncode: int, message: str, summary: str) -> None:
    assert _failure(returncode, message).summary() == summary


def test_to_json_has_every_field() -> None:
    assert _failure(-9).to_json() == {
        "node": "n1",
        "attempt": 2,
        "rank": 5,
        "local_rank": 1,
        "exit_code": None,
        "signal": "SIGKILL",
        "message": "killed by SIGKILL",
        "output_tail": "last words\n",
        "oom": False,
        "failed_at": None,
        "also_failed": [],
        "also_failed_more": 0,
        "kind": "signal",
        "frame": "",
        "exception": "",
        "exited_at": None,
        "step": None,
        "ran_s": None,
    }


def test_a_hang_says_so_and_where() -> None:
    f = WorkerFailure(
        node="n1", attempt=0, rank=3, local_rank=1, exit_code=None, signal=None,
        message="rank 3 hung: no progress for 30 s in train.py:42 in step", output_tail="",
        kind=FailureKind.HANG, frame="train.py:42 in step",
    )  # fmt: skip
    assert f.summary() == "rank 3 (local 1 on n1) hung: no progress for 30 s in train.py:42 in step"
    assert exit_text(None, None, f.message) == f.message

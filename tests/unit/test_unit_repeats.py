"""What counts as a repeat for ``--max-same-failures``: a failure from outside the job (a signal
no rank brings on itself, a lost node) never does, whatever came before; a rank's own failures do
when they make no progress."""

from __future__ import annotations

import signal
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from elasticd.agent import blame
from elasticd.agent.actions import Amend, Bump, Finalize
from elasticd.agent.record import AgentState
from elasticd.jobs.rootcause import OWN_SIGNALS, PROGRESS_WITHOUT_STEPS_S, from_outside, same_way
from elasticd.rendezvous.model import RoundInfo
from elasticd.terms.state import EndReason, FailureKind, RoundReason, WorkerFailure
from tests.agent_steps import NOW, acts, decide, failed, job_read, local, record, spec

OUTSIDE = sorted(s.name for s in signal.Signals if s.name not in OWN_SIGNALS)
OWN = sorted(s.name for s in signal.Signals if s.name in OWN_SIGNALS)


def exited(returncode: int, ran_s: float = 4.0, node: str = "b", **fields: object) -> WorkerFailure:
    base = WorkerFailure.from_exit(
        node=node, attempt=1, rank=1, local_rank=0, returncode=returncode, message="", tail="", ran_s=ran_s
    )
    return replace(base, failed_at=NOW, exited_at=NOW, **fields)  # type: ignore[arg-type]


def killed_by(name: str, ran_s: float = 4.0, step: int | None = None) -> WorkerFailure:
    return exited(-signal.Signals[name].value, ran_s=ran_s, step=step)


def opened_by(why: WorkerFailure, repeats: int) -> RoundInfo:
    return RoundInfo(2, RoundReason.WORKER_FAILED, NOW, (), why.summary(), why.to_json(), None, repeats)


def next_round(previous: RoundInfo, now: WorkerFailure) -> Bump | Finalize:
    """What a 2-node job with restarts to spare does when ``now`` fails the round ``previous`` opened."""
    job = spec(max_same_failures=3, max_restarts=10)
    read = job_read(2, job=job, joins=("n1", "n2"), members=("n1", "n2"), counted=True, restarts=2)
    read = replace(read, round=previous)
    _, actions = decide(record(AgentState.RUNNING, 2, job=job), read, local(failed(now)))
    end = acts(actions)[-1]
    assert isinstance(end, Bump | Finalize), actions
    return end


def test_a_worker_killed_from_outside_every_few_seconds_does_not_stop_the_job() -> None:
    """A plain torchrun script (no steps) whose rank is SIGKILLed from outside, 4 s into each
    attempt, three times: torchrun restarts it, and so does elasticd, even after a record that an
    older daemon counted as a second repeat."""
    kill = killed_by("SIGKILL", ran_s=4.0)
    end = next_round(opened_by(kill, 2), kill)
    assert isinstance(end, Bump), end
    assert end.info.repeats == 1


def test_a_rank_that_aborts_the_same_way_with_no_progress_still_stops_the_job() -> None:
    for name in ("SIGSEGV", "SIGABRT"):
        crash = killed_by(name, ran_s=4.0)
        end = next_round(opened_by(crash, 2), crash)
        assert isinstance(end, Finalize) and end.code is EndReason.REPEATED_FAILURE, (name, end)


def test_an_oom_kill_counts_though_it_is_a_sigkill() -> None:
    oom = exited(-signal.SIGKILL.value, oom=True, kind=FailureKind.OOM)
    assert not from_outside(oom)
    assert same_way(oom, oom)


@given(
    name=st.sampled_from(OUTSIDE),
    before=st.sampled_from([*OUTSIDE, *OWN]) | st.integers(-128, 255),
    ran_s=st.floats(0.0, 2 * PROGRESS_WITHOUT_STEPS_S),
    step=st.none() | st.integers(0, 10),
    chain=st.integers(0, 50),
)
def test_a_signal_from_outside_never_repeats_anything(
    name: str, before: str | int, ran_s: float, step: int | None, chain: int
) -> None:
    now = killed_by(name, ran_s=ran_s, step=step)
    previous = killed_by(before, ran_s=ran_s, step=step) if isinstance(before, str) else exited(before)
    assert from_outside(now)
    assert not same_way(previous, now) and not same_way(now, previous)
    assert blame.repeats(opened_by(previous, chain), now) == 1
    assert blame.repeats(opened_by(now, chain), previous) == 1


@given(
    name=st.sampled_from(OWN) | st.integers(1, 255),
    ran_s=st.floats(0.0, PROGRESS_WITHOUT_STEPS_S, exclude_max=True),
    chain=st.integers(1, 50),
)
def test_a_ranks_own_failure_with_no_progress_adds_to_the_chain(
    name: str | int, ran_s: float, chain: int
) -> None:
    why = killed_by(name, ran_s=ran_s) if isinstance(name, str) else exited(name, ran_s=ran_s)
    assert not from_outside(why)
    assert blame.repeats(opened_by(why, chain), why) == chain + 1
    assert blame.repeats(opened_by(why, chain), replace(why, ran_s=PROGRESS_WITHOUT_STEPS_S)) == 1


def test_a_lost_node_or_a_gpu_gone_bad_is_from_outside() -> None:
    for kind in (FailureKind.NODE_LOST, FailureKind.GPU, FailureKind.INFRASTRUCTURE):
        assert from_outside(replace(exited(1), kind=kind))
    assert not from_outside(exited(1)) and not from_outside(replace(exited(0), kind=FailureKind.HANG))


def test_a_record_amended_to_name_a_kill_from_outside_starts_the_count_again() -> None:
    """Node a bumped first with its rank's echo of the kill ("Connection closed by peer"), which
    repeated a's echo of the round before; b's SIGKILL came first, and amends the record."""
    echo = exited(1, node="a", ran_s=4.5, exception="torch.distributed.DistBackendError")
    kill = replace(killed_by("SIGKILL"), failed_at=NOW - 0.5, exited_at=NOW - 0.5)
    read = job_read(3, reason=RoundReason.WORKER_FAILED)
    assert read.round is not None
    read = replace(read, round=replace(read.round, failure=echo.to_json(), detail=echo.summary(), repeats=2))
    amend = blame.amendment(read, kill)
    assert isinstance(amend, Amend) and isinstance(amend.record, RoundInfo)
    assert amend.record.repeats == 1
    own = replace(killed_by("SIGSEGV"), failed_at=NOW - 0.5, exited_at=NOW - 0.5)
    kept = blame.amendment(read, own)
    assert isinstance(kept, Amend) and isinstance(kept.record, RoundInfo) and kept.record.repeats == 2

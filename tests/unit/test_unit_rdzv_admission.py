"""elasticd.jobs.admission.admit: may a node that is not part of a job join it now?"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from elasticd.jobs.admission import Admission, admit, single_host_note
from elasticd.rendezvous.decider import build_result
from elasticd.rendezvous.jobread import RostersRead
from elasticd.rendezvous.model import DrainRecord, FinalRecord, Join, RoundInfo
from elasticd.terms.options import EntryKind
from elasticd.terms.spec import JobSpec, NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason
from tests import fakes

JOB = "train-0a1b2c3d"


def make_spec(**overrides: Any) -> JobSpec:
    return fakes.make_spec(
        **(
            {
                "entry_kind": EntryKind.MODULE,
                "entry": "pkg.train",
                "args": (),
                "nnodes": NodeRange(1, 3),
                "nproc_per_node": 4,
                "submitted_at": 0.0,
            }
            | overrides
        )
    )


def _join(node: str, rev: int) -> Join:
    return Join(node, f"h-{node}", 29500, 4, rev)


def job_read(
    *,
    spec: JobSpec | None = None,
    round_no: int | None = 0,
    joins: tuple[str, ...] = (),
    members: tuple[str, ...] | None = None,
    previous: tuple[str, ...] | None = None,
    final: FinalRecord | None = None,
    drains: tuple[str, ...] = (),
) -> RostersRead:
    """A job in round ``round_no`` with ``joins`` so far; ``members`` closes it (a result)."""
    read = RostersRead(JOB, head=fakes.head_of(spec or make_spec()), final=final)
    if round_no is not None:
        read = replace(
            read, round=RoundInfo(round_no, RoundReason.START if round_no == 0 else RoundReason.SCALE_UP, 0.0)
        )
        read = replace(
            read, joins={**read.joins, round_no: tuple(_join(n, i + 1) for i, n in enumerate(joins))}
        )
        if members is not None:
            read = replace(
                read,
                results={
                    **read.results,
                    round_no: build_result(round_no, [_join(n, 0) for n in members], 0.0),
                },
            )
        if previous is not None and round_no > 0:
            read = replace(
                read,
                results={
                    **read.results,
                    round_no - 1: build_result(round_no - 1, [_join(n, 0) for n in previous], 0.0),
                },
            )
    read = replace(read, drains={n: DrainRecord() for n in drains})
    return read


def ask(
    read: RostersRead, node: str = "n9", free: int = 8, total: int = 8, draining: bool = False
) -> Admission:
    return admit(read, node, free, total, "GPUs", draining)


NO = Admission(False)
YES = Admission(True)


@pytest.mark.parametrize(
    ("read", "node", "want"),
    [
        # nothing to join
        (RostersRead(JOB), "n9", NO),
        (job_read(round_no=None), "n9", NO),
        (job_read(final=FinalRecord(JobState.SUCCEEDED, "", EndReason.SUCCEEDED)), "n9", NO),
        (job_read(final=FinalRecord(JobState.KILLED, "", EndReason.KILLED), members=("n1",)), "n9", NO),
        # the spec restricts the nodes
        (job_read(spec=make_spec(nodes=("n1", "n2"))), "n9", NO),
        (job_read(spec=make_spec(nodes=("n1", "n2"))), "n2", YES),
        (job_read(spec=make_spec(nodes=())), "anything", YES),
        # drained for this job
        (job_read(drains=("n9",)), "n9", NO),
        (job_read(drains=("n1",)), "n9", YES),
        # an open round: seats left by the joins so far
        (job_read(joins=()), "n9", YES),
        (job_read(joins=("n1", "n2")), "n9", YES),
        (job_read(joins=("n1", "n2", "n3")), "n9", NO),
        (job_read(joins=("n1", "n2", "n3", "n4")), "n9", NO),
        (job_read(spec=make_spec(nnodes=NodeRange(2, 2)), joins=("n1",)), "n9", YES),
        (job_read(spec=make_spec(nnodes=NodeRange(2, 2)), joins=("n1", "n2")), "n9", NO),
        # an open later round: its joins count, not the previous round's members
        (job_read(round_no=4, joins=("n1",), previous=("n1", "n2", "n3")), "n9", YES),
        (job_read(round_no=4, joins=("n1", "n2", "n3"), previous=("n1",)), "n9", NO),
        # a running round: seats left by its members (join at the next round)
        (job_read(round_no=2, joins=("n1", "n2"), members=("n1", "n2")), "n9", YES),
        (job_read(round_no=2, joins=("n1", "n2", "n3"), members=("n1", "n2", "n3")), "n9", NO),
        (job_read(round_no=2, joins=("n1", "n2", "n3", "n4"), members=("n1",)), "n9", YES),
    ],
)
def test_admit(read: RostersRead, node: str, want: Admission) -> None:
    assert ask(read, node) == want


@pytest.mark.parametrize(
    "read",
    [job_read(), job_read(round_no=3, joins=("n1",)), job_read(round_no=1, members=("n1",))],
    ids=["pending", "restarting", "running"],
)
def test_node_wide_drain_joins_nothing(read: RostersRead) -> None:
    assert ask(read) == YES
    assert ask(read, draining=True) == NO


@pytest.mark.parametrize(
    ("free", "total", "nproc", "unit", "note"),
    [
        (0, 8, 4, "GPUs", "n9 is waiting for 4 free GPUs (0 of 8 free now)"),
        (3, 8, 4, "GPUs", "n9 is waiting for 4 free GPUs (3 of 8 free now)"),
        (1, 2, 2, "CPU slots", "n9 is waiting for 2 free CPU slots (1 of 2 free now)"),
        (0, 0, 1, "GPUs", "n9 is waiting for 1 free GPUs (0 of 0 free now)"),
    ],
)
def test_not_enough_free_slots(free: int, total: int, nproc: int, unit: str, note: str) -> None:
    read = job_read(spec=make_spec(nproc_per_node=nproc))
    assert admit(read, "n9", free, total, unit) == Admission(False, note)


@pytest.mark.parametrize(("free", "nproc"), [(4, 4), (5, 4), (8, 1), (1, 1)])
def test_enough_free_slots(free: int, nproc: int) -> None:
    read = job_read(spec=make_spec(nproc_per_node=nproc))
    assert admit(read, "n9", free, 8, "GPUs") == YES


@pytest.mark.parametrize(
    "read",
    [
        job_read(joins=("n1", "n2", "n3")),  # no seat
        job_read(drains=("n9",)),
        job_read(spec=make_spec(nodes=("n1",))),
        job_read(final=FinalRecord(JobState.FAILED, "x", EndReason.WORKER_FAILED)),
    ],
    ids=["full", "drained", "not-allowed", "final"],
)
def test_refusals_other_than_slots_carry_no_note(read: RostersRead) -> None:
    assert admit(read, "n9", 0, 8, "GPUs") == NO


@pytest.mark.parametrize(
    ("nnodes", "joins", "want"),
    [
        (NodeRange(1, 1), (), YES),  # single-node jobs run
        (NodeRange(1, 3), (), Admission(False, single_host_note("n9"))),
        (NodeRange(2, 2), ("n1",), Admission(False, single_host_note("n9"))),
        (NodeRange(2, 2), ("n1", "n2"), NO),  # no seat: nothing to say
    ],
)
def test_a_node_others_cannot_reach_takes_no_multi_node_job(
    nnodes: NodeRange, joins: tuple[str, ...], want: Admission
) -> None:
    read = job_read(spec=make_spec(nnodes=nnodes), joins=joins)
    assert admit(read, "n9", 8, 8, "GPUs", single_host_only=True) == want
    assert admit(read, "n9", 8, 8, "GPUs") == (NO if joins == ("n1", "n2") else YES)


def test_the_single_host_note_names_the_setting() -> None:
    note = single_host_note("n9")
    assert "n9" in note and "`address`" in note and "--address" in note and "ELASTICD_ADDRESS" in note

"""``status`` of every job (``manager/statusviews.py``): the reply a ``StatusViews`` makes after
any sequence of reads (jobs added, gone, changed, or with another submission time) is the one a
``StatusViews`` that saw only the last read makes, its jobs oldest first; and it is the views'
JSON, byte for byte a JSON array."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.jobs.board import Board
from elasticd.jobs.queue import Turns
from elasticd.manager.statusviews import StatusViews
from elasticd.rendezvous.snapshot import JobSnapshot
from elasticd.terms.spec import NodeRange
from tests.fakes import head_of, make_spec

IDS = [f"j{i:02d}" for i in range(12)]


def snap(job_id: str, at: float) -> JobSnapshot:
    spec = make_spec(id=job_id, submitted_at=at, nodes=("elsewhere",), nnodes=NodeRange(1, 1))
    return JobSnapshot(job_id, head=head_of(spec), found=1)


# One step: a job (re)written at a time (new, or changed: a new snapshot), or a job gone.
steps = st.lists(
    st.tuples(st.sampled_from(IDS), st.one_of(st.none(), st.integers(0, 40).map(float))), max_size=30
)


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(1, 4))
def test_a_reply_after_any_reads_is_the_reply_of_the_last_read_alone(
    changes: list[tuple[str, float | None]], every: int
) -> None:
    board = Board(Turns())
    views = StatusViews("n1", board)
    snaps: dict[str, JobSnapshot] = {}
    for i, (job_id, at) in enumerate(changes):
        snaps = dict(snaps)  # a new read
        if at is None:
            snaps.pop(job_id, None)
        else:
            snaps[job_id] = snap(job_id, 1.7e9 + at + 0.01 * IDS.index(job_id))  # no two alike
        if i % every:
            continue  # reads that no status asked about
        for rows in (False, True):
            got = views.json(snaps, (), None, rows)
            assert got == StatusViews("n1", Board(Turns())).json(snaps, (), None, rows)
        listed = views.views(snaps, (), None)
        assert json.loads(views.json(snaps, (), None)) == listed
        times = [v["submitted_at"] for v in listed]
        assert times == sorted(times) and len(listed) == len(snaps)


def test_jobs_submitted_at_the_same_time_are_all_listed_in_order() -> None:
    views = StatusViews("n1", Board(Turns()))
    snaps = {j: snap(j, 1.7e9) for j in IDS[:3]}
    views.json(snaps, (), None)
    snaps = snaps | {"j09": snap("j09", 1.7e9), "j10": snap("j10", 1.8e9)}
    listed = views.views(snaps, (), None)
    assert sorted(v["id"] for v in listed) == sorted(snaps) and listed[-1]["id"] == "j10"
    assert json.loads(views.json(snaps, (), None)) == listed

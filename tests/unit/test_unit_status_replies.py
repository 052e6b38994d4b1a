"""``status`` of every job (``manager/statusviews.py``): the reply spliced from each job's held
encodings is the views' JSON, byte for byte a JSON array, its jobs oldest first; and the parts
kept from the reads before (``Derived.each``: each job's view once per read of it) make the
reply the last read alone makes, whatever reads came before."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.informer.derived import Derived
from elasticd.jobs import board
from elasticd.jobs.ticket import tickets_of
from elasticd.manager import statusviews
from elasticd.manager.statusviews import Held
from elasticd.rendezvous.jobread import JobRead, RostersRead
from elasticd.terms.spec import NodeRange
from tests.fakes import head_of, make_spec

IDS = [f"j{i:02d}" for i in range(12)]


def read(job_id: str, at: float) -> RostersRead:
    spec = make_spec(id=job_id, submitted_at=at, nodes=("elsewhere",), nnodes=NodeRange(1, 1))
    return RostersRead(job_id, head=head_of(spec), found=1)


def made(
    reads: Mapping[str, JobRead], held: Mapping[str, Held], rows: bool
) -> tuple[bytes, list[dict[str, Any]]]:
    """The reply and the views of ``reads``, from ``held``."""
    queue = board.queue(reads, tickets_of(reads.values()), {})
    order = statusviews.oldest_first(held)
    reply = statusviews.reply(reads, held, order, queue.ranked, statusviews.selection((), None, rows))
    return reply, statusviews.views(reads, held, order, queue, (), None)


def fresh(reads: Mapping[str, JobRead]) -> dict[str, Held]:
    return {job: statusviews.held(r, "n1", None) for job, r in reads.items()}


# One step: a job (re)written at a time (new, or changed: a new read of it), or a job gone.
steps = st.lists(
    st.tuples(st.sampled_from(IDS), st.one_of(st.none(), st.integers(0, 40).map(float))), max_size=30
)


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(1, 4))
def test_a_reply_after_any_reads_is_the_reply_of_the_last_read_alone(
    changes: list[tuple[str, float | None]], every: int
) -> None:
    reads: dict[str, RostersRead] = {}
    derived = Derived(lambda: reads)
    for i, (job_id, at) in enumerate(changes):
        reads = dict(reads)  # a new read
        if at is None:
            reads.pop(job_id, None)
        else:
            reads[job_id] = read(job_id, 1.7e9 + at + 0.01 * IDS.index(job_id))  # no two alike
        if i % every:
            continue  # reads that no status asked about
        held = derived.each("view", reads, lambda job, r: statusviews.held(r, "n1", None))
        for rows in (False, True):
            assert made(reads, held, rows)[0] == made(reads, fresh(reads), rows)[0]
        reply, listed = made(reads, held, False)
        assert reply == json.dumps(listed).encode()  # the splice is the encoding, byte for byte
        times = [v["submitted_at"] for v in listed]
        assert times == sorted(times) and len(listed) == len(reads)


def test_jobs_submitted_at_the_same_time_are_all_listed_in_order() -> None:
    reads = {j: read(j, 1.7e9) for j in IDS[:3]}
    reads = reads | {"j09": read("j09", 1.7e9), "j10": read("j10", 1.8e9)}
    reply, listed = made(reads, fresh(reads), False)
    assert [v["id"] for v in listed] == [*IDS[:3], "j09", "j10"]
    assert json.loads(reply) == listed
    assert made({}, {}, True)[0] == b"[]"

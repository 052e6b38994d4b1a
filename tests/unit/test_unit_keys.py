"""elasticd.etcd.keys: every key built parses back to what it names; joins live apart from the rest
of their job, outside the ranges every daemon watches (``Keys.watched``), and nowhere else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.decode import DecodeError
from elasticd.etcd.keys import KeyKind, KeyRef, Keys
from elasticd.etcd.kv import prefix_end
from elasticd.jobs.spec import JOB_ID, NODE_ID
from elasticd.rendezvous.model import MAX_ROUND

KEYS = Keys("/k/v2")
JOB, NODE = "train-1", "n1"
JOBS = st.from_regex(JOB_ID, fullmatch=True)
NODES = st.from_regex(NODE_ID, fullmatch=True)
ROUNDS = st.integers(0, MAX_ROUND)


def built(keys: Keys, job: str, node: str, r: int) -> dict[str, KeyRef]:
    """Every key of the layout, and what it names."""
    return {
        keys.node(node): KeyRef(KeyKind.NODE, node=node),
        keys.drain(node): KeyRef(KeyKind.NODE_DRAIN, node=node),
        keys.janitor(): KeyRef(KeyKind.JANITOR),
        keys.event(7): KeyRef(KeyKind.EVENT),
        keys.event_seq(): KeyRef(KeyKind.EVENT_SEQ),
        keys.job_spec(job): KeyRef(KeyKind.SPEC, job),
        keys.job_round(job): KeyRef(KeyKind.ROUND, job),
        keys.job_restarts(job): KeyRef(KeyKind.RESTARTS, job),
        keys.job_final(job): KeyRef(KeyKind.FINAL, job),
        keys.result(job, r): KeyRef(KeyKind.RESULT, job, r),
        keys.join(job, r, node): KeyRef(KeyKind.JOIN, job, r, node),
        keys.done(job, r, node): KeyRef(KeyKind.DONE, job, r, node),
        keys.left(job, r, node): KeyRef(KeyKind.LEFT, job, r, node),
        keys.waiting(job, node): KeyRef(KeyKind.WAITING, job, node=node),
        keys.node_status(job, node): KeyRef(KeyKind.NODE_STATUS, job, node=node),
        keys.pending_note(job, node): KeyRef(KeyKind.PENDING, job, node=node),
        keys.job_drain(job, node): KeyRef(KeyKind.JOB_DRAIN, job, node=node),
    }


def watched(keys: Keys, key: str) -> int:
    """In how many of the ranges a daemon watches ``key`` is."""
    return sum(start <= key < end for start, end in keys.watched())


def test_the_layout_is_v2_by_default() -> None:
    assert Keys().prefix == "/elasticd/v2"


@given(job=JOBS, node=NODES, r=ROUNDS)
def test_every_key_parses_back_and_only_joins_are_outside_the_watched_ranges(
    job: str, node: str, r: int
) -> None:
    for key, ref in built(KEYS, job, node, r).items():
        assert KEYS.parse(key) == ref
        assert watched(KEYS, key) == (0 if ref.kind is KeyKind.JOIN else 1), key
        change = KEYS.route(key, deleted=True)
        assert change is not None and change.ref == ref and change.job == (ref.job or None)
        assert KEYS.job_of(key) == (ref.job or None)


@given(job=JOBS, node=NODES, r=ROUNDS)
def test_a_job_and_its_rounds_cover_their_joins(job: str, node: str, r: int) -> None:
    join = KEYS.join(job, r, node)
    assert join.startswith(KEYS.joins(job, r)) and join.startswith(KEYS.job_joins(job))
    assert join.startswith(KEYS.all_joins())
    assert [p for p in KEYS.job_prefixes(job) if join.startswith(p)] == [KEYS.job_joins(job)]
    assert [p for p in KEYS.rounds(job, r) if join.startswith(p)] == [KEYS.rounds(job, r)[0]]
    assert any(KEYS.result(job, r).startswith(p) for p in KEYS.rounds(job, r))
    assert KEYS.job_prefixes(job)[0] == KEYS.job_joins(job)  # joins deleted first


def test_the_watched_ranges_are_the_whole_prefix_but_the_joins() -> None:
    (a, b), (c, d) = KEYS.watched()
    assert (a, b, c, d) == ("/k/v2/", "/k/v2/rdzv/", prefix_end("/k/v2/rdzv/"), prefix_end("/k/v2/"))
    assert watched(KEYS, "/k/v2/rdzv") == 1  # a sibling of the subtree, not in it
    assert watched(KEYS, "/k/v2/rdzv/x") == 0
    assert watched(KEYS, "/k/v20") == watched(KEYS, "/k/v2") == 0  # outside the prefix


@pytest.mark.parametrize(
    "rest",
    [
        f"jobs/{JOB}/rdzv/0/join/{NODE}",  # where v1 kept joins
        f"rdzv/{JOB}/0/join",
        f"rdzv/{JOB}/0/join/{NODE}/x",
        f"rdzv/{JOB}/0/result",
        f"rdzv/{JOB}/0/done/{NODE}",
        f"rdzv/{JOB}/01/join/{NODE}",
        f"rdzv/{JOB}/0/join/bad node",
        "rdzv/bad job/0/join/n1",
    ],
)
def test_keys_among_the_joins_that_are_no_join_do_not_parse(rest: str) -> None:
    key = f"{KEYS.prefix}/{rest}"
    with pytest.raises(DecodeError):
        KEYS.parse(key)
    change = KEYS.route(key, deleted=False)  # a job's bad key still wakes (and fails) its job
    assert change is not None and change.ref is None and change.job == rest.split("/")[1]


def test_keys_outside_any_job_name_none() -> None:
    for key in (
        "/k/v2/rdzv/",
        "/k/v2/jobs/",
        "/k/v2/nodes/n1",
        "/k/v2/rdzvx/j/0/join/n1",
        "/other/rdzv/j/",
        "/k/v2/rdzv/j",
    ):
        assert KEYS.job_of(key) is None

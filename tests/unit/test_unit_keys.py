"""elasticd.etcd.keys: every key built parses back to what it names; a job's parts (joins, pending
notes) and its nodes' reports (statuses) live apart from the rest of their job, outside the ranges
every daemon watches (``Keys.watched``), and nowhere else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.decode import DecodeError
from elasticd.etcd.eventkeys import EventRing
from elasticd.etcd.keyref import KeyKind, KeyRef
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import prefix_end
from elasticd.terms.ids import JOB_ID, MAX_ROUND, NODE_ID

KEYS = Keys("/k/v2")
JOB, NODE = "train-1", "n1"
JOBS = st.from_regex(JOB_ID, fullmatch=True)
NODES = st.from_regex(NODE_ID, fullmatch=True)
ROUNDS = st.integers(0, MAX_ROUND)


# Whether every daemon's watch carries a key kind (``Keys.watched``). A job's parts (its joins and
# its nodes' pending notes) are under ``parts/<job>/`` and ``notes/<job>/``, which no daemon
# watches, and its nodes' statuses under ``reports/<job>/``: each
# is written by or for every node of a job, and no daemon but a round's leader (the joins of its
# round, by a watch of its own) acts on another node's. A job's full spec (``specs/<job>``) is
# read only by a node about to take part in the job: no daemon watches it either. A node's record
# (``nodes/<node>``, rewritten at each admission) is read on demand, and its presence in a job
# (``presence/<job>/<node>``) is watched by the job's agents alone, for its deletion.
WATCHED = {
    KeyKind.NODE: False,
    KeyKind.PRESENCE: False,
    KeyKind.NODE_DRAIN: True,
    KeyKind.CHECK_REQUEST: True,  # each node hears its own (manager/checks.py)
    KeyKind.CHECK_ANSWER: True,
    KeyKind.GPU: True,
    KeyKind.JANITOR: True,
    KeyKind.EVENT: True,
    KeyKind.EVENT_SEQ: True,
    KeyKind.SPEC: True,
    KeyKind.BODY: False,
    KeyKind.ROUND: True,
    KeyKind.RESTARTS: True,
    KeyKind.FINAL: True,
    KeyKind.RESULT: True,
    KeyKind.ASSIGNMENT: False,  # a round's N records reach no watch
    KeyKind.JOIN: False,
    KeyKind.DONE: False,
    KeyKind.LEAD: False,
    KeyKind.LEFT: True,
    KeyKind.WAITING: True,
    KeyKind.NODE_STATUS: False,
    KeyKind.PENDING: False,
    KeyKind.JOB_DRAIN: True,
}


def built(keys: Keys, job: str, node: str, r: int) -> dict[str, KeyRef]:
    """Every key of the layout, and what it names."""
    return {
        keys.node(node): KeyRef(KeyKind.NODE, node=node),
        keys.drain(node): KeyRef(KeyKind.NODE_DRAIN, node=node),
        keys.check_request(node): KeyRef(KeyKind.CHECK_REQUEST, node=node),
        keys.check_answer(node): KeyRef(KeyKind.CHECK_ANSWER, node=node),
        keys.gpu(node, "GPU-0a1b-2c"): KeyRef(KeyKind.GPU, node=node),
        keys.gpu(node, "MIG-0a1b"): KeyRef(KeyKind.GPU, node=node),
        keys.janitor(): KeyRef(KeyKind.JANITOR),
        keys.event(EventRing.CLUSTER, 7): KeyRef(KeyKind.EVENT),
        keys.event(EventRing.RECENT, 7, job): KeyRef(KeyKind.EVENT),
        keys.event(EventRing.OLDER, 7, job): KeyRef(KeyKind.EVENT),
        keys.event_seq(): KeyRef(KeyKind.EVENT_SEQ),
        keys.job_spec(job): KeyRef(KeyKind.SPEC, job),
        keys.job_body(job): KeyRef(KeyKind.BODY, job),
        keys.job_round(job): KeyRef(KeyKind.ROUND, job),
        keys.job_restarts(job): KeyRef(KeyKind.RESTARTS, job),
        keys.job_final(job): KeyRef(KeyKind.FINAL, job),
        keys.result(job, r): KeyRef(KeyKind.RESULT, job, r),
        keys.assignment(job, r, node): KeyRef(KeyKind.ASSIGNMENT, job, r, node),
        keys.join(job, r, node): KeyRef(KeyKind.JOIN, job, r, node),
        keys.presence(job, node): KeyRef(KeyKind.PRESENCE, job, node=node),
        keys.done(job, r, node): KeyRef(KeyKind.DONE, job, r, node),
        keys.lead(job, r, node): KeyRef(KeyKind.LEAD, job, r, node),
        keys.left(job, r, node): KeyRef(KeyKind.LEFT, job, r, node),
        keys.waiting(job, node): KeyRef(KeyKind.WAITING, job, node=node),
        keys.node_status(job, node): KeyRef(KeyKind.NODE_STATUS, job, node=node),
        keys.pending_note(job, node): KeyRef(KeyKind.PENDING, job, node=node),
        keys.job_drain(job, node): KeyRef(KeyKind.JOB_DRAIN, job, node=node),
    }


def watched(keys: Keys, key: str) -> int:
    """In how many of the ranges a daemon watches ``key`` is."""
    return sum(start <= key < end for start, end in keys.watched())


def test_the_layout_is_v6_by_default() -> None:
    assert Keys().prefix == "/elasticd/v6"


def test_the_table_names_every_kind_once() -> None:
    assert set(WATCHED) == set(KeyKind)
    assert {ref.kind for ref in built(KEYS, JOB, NODE, 3).values()} == set(KeyKind)


@given(job=JOBS, node=NODES, r=ROUNDS)
def test_every_key_parses_back_and_is_watched_as_its_kind_says(job: str, node: str, r: int) -> None:
    for key, ref in built(KEYS, job, node, r).items():
        assert KEYS.parse(key) == ref
        assert watched(KEYS, key) == int(WATCHED[ref.kind]), key
        unwatched: tuple[str, ...] = (KEYS.nodes(), KEYS.all_notes(), KEYS.all_parts(), KEYS.presences(job))
        unwatched += (KEYS.all_reports(), KEYS.all_rounds(), KEYS.specs())
        read = key.startswith(KEYS.every_job())  # the read of every job: no key of a member's
        assert read == (ref.job != "" and (WATCHED[ref.kind] or ref.kind is KeyKind.PENDING)), key
        assert KEYS.read_with_every_job(KEYS.relative(key)) == read
        assert key.startswith(unwatched) == (not WATCHED[ref.kind]), key
        if ref.kind in (KeyKind.BODY, KeyKind.PRESENCE):  # apart from the job's other keys
            assert key in (KEYS.job_body(job), KEYS.presence(job, node)) and KEYS.job_of(key) is None
            assert not any(key.startswith(p) for p in (KEYS.jobs(), KEYS.all_parts()))
            continue
        if ref.kind is KeyKind.ASSIGNMENT:  # under the job's rounds, which its removal deletes too
            assert key.startswith(KEYS.job_rounds(job)) and KEYS.job_of(key) == job
            continue
        if ref.kind is KeyKind.NODE_STATUS:  # under the job's reports: outside the read of every job
            assert key.startswith(KEYS.job_reports(job)) and KEYS.job_of(key) == job
            assert not any(key.startswith(p) for p in (KEYS.jobs(), KEYS.all_parts()))
            continue
        if ref.job:  # every key of a job is in exactly one of its prefixes
            home = KEYS.job_notes(job) if ref.kind is KeyKind.PENDING else KEYS.job_parts(job)
            assert [p for p in KEYS.job_prefixes(job) if key.startswith(p)] == [
                KEYS.job(job) if WATCHED[ref.kind] else home
            ], key
            start, end = KEYS.job_joins(job)  # what an agent reads of the parts
            assert (start <= key < end) == (ref.kind in (KeyKind.JOIN, KeyKind.DONE, KeyKind.LEAD)), key
        change = KEYS.route(key, deleted=True)
        assert change is not None and change.ref == ref and change.job == (ref.job or None)
        assert KEYS.job_of(key) == (ref.job or None)


@given(job=JOBS, node=NODES, r=ROUNDS)
def test_a_job_and_its_rounds_cover_their_joins(job: str, node: str, r: int) -> None:
    join = KEYS.join(job, r, node)
    assert join.startswith(KEYS.joins(job, r)) and join.startswith(KEYS.job_parts(job))
    assert [p for p in KEYS.rounds(job, r) if join.startswith(p)] == [KEYS.rounds(job, r)[0]]
    assert any(KEYS.result(job, r).startswith(p) for p in KEYS.rounds(job, r))
    assert KEYS.job_prefixes(job)[:2] == (KEYS.job_parts(job), KEYS.job_notes(job))  # deleted first
    for other in (KEYS.node_status(job, node), KEYS.pending_note(job, node)):  # no round's
        assert not any(other.startswith(p) for p in KEYS.rounds(job, r))
        assert not other.startswith(KEYS.joins(job, r))


def test_the_watched_ranges_are_the_whole_prefix_but_nodes_parts_presences_and_full_specs() -> None:
    (a, b), (c, d) = KEYS.watched()
    assert (a, b, c, d) == ("/k/v2/", "/k/v2/nodes/", prefix_end("/k/v2/specs/"), prefix_end("/k/v2/"))
    assert watched(KEYS, "/k/v2/nodes/x") == watched(KEYS, "/k/v2/presence/j/x") == 0
    assert watched(KEYS, "/k/v2/nodes") == watched(KEYS, "/k/v2/specsx") == 1  # siblings, not in it
    assert watched(KEYS, "/k/v2/parts/x") == watched(KEYS, "/k/v2/specs/x") == 0
    assert watched(KEYS, "/k/v2/reports/j/x") == watched(KEYS, "/k/v2/rounds/j/0/x") == 0
    assert watched(KEYS, "/k/v2/notes/j/x") == 0
    assert watched(KEYS, "/k/v20") == watched(KEYS, "/k/v2") == 0  # outside the prefix


@pytest.mark.parametrize(
    "rest",
    [
        f"jobs/{JOB}/rdzv/0/join/{NODE}",  # where v1 kept joins
        f"jobs/{JOB}/nodes/{NODE}",  # where v1 kept statuses
        f"jobs/{JOB}/pending/{NODE}",  # ... and pending notes
        f"jobs/{JOB}/status/{NODE}",
        f"parts/{JOB}/0/join",
        f"parts/{JOB}/0/join/{NODE}/x",
        f"parts/{JOB}/0/result",
        f"jobs/{JOB}/rdzv/0/done/{NODE}",  # where v4 kept done markers
        f"parts/{JOB}/01/join/{NODE}",
        f"parts/{JOB}/+1/join/{NODE}",
        f"parts/{JOB}/0/join/bad node",
        f"parts/{JOB}/status/join/{NODE}",  # a round is a plain decimal, never a kind
        f"parts/{JOB}/0/status/{NODE}",  # a status is no round's
        f"parts/{JOB}/status/{NODE}",  # where v4 kept statuses
        f"parts/{JOB}/status",
        f"reports/{JOB}/{NODE}/x",
        f"reports/{JOB}/0/{NODE}",
        f"reports/{JOB}/bad node",
        f"parts/{JOB}/pending/{NODE}",  # where v4 kept pending notes
        f"notes/{JOB}/{NODE}/0",
        f"notes/{JOB}/pending/{NODE}",
        f"parts/{JOB}/nodes/{NODE}",
        f"parts/{JOB}/waiting/{NODE}",  # waiting stays under jobs/ (and watched)
        f"parts/{JOB}/drain/{NODE}",
        f"parts/{JOB}/spec",
        "parts/bad job/0/join/n1",
        "parts/bad job/status/n1",
        "reports/bad job/n1",
    ],
)
def test_keys_of_a_job_that_name_no_record_do_not_parse(rest: str) -> None:
    key = f"{KEYS.prefix}/{rest}"
    with pytest.raises(DecodeError):
        KEYS.parse(key)
    change = KEYS.route(key, deleted=False)  # a job's bad key still wakes (and fails) its job
    assert change is not None and change.ref is None and change.job == rest.split("/")[1]


def test_keys_outside_any_job_name_none() -> None:
    for key in (
        "/k/v2/parts/",
        "/k/v2/jobs/",
        "/k/v2/nodes/n1",
        "/k/v2/partsx/j/0/join/n1",
        "/other/parts/j/",
        "/k/v2/parts/j",
        "/k/v2/rdzv/j/0/join/n1",  # where layout v2 kept joins before parts/ (never released)
    ):
        assert KEYS.job_of(key) is None

"""elasticd.agent.step: what to read, joining and closing rounds, running, success, rounds that
move on, stale and ended jobs, determinism. Events (failures, lost members, drains, fencing, an
unreachable store) are in test_unit_agent_step_events.py."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.agent.actions import (
    ClearWaiting,
    CloseRound,
    Exit,
    Finalize,
    Join,
    MarkDone,
    Publish,
    ReadGlance,
    ReadJob,
    SetWaiting,
    StartWorkers,
    StopWorkers,
    Wait,
    WatchPeers,
    Withdraw,
)
from elasticd.agent.record import AgentRecord, AgentState, Leave, Local, Observed
from elasticd.agent.step import step
from elasticd.jobs.decider import Group
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.glance import Glance
from elasticd.rendezvous.jobread import RostersRead
from elasticd.terms.state import EndReason, JobState, RoundReason, SetupFailure
from tests.agent_steps import (
    ALL,
    ME,
    NOW,
    OPENED_AT,
    RUNNING,
    SUCCEEDED,
    acts,
    decide,
    failed,
    failure,
    following,
    job_read,
    joining,
    local,
    member,
    record,
    run,
    spec,
    writes,
)

DRAIN = Leave(RoundReason.MEMBER_LEFT, "drained", 5.0)


# -- what is read --------------------------------------------------------------------------------


LEAD = 10  # the leader's join's create revision (``agent_steps.job_read``): the round's epoch


def test_joined_non_leader_reads_only_a_glance_of_its_round() -> None:
    rec = joining(2)
    assert step(rec, None, local(), NOW) == (rec, [ReadGlance(2)])


@pytest.mark.parametrize("state", [AgentState.RUNNING, AgentState.DONE])
def test_running_member_reads_the_job_with_its_rounds_joins_only_counted(state: AgentState) -> None:
    rec = record(state, 2)
    assert step(rec, None, local(RUNNING), NOW) == (rec, [ReadJob(2)])


@pytest.mark.parametrize(
    "rec",
    [
        joining(2, leading=True),  # a leader needs the joins
        record(AgentState.JOINING, -1),  # not joined anything yet
        record(AgentState.WAITING, 1),
        record(AgentState.STOPPING, 1),
        joining(2, leave=DRAIN),  # leaving: the whole job, to bump or mark left
    ],
    ids=["leader", "fresh", "waiting", "stopping", "leaving-joiner"],
)
def test_any_other_node_reads_the_whole_job(rec: AgentRecord) -> None:
    """... and a leader its rounds whole too (the previous round's members: whom to expect)."""
    assert step(rec, None, local(), NOW) == (rec, [ReadJob(None, rosters=rec.leading)])


def test_quiet_glance_waits_without_reading_more() -> None:
    rec = joining(2)
    assert step(rec, Glance(2, False, False, "n2", True), local(), NOW) == (rec, [Wait()])


def test_glance_of_our_round_closed_reads_the_job_with_that_rounds_joins_counted() -> None:
    rec = joining(2)
    assert step(rec, Glance(2, False, True, "n2", True), local(), NOW) == (rec, [ReadJob(2)])


@pytest.mark.parametrize(
    "glance",
    [
        Glance(2, False, False, ME, True),  # the leader left: we lead now
        Glance(3, False, False, "n2", True),  # the round moved on
        Glance(3, False, True, "n2", False),  # ... and the next one closed already
        Glance(2, True, False, "n2", True),  # the job ended
        Glance(2, False, False, "n2", False),  # our join is gone
        Glance(-1, False, False, None, False),  # a record did not parse
    ],
    ids=["we-lead", "moved", "moved-closed", "ended", "join-gone", "unreadable"],
)
def test_glance_that_is_not_quiet_reads_the_whole_job(glance: Glance) -> None:
    rec = joining(2)
    assert step(rec, glance, local(), NOW) == (rec, [ReadJob(None)])


# -- joining and closing a round --------------------------------------------------------------------


def test_open_round_not_joined_clears_waiting_joins_and_publishes() -> None:
    rec, actions = decide(record(AgentState.WAITING, 1), job_read(2, joins=("n2",)))
    assert actions == [WatchPeers(2, ()), ClearWaiting(), Join(2), Publish()]
    assert (rec.state, rec.joined_round, rec.round) == (AgentState.JOINING, 2, 1)


def test_leader_closes_as_soon_as_max_nodes_joined() -> None:
    read = job_read(1, joins=("n1", "n2", "n3"))
    rec, actions = decide(joining(1), read, following(1))
    closed = rdzv.build_result(1, read.current_joins, NOW, LEAD)
    assert acts(actions) == [CloseRound(closed, "3 of at most 3 nodes joined")]
    assert (rec.leading, rec.seen_joins, rec.last_join_at) == (True, ("n1", "n2", "n3"), NOW)


def test_leader_closes_after_last_call_without_a_new_join() -> None:
    read = job_read(1, joins=("n1", "n2"))
    rec = joining(1, seen_joins=("n1", "n2"), last_join_at=NOW - 2.5)
    new, actions = decide(rec, read, following(1))
    closed = rdzv.build_result(1, read.current_joins, NOW, LEAD)
    assert acts(actions) == [CloseRound(closed, "last call: 2 nodes joined")]
    assert new.last_join_at == NOW - 2.5


def test_leader_waits_out_last_call_after_a_new_join_batching_joins() -> None:
    rec = joining(1, seen_joins=("n1",), last_join_at=NOW - 30.0)
    new, actions = decide(rec, job_read(1, joins=("n1", "n2"), lead=ME), following(1))
    assert acts(actions) == [Wait(NOW + 2.0, batch=True)]
    assert (new.seen_joins, new.last_join_at) == (("n1", "n2"), NOW)


def test_leader_closes_at_once_when_every_expected_node_rejoined_keeping_ranks() -> None:
    read = job_read(2, joins=("n1", "n2"), expect=("n1", "n2"), previous=("n2", "n1"))
    _, actions = decide(joining(2, ran=1), read, following(2))
    n1, n2 = read.current_joins
    closed = rdzv.build_result(2, [n2, n1], NOW, LEAD)
    assert acts(actions) == [CloseRound(closed, "every expected node rejoined")]
    assert closed.nodes == ("n2", "n1")


@pytest.mark.parametrize(
    ("left", "grace_s", "expected"),
    [
        (("n3",), None, "close"),  # it stopped its workers for good: counts as arrived
        ((), None, Wait(OPENED_AT + 10.0 + 2.0, batch=True)),  # its stop grace (spec's) + 2 s
        ((), 20.0, Wait(OPENED_AT + 20.0 + 2.0, batch=True)),  # the round's grace
    ],
    ids=["left", "spec-grace", "round-grace"],
)
def test_leader_waits_for_a_live_expected_node_unless_it_left(
    left: tuple[str, ...], grace_s: float | None, expected: Wait | str
) -> None:
    read = job_read(2, joins=("n1", "n2"), expect=("n1", "n2", "n3"), left=left, grace_s=grace_s, lead=ME)
    _, actions = decide(joining(2, ran=1), read, following(2))
    if expected == "close":
        assert acts(actions) == [
            CloseRound(rdzv.build_result(2, read.current_joins, NOW, LEAD), "every expected node rejoined")
        ]
    else:
        assert acts(actions) == [expected]


def test_leader_fails_the_job_when_min_did_not_join_in_time() -> None:
    _, actions = decide(joining(1), job_read(1, joins=("n1",), opened_at=NOW - 60.0), following(1))
    why = "only 1 of the 2 nodes needed joined within 60s"
    assert acts(actions) == [Finalize(JobState.FAILED, EndReason.JOIN_TIMEOUT, why)]


def test_leader_below_min_waits_until_the_join_timeout() -> None:
    _, actions = decide(joining(1), job_read(1, joins=("n1",), lead=ME), following(1))
    assert acts(actions) == [Wait(OPENED_AT + 60.0, batch=True)]


def test_non_leader_in_the_round_waits_and_stops_leading() -> None:
    rec, actions = decide(joining(1, leading=True), job_read(1, joins=("n2", "n1")))
    assert acts(actions) == [Wait()]
    assert rec.leading is False


def test_open_round_without_a_lease_waits_without_joining() -> None:
    rec = record(AgentState.WAITING, 1)
    new, actions = decide(rec, job_read(2, joins=("n2",)), local(lease=None))
    assert acts(actions) == [Wait()]
    assert new == rec


# -- a round with a result ----------------------------------------------------------------------------


@pytest.mark.parametrize("counted", [False, True], ids=["full-read", "counted-read"])
def test_selected_in_the_result_starts_workers_as_its_member(counted: bool) -> None:
    read = job_read(2, joins=("n2", "n1"), members=("n2", "n1"), counted=counted, restarts=2)
    rec, actions = decide(joining(2, ran=1, failure=failure()), read)
    assert read.result is not None
    assert actions == [
        WatchPeers(2, ()),
        StartWorkers(read.result.head(), member(read), 2),
        Publish(),
        Wait(on_exits=True),
    ]
    assert member(read).group_rank == 1
    assert (rec.state, rec.round, rec.failure) == (AgentState.RUNNING, 2, None)


def test_running_member_with_nothing_new_watches_its_ring_neighbours_and_waits_on_exits() -> None:
    read = job_read(2, joins=("n1", "n2", "n3"), members=("n1", "n2", "n3"), counted=True)
    rec = record(AgentState.RUNNING, 2)
    new, actions = decide(rec, read, local(RUNNING))
    assert actions == [WatchPeers(2, (member(read, "n3"), member(read, "n2"))), Wait(on_exits=True)]
    assert new == rec


def test_not_selected_with_the_job_full_withdraws_and_exits_not_needed() -> None:
    job = spec("1:2")
    read = job_read(2, job=job, joins=("n2", "n3", "n1"), members=("n2", "n3"))
    _, actions = decide(joining(2, job=job), read)
    assert acts(actions) == [Withdraw(2), Exit("the job runs with every node it can use", "agent.not_needed")]


def test_not_selected_while_the_job_can_grow_waits_to_join_the_next_round() -> None:
    read = job_read(2, joins=("n2", "n3", "n1"), members=("n2", "n3"))
    rec, actions = decide(joining(2), read)
    assert acts(actions) == [Withdraw(2), SetWaiting(), Publish(), Wait()]
    assert rec.state is AgentState.WAITING


def test_not_selected_after_a_counted_read_still_withdraws_its_join() -> None:
    read = job_read(2, joins=("n2", "n3", "n1"), members=("n2", "n3"), counted=True)
    rec = joining(2)
    assert step(rec, Glance(2, False, True, "n2", True), local(), NOW)[1] == [ReadJob(2)]
    _, actions = decide(rec, read)
    assert acts(actions) == [Withdraw(2), SetWaiting(), Publish(), Wait()]


def test_waiting_node_already_announced_only_waits() -> None:
    rec = record(AgentState.WAITING, -1)
    new, actions = decide(rec, job_read(2, joins=("n2", "n3"), members=("n2", "n3"), waiting=("n1",)))
    assert acts(actions) == [Wait()]
    assert new == rec


# -- success ---------------------------------------------------------------------------------------


def test_group_succeeded_marks_done_and_publishes() -> None:
    read = job_read(2, joins=("n1", "n2"), members=("n1", "n2"), counted=True)
    rec, actions = decide(record(AgentState.RUNNING, 2), read, local(SUCCEEDED))
    assert acts(actions) == [MarkDone(2), Publish()]
    assert rec.state is AgentState.DONE


@pytest.mark.parametrize("group", [SUCCEEDED, None], ids=["group", "reaped"])
def test_every_member_done_ends_the_job_succeeded(group: Group | None) -> None:
    read = job_read(2, joins=("n1", "n2"), members=("n1", "n2"), counted=True, done=("n1", "n2"))
    _, actions = decide(record(AgentState.DONE, 2), read, local(group))
    assert acts(actions) == [Finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, "")]


def test_last_member_to_finish_marks_done_then_ends_the_job() -> None:
    first = job_read(2, joins=("n1", "n2"), members=("n1", "n2"), counted=True, done=("n2",))
    then = job_read(2, joins=("n1", "n2"), members=("n1", "n2"), counted=True, done=("n1", "n2"))
    rec, (one, two) = run(record(AgentState.RUNNING, 2), first, then, here=local(SUCCEEDED))
    assert acts(one) == [MarkDone(2), Publish()]
    assert acts(two) == [Finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, "")]
    assert rec.state is AgentState.DONE


def test_done_member_waits_for_the_others_without_scaling_up() -> None:
    read = job_read(2, joins=("n1", "n2"), members=("n1", "n2"), counted=True, done=("n1",), waiting=("n3",))
    _, actions = decide(record(AgentState.DONE, 2), read, local(SUCCEEDED))
    assert acts(actions) == [Wait(on_exits=True)]


# -- the round moves on ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("grace_s", "stop"), [(None, 10.0), (3.0, 3.0)], ids=["spec-grace", "round-grace"])
def test_new_round_while_running_stops_workers_before_joining(grace_s: float | None, stop: float) -> None:
    read = job_read(2, joins=("n2",), reason=RoundReason.SCALE_UP, grace_s=grace_s)
    rec, actions = decide(record(AgentState.RUNNING, 1), read, local(RUNNING))
    assert actions == [WatchPeers(2, ()), StopWorkers(stop), ClearWaiting(), Join(2), Publish()]
    assert (rec.state, rec.joined_round, rec.round) == (AgentState.JOINING, 2, 1)


def test_done_node_is_stopping_when_the_round_moves_on() -> None:
    read = job_read(2, joins=("n2",))
    rec, actions = decide(record(AgentState.DONE, 1), read, local(None, lease=None))
    assert acts(actions) == [Wait()]
    assert rec.state is AgentState.STOPPING
    rec, actions = decide(record(AgentState.DONE, 1), read, local(SUCCEEDED))
    assert acts(actions) == [StopWorkers(10.0), ClearWaiting(), Join(2), Publish()]


def test_round_that_closed_before_we_read_it_restarts_our_workers_in_it() -> None:
    read = job_read(2, joins=("n1", "n2"), members=("n2", "n1"), grace_s=4.0, restarts=1)
    assert read.result is not None
    rec, actions = decide(record(AgentState.RUNNING, 1), read, local(RUNNING))
    assert actions == [
        WatchPeers(2, (member(read, "n2"),)),
        StopWorkers(4.0),
        StartWorkers(read.result.head(), member(read), 1),
        Publish(),
        Wait(on_exits=True),
    ]
    assert (rec.state, rec.round) == (AgentState.RUNNING, 2)


# -- stale, ended, invalid ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "group", "done"),
    [
        (AgentState.RUNNING, RUNNING, ()),
        (AgentState.DONE, SUCCEEDED, ("n1",)),
        (AgentState.DONE, None, ("n1",)),
    ],
    ids=["running", "done", "done-reaped"],
)
def test_a_read_of_the_round_we_ran_never_restarts_workers(
    state: AgentState, group: Group | None, done: tuple[str, ...]
) -> None:
    read = job_read(3, joins=("n1", "n2"), members=("n1", "n2"), done=done)
    rec, actions = decide(record(state, 3), read, local(group))
    assert writes(actions) == []
    assert acts(actions) == [Wait(on_exits=True)]
    assert (rec.state, rec.round) == (state, 3)


@pytest.mark.parametrize("final", [JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED])
def test_final_record_stops_workers_with_the_stop_grace_and_exits(final: JobState) -> None:
    read = job_read(2, joins=("n1", "n2"), members=("n1", "n2"), final=final, grace_s=1.0)
    rec, actions = decide(record(AgentState.RUNNING, 2), read, local(RUNNING))
    assert actions == [WatchPeers(2, ()), StopWorkers(10.0), Exit("the job ended")]
    assert rec.state is AgentState.STOPPING


def test_final_record_even_beside_an_invalid_key_exits_with_no_workers_to_stop() -> None:
    read = job_read(2, members=("n2", "n3"), final=JobState.KILLED, invalid=True)
    _, actions = decide(record(AgentState.WAITING, -1), read)
    assert actions == [WatchPeers(2, ()), Exit("the job ended")]


@pytest.mark.parametrize(
    ("rec", "group"),
    [
        (record(AgentState.RUNNING, 1), failed(failure())),
        (record(AgentState.RUNNING, 1, ending=SetupFailure(EndReason.SPAWN_FAILED, "no fork")), None),
        (record(AgentState.RUNNING, 1, leave=DRAIN), RUNNING),
        (record(AgentState.DONE, 1), SUCCEEDED),
        (joining(1), None),
    ],
    ids=["failed", "ending", "leaving", "done", "leader"],
)
def test_invalid_record_without_final_waits_and_writes_nothing(rec: AgentRecord, group: Group | None) -> None:
    read = job_read(1, joins=("n1", "n2", "n3"), members=("n1", "n2"), done=("n1", "n2"), invalid=True)
    new, actions = decide(rec, read, local(group))
    assert actions == [WatchPeers(1, ()), Wait()]
    assert new == rec


# -- determinism -------------------------------------------------------------------------------------

_SNAPS: list[Callable[[], RostersRead]] = [
    lambda: job_read(1, joins=("n1", "n2")),
    lambda: job_read(1, joins=("n2", "n1"), members=("n1", "n2"), counted=True, waiting=("n3",)),
    lambda: job_read(1, joins=("n2",), members=("n1", "n2"), restarts=3, done=("n2",)),
    lambda: job_read(2, joins=("n2",), grace_s=2.0, left=("n3",)),
    lambda: job_read(1, members=("n1", "n2"), final=JobState.KILLED),
    lambda: job_read(1, members=("n1", "n2"), invalid=True),
]
_GROUPS = [None, RUNNING, SUCCEEDED, failed(failure()), failed(failure(oom=True))]


@pytest.mark.parametrize(
    ("rec", "view", "here"),
    [
        (joining(1), None, local()),
        (joining(1), Glance(1, False, True, "n2", True), local()),
        (joining(1), Observed(_SNAPS[0](), ALL), local()),
        (record(AgentState.RUNNING, 1), Observed(_SNAPS[1](), ALL), local(failed(failure()))),
        (record(AgentState.RUNNING, 1, fenced=True), None, local(RUNNING, lease_valid=False)),
        (record(AgentState.RUNNING, 1, leave=DRAIN), Observed(_SNAPS[2](), ALL), local(RUNNING)),
        (record(AgentState.RUNNING, 1), None, local(RUNNING, etcd_error="down")),
    ],
    ids=["read", "glance", "leader", "failure", "fenced", "leave", "outage"],
)
def test_stepping_twice_on_the_same_inputs_gives_the_same_step(
    rec: AgentRecord, view: Observed | Glance | None, here: Local
) -> None:
    assert step(rec, view, here, NOW) == step(rec, view, here, NOW)


@settings(max_examples=150, deadline=None)
@given(
    state=st.sampled_from([s for s in AgentState if s is not AgentState.LEFT]),
    round_no=st.sampled_from([-1, 1, 2]),
    joined=st.sampled_from([-1, 1, 2]),
    flags=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
    group=st.sampled_from(_GROUPS),
    read=st.sampled_from(_SNAPS),
)
def test_step_is_a_pure_function_of_its_inputs(
    state: AgentState,
    round_no: int,
    joined: int,
    flags: tuple[bool, bool, bool, bool],
    group: Group | None,
    read: Callable[[], RostersRead],
) -> None:
    fenced, leaving, lease_valid, leading = flags
    rec = record(
        state, round_no, joined_round=joined, fenced=fenced, leading=leading, leave=DRAIN if leaving else None
    )
    view: RostersRead = read()
    before = copy.deepcopy(view)
    here = local(group, lease_valid=lease_valid)
    first = step(rec, Observed(view, ALL), here, NOW)
    assert first == step(rec, Observed(view, ALL), here, NOW)
    assert view == before  # the read is not changed

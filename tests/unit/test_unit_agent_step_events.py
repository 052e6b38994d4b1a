"""elasticd.agent.step on events in a running round: worker failures (the budget, OOM, a full log
disk, setup failures), lost members and scale-up, leaving (drains, daemon stops), fencing, and
an unreachable store."""

from __future__ import annotations

import pytest

from elasticd.agent.actions import (
    Bump,
    ClearWaiting,
    Exit,
    Finalize,
    Join,
    MarkLeft,
    Publish,
    ReadJob,
    Reassert,
    StartWorkers,
    StopWorkers,
    Wait,
    WatchJoins,
    WatchPeers,
    Withdraw,
)
from elasticd.agent.record import AgentState, Leave
from elasticd.agent.step import step
from elasticd.jobs.decider import Group
from elasticd.rendezvous.glance import Glance, Seen
from elasticd.rendezvous.model import Join as JoinRecord
from elasticd.rendezvous.model import RoundInfo
from elasticd.terms.state import EndReason, JobState, RoundReason, SetupFailure
from tests.agent_steps import (
    ALL,
    LEASE,
    NOW,
    RUNNING,
    SUCCEEDED,
    acts,
    cycle,
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
)

DRAIN = Leave(RoundReason.MEMBER_LEFT, "drained", 5.0)
STOP = Leave(RoundReason.MEMBER_LEFT, "daemon stopping", stopping=True)
DISK_FULL = SetupFailure(
    EndReason.LOG_DISK_FULL, "no space left for job logs in /var/log/elasticd on node n1"
)
NO_ENTRY = SetupFailure(EndReason.ENTRY_UNAVAILABLE, "/home/u/train.py: no such file")


# -- worker failures -----------------------------------------------------------------------------


@pytest.mark.parametrize("oom", [False, True], ids=["exit", "oom"])
def test_worker_failure_is_recorded_published_and_bumps_spending_guarded_by_the_revisions(oom: bool) -> None:
    why = failure(oom=oom)
    read = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True, restarts=1)
    rec, actions = decide(record(AgentState.RUNNING, 1), read, local(failed(why)))
    info = RoundInfo(
        2, RoundReason.WORKER_FAILED, NOW, (), why.summary(), why.to_json(), repeats=1, expect_members=True
    )
    assert actions == [WatchPeers(1, (member(read, "n2"),)), Publish(), Bump(Seen(101, 51, 1), info, True)]
    assert rec.failure == why


def test_worker_failure_already_recorded_bumps_again_without_publishing_again() -> None:
    """A pass cut short (the bump could not reach the store) is simply done again."""
    why = failure()
    read = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True)
    rec, first = decide(record(AgentState.RUNNING, 1), read, local(failed(why)))
    rec, again = decide(rec, read, local(failed(None)))  # described once: the executor asks no more
    assert acts(first)[1:] == acts(again)
    assert isinstance(acts(again)[0], Bump)


@pytest.mark.parametrize(("oom", "code"), [(False, EndReason.WORKER_FAILED), (True, EndReason.OOM)])
def test_worker_failure_with_no_restarts_left_ends_the_job(oom: bool, code: EndReason) -> None:
    why = failure(oom=oom)
    read = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True, restarts=3)
    _, actions = decide(record(AgentState.RUNNING, 1), read, local(failed(why)))
    reason = f"{why.summary()}; no restarts left (3 of 3 used)"
    assert acts(actions) == [Publish(), Finalize(JobState.FAILED, code, reason, why.to_json())]


@pytest.mark.parametrize("group", [failed(failure()), None], ids=["failed", "stopped"])
def test_failure_while_the_next_round_fills_stops_and_joins_without_another_bump(group: Group | None) -> None:
    rec = record(AgentState.RUNNING, 1, failure=failure())
    read = job_read(2, joins=("n2",), reason=RoundReason.WORKER_FAILED, restarts=1)
    new, actions = decide(rec, read, local(group))
    stop = [StopWorkers(10.0)] if group is not None else []
    assert acts(actions) == [*stop, ClearWaiting(), Join(2), Publish()]
    assert (new.state, new.joined_round) == (AgentState.JOINING, 2)


def test_full_log_disk_ends_the_job_with_its_own_code_until_the_job_has_ended() -> None:
    why = failure()
    running = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True)
    ended = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True, final=JobState.FAILED)
    here = local(failed(why, disk_full=DISK_FULL))
    rec, (first, again, last) = run(record(AgentState.RUNNING, 1), running, running, ended, here=here)
    finalize = Finalize(JobState.FAILED, EndReason.LOG_DISK_FULL, DISK_FULL.message)
    assert acts(first) == [Publish(), finalize]
    assert acts(again) == [finalize]  # no restart can help: never a bump
    assert last == [WatchPeers(1, ()), StopWorkers(10.0), Exit("the job ended")]
    assert (rec.ending, rec.failure) == (DISK_FULL, why)


def test_setup_failure_ends_the_job_with_its_code_until_it_has_ended_and_never_bumps() -> None:
    read = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True, restarts=0)
    assert read.result is not None
    rec, actions = decide(joining(1), read)
    assert StartWorkers(read.result.head(), member(read), 0) in actions  # ... and it raised SetupFailure
    rec, asked = step(rec, None, local(setup_failed=NO_ENTRY), NOW)
    assert asked == [ReadJob(1)]
    assert rec.ending is NO_ENTRY
    finalize = Finalize(JobState.FAILED, EndReason.ENTRY_UNAVAILABLE, NO_ENTRY.message)
    ended = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True, final=JobState.FAILED)
    rec, passes = run(rec, read, read, ended)
    assert passes == [
        [WatchPeers(1, ()), finalize],
        [WatchPeers(1, ()), finalize],
        [WatchPeers(1, ()), Exit("the job ended")],
    ]


# -- members -----------------------------------------------------------------------------------------


def test_lost_member_bumps_member_lost_spending_a_restart() -> None:
    read = job_read(1, joins=("n1", "n3"), members=("n1", "n2", "n3"))
    _, actions = decide(record(AgentState.RUNNING, 1), read, local(RUNNING), frozenset({"n1", "n3", "n4"}))
    info = RoundInfo(2, RoundReason.MEMBER_LOST, NOW, (), "lost node(s) n2", expect_members=True)
    assert acts(actions) == [Bump(Seen(101, 50, 0), info, True)]


def test_lost_member_with_no_restarts_left_ends_the_job_nodes_lost() -> None:
    read = job_read(1, joins=("n1", "n3"), members=("n1", "n2", "n3"), restarts=3)
    _, actions = decide(record(AgentState.RUNNING, 1), read, local(RUNNING))
    reason = "lost node(s) n2; no restarts left (3 of 3 used)"
    assert acts(actions) == [Finalize(JobState.FAILED, EndReason.NODES_LOST, reason)]


def test_counted_read_with_fewer_joins_than_members_reads_the_joins_then_bumps() -> None:
    counted = job_read(1, joins=("n1", "n3"), members=("n1", "n2", "n3"), counted=True)
    full = job_read(1, joins=("n1", "n3"), members=("n1", "n2", "n3"))
    rec = record(AgentState.RUNNING, 1)
    rec, actions = decide(rec, counted, local(RUNNING))
    assert acts(actions) == [ReadJob(None, rosters=True)]
    _, actions = decide(rec, full, local(RUNNING))
    assert [type(a) for a in acts(actions)] == [Bump]


def test_member_that_finished_is_not_lost_when_its_join_is_gone() -> None:
    read = job_read(1, joins=("n1",), members=("n1", "n2"), done=("n2",))
    _, actions = decide(record(AgentState.RUNNING, 1), read, local(RUNNING))
    assert acts(actions) == [Wait(on_exits=True)]


def test_live_waiting_newcomer_below_max_bumps_scale_up_without_spending() -> None:
    read = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True, waiting=("n3",), restarts=3)
    _, actions = decide(record(AgentState.RUNNING, 1), read, local(RUNNING))
    info = RoundInfo(2, RoundReason.SCALE_UP, NOW, ("n3",), "node(s) n3 waiting", expect_members=True)
    assert acts(actions) == [Bump(Seen(101, 53, 3), info, False)]


@pytest.mark.parametrize(
    ("members", "waiting", "done", "alive"),
    [
        (("n1", "n2"), ("n3",), ("n2",), ALL),  # a member finished: the job is ending
        (("n1", "n2", "n3"), ("n4",), (), ALL),  # at MAX
        (("n1", "n2"), ("n3",), (), frozenset({"n1", "n2"})),  # the newcomer's lease is gone
        (("n1", "n2"), ("n2",), (), ALL),  # a member's stale waiting key
    ],
    ids=["done", "at-max", "not-alive", "member"],
)
def test_no_scale_up(
    members: tuple[str, ...], waiting: tuple[str, ...], done: tuple[str, ...], alive: frozenset[str]
) -> None:
    read = job_read(1, joins=members, members=members, counted=True, waiting=waiting, done=done)
    _, actions = decide(record(AgentState.RUNNING, 1), read, local(RUNNING), alive)
    assert acts(actions) == [Wait(on_exits=True)]


# -- leaving on purpose ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("leave", "grace"), [(DRAIN, 5.0), (STOP, 10.0)], ids=["drain-grace", "spec-grace"])
def test_leave_while_running_bumps_member_left_for_free_then_stops_and_marks_left(
    leave: Leave, grace: float
) -> None:
    read = job_read(1, joins=("n1", "n2", "n3"), members=("n1", "n2", "n3"), counted=True, restarts=3)
    rec, actions = decide(record(AgentState.RUNNING, 1, leave=leave), read, local(RUNNING))
    info = RoundInfo(
        2, RoundReason.MEMBER_LEFT, NOW, (), leave.detail, None, leave.grace_s, expect_members=True
    )
    assert acts(actions) == [
        Bump(Seen(101, 53, 3), info, False),
        StopWorkers(grace),
        MarkLeft(2),
        Exit("left the job"),
    ]
    assert rec.state is AgentState.STOPPING


def test_leave_while_the_round_fills_withdraws_then_marks_left_of_that_round() -> None:
    """Withdrawn before ``left``: the nodes ``left`` wakes see who leads without us."""
    read = job_read(2, joins=("n2", "n1"), drains=("n1",))
    _, actions = decide(joining(2, ran=1, leave=DRAIN), read)
    assert actions == [WatchPeers(2, ()), Withdraw(2), MarkLeft(2), Exit("left the job")]


def test_the_leader_of_a_filling_round_that_leaves_drops_its_join_watch_and_withdraws() -> None:
    read = job_read(2, joins=("n1", "n2"), drains=("n1",))
    _, actions = decide(joining(2, ran=1, leading=True, leave=DRAIN), read, following(2))
    assert actions == [WatchPeers(2, ()), WatchJoins(None), Withdraw(2), MarkLeft(2), Exit("left the job")]


def test_drain_while_the_round_was_already_bumped_does_not_bump_again() -> None:
    read = job_read(2, joins=("n2",), reason=RoundReason.WORKER_FAILED, restarts=1)
    _, actions = decide(record(AgentState.RUNNING, 1, leave=DRAIN), read, local(RUNNING))
    assert acts(actions) == [StopWorkers(5.0), MarkLeft(2), Exit("left the job")]


def test_lost_node_during_a_leave_is_covered_by_the_free_member_left_bump() -> None:
    read = job_read(1, joins=("n1", "n2"), members=("n1", "n2", "n3"), restarts=3)
    _, actions = decide(
        record(AgentState.RUNNING, 1, leave=DRAIN), read, local(RUNNING), frozenset({"n1", "n2"})
    )
    info = RoundInfo(2, RoundReason.MEMBER_LEFT, NOW, (), "drained", None, 5.0, expect_members=True)
    assert acts(actions) == [
        Bump(Seen(101, 53, 3), info, False),
        StopWorkers(5.0),
        MarkLeft(2),
        Exit("left the job"),
    ]


def test_waiting_node_leaves_without_bumping() -> None:
    read = job_read(1, joins=("n2", "n3"), members=("n2", "n3"), waiting=("n1",))
    _, actions = decide(record(AgentState.WAITING, -1, leave=DRAIN), read)
    assert acts(actions) == [MarkLeft(2), Exit("left the job")]


def test_leave_after_the_round_closed_with_us_but_before_our_workers_started_bumps_member_left() -> None:
    read = job_read(2, joins=("n1", "n2"), members=("n1", "n2"))
    _, actions = decide(joining(2, ran=1, leave=DRAIN), read)
    info = RoundInfo(3, RoundReason.MEMBER_LEFT, NOW, (), "drained", None, 5.0, expect_members=True)
    assert acts(actions) == [Bump(Seen(102, 50, 0), info, False), MarkLeft(3), Exit("left the job")]


# -- fencing ------------------------------------------------------------------------------------------


def test_fence_stops_workers_at_once_then_lease_back_reads_then_reports_the_fenced_round_once() -> None:
    read = job_read(1, joins=("n2", "n3"), members=("n1", "n2", "n3"))
    rec = record(AgentState.RUNNING, 1, fenced=True)
    rec, actions = step(rec, None, local(RUNNING, lease=None, lease_valid=False), NOW)
    assert actions == [StopWorkers(0.0), Wait()]
    assert (rec.state, rec.fenced, rec.fenced_round) == (AgentState.STOPPING, True, 1)
    same, actions = step(rec, None, local(None, lease=None, lease_valid=False), NOW)
    assert (same, actions) == (rec, [Wait()])
    rec, actions = step(rec, None, local(None), NOW)
    assert actions == [ReadJob(None)]
    assert (rec.fenced, rec.fenced_round) == (False, 1)
    rec, actions = decide(rec, read, local(None))
    info = RoundInfo(2, RoundReason.MEMBER_LOST, NOW, (), "node n1 was fenced", expect_members=True)
    assert acts(actions) == [Bump(Seen(101, 50, 0), info, True)]
    _, again = decide(rec, read, local(None))
    assert acts(again) == acts(actions)  # the round has not moved (the bump was cut short): ask again
    moved = job_read(2, joins=("n2", "n3"))
    _, actions = decide(rec, moved, local(None))
    assert not any(isinstance(a, Bump) for a in actions)  # once the round moved, never again


def test_fence_seen_with_the_lease_valid_again_stops_workers_and_reads() -> None:
    rec, actions = step(record(AgentState.RUNNING, 2, fenced=True), None, local(RUNNING), NOW)
    assert actions == [StopWorkers(0.0), ReadJob(None)]
    assert (rec.fenced, rec.fenced_round, rec.state) == (False, 2, AgentState.STOPPING)


def test_group_failed_while_the_lease_is_invalid_is_a_fence_not_a_failure() -> None:
    read = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True)
    rec, actions = decide(record(AgentState.RUNNING, 1), read, local(failed(failure()), lease_valid=False))
    assert actions == [WatchPeers(1, (member(read, "n2"),))]  # nothing else: step again at once
    assert (rec.fenced, rec.failure) == (True, None)
    rec, actions = step(rec, None, local(failed(None), lease_valid=False), NOW)
    assert actions == [StopWorkers(0.0), Wait()]
    assert rec.fenced_round == 1


def test_single_node_job_ignores_the_fence_a_failure_is_a_failure() -> None:
    job = spec("1:1")
    why = failure()
    read = job_read(1, job=job, joins=("n1",), members=("n1",), counted=True)
    rec, actions = decide(record(AgentState.RUNNING, 1, job=job), read, local(failed(why), lease_valid=False))
    info = RoundInfo(
        2, RoundReason.WORKER_FAILED, NOW, (), why.summary(), why.to_json(), repeats=1, expect_members=True
    )
    assert actions == [WatchPeers(1, ()), Publish(), Bump(Seen(101, 50, 0), info, True)]
    assert (rec.fenced, rec.failure) == (False, why)


# -- an unreachable store -------------------------------------------------------------------------------


def test_etcd_error_waits_to_retry_and_notes_when_the_outage_began_once() -> None:
    rec, actions = step(record(AgentState.RUNNING, 1), None, local(RUNNING, etcd_error="down"), NOW)
    assert actions == [Wait(NOW + 1.0)]
    assert rec.etcd_down_since == NOW
    rec, actions = step(rec, None, local(RUNNING, etcd_error="still down"), NOW + 5.0)
    assert actions == [Wait(NOW + 6.0)]
    assert rec.etcd_down_since == NOW


@pytest.mark.parametrize(
    ("state", "group"),
    [(AgentState.RUNNING, RUNNING), (AgentState.RUNNING, failed(failure())), (AgentState.DONE, SUCCEEDED)],
    ids=["running", "failed", "done"],
)
def test_outage_alone_never_stops_workers_and_the_read_after_it_clears_the_outage(
    state: AgentState, group: Group
) -> None:
    rec, actions = step(record(state, 1), None, local(group, etcd_error="down"), NOW)
    assert actions == [Wait(NOW + 1.0)]
    assert rec.state is state
    done = ("n1",) if state is AgentState.DONE else ()
    read = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True, done=done)
    rec, actions = cycle(rec, read, local(group), now=NOW + 30.0)
    assert not any(isinstance(a, StopWorkers) for a in actions)
    assert rec.etcd_down_since is None


def test_outage_while_leaving_stops_workers_and_exits() -> None:
    rec, actions = step(
        record(AgentState.RUNNING, 1, leave=STOP), None, local(RUNNING, etcd_error="down"), NOW
    )
    assert actions == [StopWorkers(10.0), Exit("the store is unreachable while leaving")]
    assert (rec.state, rec.etcd_down_since) == (AgentState.STOPPING, NOW)


def test_outage_while_draining_stops_workers_with_the_drains_grace_and_stays_to_be_heard() -> None:
    rec, actions = step(
        record(AgentState.RUNNING, 1, leave=DRAIN), None, local(RUNNING, etcd_error="down"), NOW
    )
    assert actions == [StopWorkers(5.0), Wait(NOW + 1.0)]  # a drained node keeps its lease
    rec, actions = step(rec, None, local(None), NOW + 1.0)  # the store is back: the leave path
    assert actions == [ReadJob(None)]


def test_quiet_glance_after_an_outage_clears_it() -> None:
    rec = joining(2, etcd_down_since=NOW - 30.0)
    new, actions = step(rec, Glance(2, False, False, "n2", True), local(), NOW)
    assert actions == [Wait()]
    assert new.etcd_down_since is None


# -- a round whose only member is this node: no fence, re-asserted under a new lease ------------------
OLD_LEASE = 1111
SOLO_JOIN = JoinRecord("n1", "h-n1", 29510, 2)  # as the result recorded it (tests.agent_steps.result)


@pytest.mark.parametrize("nnodes", ["1:1", "1:3"], ids=["single-node", "may-grow"])
def test_only_member_runs_on_through_a_lost_lease_and_is_not_fenced(nnodes: str) -> None:
    job = spec(nnodes)
    read = job_read(1, job=job, joins=("n1",), members=("n1",))
    rec, actions = decide(joining(1, job=job, lease=OLD_LEASE), read, local(None, lease=OLD_LEASE))
    assert rec.solo and not rec.fenceable and any(isinstance(a, StartWorkers) for a in actions)
    # The lease is lost and not yet granted again (etcd is down, or the daemon was frozen).
    rec, actions = step(rec, None, local(RUNNING, lease=None, lease_valid=False, etcd_error="down"), NOW)
    assert actions == [Wait(NOW + 1.0)]
    rec, actions = decide(
        rec, job_read(1, job=job, members=("n1",), counted=True), local(RUNNING, lease=None)
    )
    assert acts(actions) == [ReadJob(rosters=True)] and rec.state is AgentState.RUNNING  # nothing re-put yet


def test_only_member_reasserts_its_join_and_status_under_a_new_lease_once() -> None:
    job = spec("1:1")
    rec = record(AgentState.RUNNING, 1, job=job, solo=True, lease=OLD_LEASE)
    # etcd is back: the old lease still holds our join (it expires a TTL later), the new one exists.
    read = job_read(1, job=job, joins=("n1",), members=("n1",), counted=True)
    rec, actions = cycle(rec, read, local(RUNNING))
    assert acts(actions) == [Reassert(1, SOLO_JOIN), Publish(), Wait(on_exits=True)]
    assert (rec.lease, rec.round, rec.state) == (LEASE, 1, AgentState.RUNNING)
    _, again = cycle(rec, read, local(RUNNING))
    assert acts(again) == [Wait(on_exits=True)]  # once


def test_only_member_whose_join_expired_reasserts_it_then_reads_it_back() -> None:
    job = spec("1:1")
    rec = record(AgentState.RUNNING, 1, job=job, solo=True, lease=OLD_LEASE)
    gone = job_read(1, job=job, members=("n1",), counted=True)  # the old lease expired with the join
    rec, actions = cycle(rec, gone, local(RUNNING))
    assert acts(actions) == [Reassert(1, SOLO_JOIN), Publish(), ReadJob(rosters=True)]
    back = job_read(1, job=job, joins=("n1",), members=("n1",))
    _, actions = decide(rec, back, local(RUNNING))
    assert acts(actions) == [Wait(on_exits=True)]
    # Under the same lease, a join found missing (on a full read) is put back too.
    _, actions = decide(rec, job_read(1, job=job, members=("n1",)), local(RUNNING))
    assert acts(actions) == [Reassert(1, SOLO_JOIN), Publish(), Wait(on_exits=True)]


def test_only_member_of_a_job_that_may_grow_reasserts_then_scales_up_for_a_waiting_newcomer() -> None:
    job = spec("1:3")
    rec = record(AgentState.RUNNING, 1, job=job, solo=True, lease=OLD_LEASE)
    read = job_read(1, job=job, joins=("n1",), members=("n1",), counted=True, waiting=("n2",))
    _, actions = cycle(rec, read, local(RUNNING))
    info = RoundInfo(2, RoundReason.SCALE_UP, NOW, ("n2",), "node(s) n2 waiting", expect_members=True)
    assert acts(actions) == [Reassert(1, SOLO_JOIN), Publish(), Bump(Seen(101, 50, 0), info, False)]


def test_only_member_whose_round_moved_on_meanwhile_takes_the_normal_path() -> None:
    job = spec("1:1")
    rec = record(AgentState.RUNNING, 1, job=job, solo=True, lease=OLD_LEASE)
    moved = job_read(2, job=job, reason=RoundReason.MEMBER_LOST)
    rec, actions = cycle(rec, moved, local(RUNNING))
    assert acts(actions) == [StopWorkers(10.0), ClearWaiting(), Join(2), Publish()]
    assert (rec.solo, rec.lease, rec.state) == (False, LEASE, AgentState.JOINING)


def test_member_of_a_round_with_peers_never_reasserts_it_is_fenced() -> None:
    rec = record(AgentState.RUNNING, 1, lease=OLD_LEASE)  # the 2:3 job, its round with n2
    assert rec.fenceable
    read = job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True)
    _, actions = cycle(rec, read, local(RUNNING))
    assert not any(isinstance(a, Reassert) for a in actions)


def test_a_gpu_failure_leaves_the_job_with_its_own_reason_and_spends_no_restart() -> None:
    """A member whose GPU went unhealthy leaves as a drained one does: the others go on, the
    round says why (``gpu_failed``), and the budget is untouched even when it is spent."""
    gpu = Leave(RoundReason.GPU_FAILED, "GPU unhealthy on n1 (GPU-1: Xid 79)")
    read = job_read(1, joins=("n1", "n2", "n3"), members=("n1", "n2", "n3"), counted=True, restarts=3)
    _, actions = decide(record(AgentState.RUNNING, 1, leave=gpu), read, local(RUNNING))
    info = RoundInfo(2, RoundReason.GPU_FAILED, NOW, (), gpu.detail, None, None, expect_members=True)
    bump = acts(actions)[0]
    assert isinstance(bump, Bump) and bump.info == info and bump.spend is False
    assert acts(actions)[-2:] == [MarkLeft(2), Exit("left the job")]
    assert not RoundReason.GPU_FAILED.spends_budget

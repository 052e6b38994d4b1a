"""elasticd.agent.step: the leader's join watch. Only a round's leader is told of joins (no
daemon's own watch carries them): it follows its round's joins from when it finds it leads an
open round, and drops them when the round closes, the job ends, or it leaves or stops leading."""

from __future__ import annotations

import pytest

from elasticd.agent.actions import ClaimLead, CloseRound, ReadJob, Wait, WatchJoins, WatchPeers
from elasticd.agent.step import step
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.glance import Glance
from elasticd.rendezvous.jobread import RostersRead
from elasticd.terms.state import JobState
from tests.agent_steps import ME, NOW, OPENED_AT, acts, decide, following, job_read, joining, local

LEAD = 10  # the leader's join's create revision (``agent_steps.job_read``): the round's epoch


def test_the_oldest_join_follows_its_rounds_joins_as_it_starts_leading() -> None:
    read = job_read(1, joins=("n1", "n2"))
    mine = read.current_joins[0]
    rec, actions = decide(joining(1), read)
    claim = ClaimLead(1, mine.create_revision, mine.lease)  # its join's lease, not the one held now
    assert actions == [WatchPeers(1, ()), WatchJoins(1), claim, Wait(NOW + 2.0, batch=True)]
    assert rec.leading


def test_a_leader_claims_its_round_once_the_lead_key_names_it_and_not_when_it_closes_now() -> None:
    _, actions = decide(joining(1), job_read(1, joins=("n1", "n2"), lead=ME))
    assert not [a for a in actions if isinstance(a, ClaimLead)]
    full = job_read(1, joins=("n1", "n2", "n3"))  # at most 3: it closes at once, no claim first
    _, actions = decide(joining(1), full)
    assert [type(a).__name__ for a in actions if isinstance(a, (ClaimLead, CloseRound))] == ["CloseRound"]
    _, actions = decide(joining(1), job_read(1, joins=("n2", "n1")))  # n2 leads: no claim of ours
    assert not [a for a in actions if isinstance(a, ClaimLead)]


def test_a_leader_already_following_its_round_asks_for_no_watch() -> None:
    _, actions = decide(joining(1, leading=True), job_read(1, joins=("n1", "n2")), following(1))
    assert not [a for a in actions if isinstance(a, WatchJoins)]


@pytest.mark.parametrize("followed", [None, 1], ids=["not-following", "following"])
def test_a_non_leader_follows_no_joins(followed: int | None) -> None:
    here = local(joins_followed=followed)
    _, actions = decide(joining(1, leading=followed is not None), job_read(1, joins=("n2", "n1")), here)
    assert acts(actions) == ([WatchJoins(None)] if followed is not None else []) + [Wait()]


def test_a_leader_still_following_an_older_rounds_joins_moves_to_its_own() -> None:
    _, actions = decide(joining(2, ran=1), job_read(2, joins=("n1",), lead=ME), following(1))
    assert acts(actions) == [WatchJoins(2), Wait(OPENED_AT + 60.0, batch=True)]


@pytest.mark.parametrize(
    "read",
    [
        job_read(1, joins=("n1", "n2"), members=("n1", "n2")),  # the round closed
        job_read(1, joins=("n1", "n2"), members=("n1", "n2"), counted=True),  # ... read as a member
        job_read(1, joins=("n1", "n2"), final=JobState.KILLED),  # the job ended
        job_read(1, joins=("n1", "n2"), invalid=True),  # a bad record: the job ends
        job_read(2, joins=("n2",)),  # the round moved on (our join is not in it)
    ],
    ids=["closed", "closed-counted", "ended", "invalid", "moved-on"],
)
def test_the_join_watch_goes_once_we_do_not_lead_an_open_round(read: RostersRead) -> None:
    _, actions = decide(joining(1, leading=True), read, following(1))
    assert actions[1] == WatchJoins(None)
    assert WatchJoins(None) not in decide(joining(1, leading=True), read)[1]  # nothing to drop


def test_a_leader_without_a_lease_follows_no_joins() -> None:
    _, actions = decide(joining(1, leading=True), job_read(1, joins=("n1", "n2")), local(lease=None))
    assert not [a for a in actions if isinstance(a, WatchJoins)]


def test_the_next_oldest_join_takes_over_when_the_leader_is_gone_and_reads_before_it_leads() -> None:
    """n2 led round 2 and died (its join and ``nodes/`` record went with its lease; the latter is
    what wakes us: we are told of no join). Our glance names us the oldest: we read the whole job,
    follow the joins from then on, and close at once, since every expected live node is in."""
    rec = joining(2, ran=1)
    assert step(rec, Glance(2, False, False, "n2", True), local(), NOW) == (rec, [Wait()])
    assert step(rec, Glance(2, False, False, ME, True), local(), NOW) == (rec, [ReadJob(None)])
    read = job_read(2, joins=("n1", "n3"), expect=("n2", "n1", "n3"), previous=("n2", "n1", "n3"))
    new, actions = decide(rec, read, alive=frozenset({"n1", "n3"}))
    n1, n3 = read.current_joins
    closed = rdzv.build_result(2, [n1, n3], NOW, LEAD)
    assert actions == [WatchPeers(2, ()), WatchJoins(2), CloseRound(closed, "every expected node rejoined")]
    assert new.leading

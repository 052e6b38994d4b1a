"""The agent's decisions, as one pure function: ``step(record, view, local, now)``.

Given what the agent remembers (``AgentRecord``), what it just read (``View``, or None before a
read), what this node knows (``Local``) and the time, ``step`` returns the next record and the
actions to carry out (``elasticd.agent.actions``). It does no I/O and reads no clock, so every
interleaving can be driven by unit and property tests; ``elasticd.agent.executor`` runs it.
Its working state decides here what to read, and joining, leading and leaving a round; what a
member does while its round runs is ``agent.supervision``, the reachability rules ``agent.stepbase``.

The rules are the round protocol of docs/architecture.md:
- a node joins an open round, the oldest join leads it and closes it (``rendezvous.decider``),
  with the joiners it can reach (``agent.stepbase``: a node cut from its peers is left out);
- members run their workers; any member that sees an event (a failure, a lost member, a waiting
  newcomer) bumps the round once by compare-and-swap, or ends the job when the budget is spent;
- workers are stopped before the node joins the next round, and a leaving node reports ``left``;
- a fenced node (lost lease) stops its multi-node workers before anything else and comes back
  as a newcomer; a failure that is not the job's fault ends the job with its own code;
- a round whose only member is this node is not fenced: its workers run on through an outage or
  a lost lease, and the node re-asserts its join and status under its new lease.
"""

from __future__ import annotations

from elasticd.agent import blame
from elasticd.agent.actions import (
    Action,
    ClaimLead,
    ClearWaiting,
    Exit,
    Finalize,
    Join,
    MarkLeft,
    Publish,
    ReadGlance,
    ReadJob,
    SetWaiting,
    StartWorkers,
    Wait,
    WatchJoins,
    Withdraw,
)
from elasticd.agent.record import AgentRecord, AgentState, Local, Observed, View
from elasticd.agent.supervision import SupervisingStep, whole
from elasticd.jobs.decider import Group, GroupOutcome
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.glance import Glance
from elasticd.rendezvous.jobread import AgentRead, RostersRead
from elasticd.rendezvous.model import RoundHead
from elasticd.terms.state import EndReason, JobState, RoundReason

ETCD_RETRY_S = 1.0
EXPECT_EXTRA_S = 2.0  # beyond the stop grace, for an expected node to rejoin a round


def step(rec: AgentRecord, view: View | None, local: Local, now: float) -> tuple[AgentRecord, list[Action]]:
    """One decision. ``view`` is None before a read: the step then says what to read (or acts on
    what needs no read: a fence, an unreachable store)."""
    s = _Step(rec, local, now)
    if view is None or rec.fenced:  # a fence since the read: stop first, read again later
        s.before_read()
    elif isinstance(view, Glance):
        s.after_glance(view)
    else:
        s.decide(view)
    return s.rec, s.actions


class _Step(SupervisingStep):
    """The working state of one call of ``step`` (it never outlives the call)."""

    # -- before a read ---------------------------------------------------------------------------
    def before_read(self) -> None:
        rec, local = self.rec, self.local
        if local.setup_failed is not None and rec.ending is None:
            self._set(ending=local.setup_failed)
        if local.etcd_error is not None:
            if rec.etcd_down_since is None:
                self._set(etcd_down_since=self.now)
            if rec.leave is not None:
                grace = rec.leave.grace_s
                self._stop(grace if grace is not None else rec.spec.stop_grace_s)
                if rec.leave.stopping:  # nobody to tell, and our lease ends with the daemon
                    self._do(Exit("the store is unreachable while leaving"))
                    return
                # A drained node keeps its lease: its join would stay, so say we left once the
                # store is back (the normal leave path: a free bump, then ``left``).
            self._do(Wait(self.now + ETCD_RETRY_S))  # workers keep running meanwhile
            return
        if rec.fenced:
            if self.group is not None:
                self._set(part=self.rec.part.fenced_at(rec.round))
            self._stop(0.0)
            if not local.lease_valid:
                self._do(Wait())
                return
            self._set(part=self.rec.part.unfence())
        rec = self.rec
        if (
            rec.state is AgentState.JOINING
            and not rec.leading
            and rec.joined_round >= 0
            and rec.leave is None
        ):
            self._do(ReadGlance(rec.joined_round))  # a joined non-leader only waits: O(1) reads
            return
        running = rec.state in (AgentState.RUNNING, AgentState.DONE) and rec.round >= 0
        # A round's leader reads the rounds whole (the previous one's members); a member, its own.
        self._do(ReadJob(rec.round if running else None, rosters=rec.leading))

    def after_glance(self, glance: Glance) -> None:
        self._set(etcd_down_since=None)
        rec = self.rec
        if glance.quiet(rec.joined_round, rec.node):
            self._do(Wait())
            return
        closed = glance.closed and glance.round == rec.joined_round
        self._do(ReadJob(rec.joined_round if closed else None))

    # -- after a full read -----------------------------------------------------------------------
    def decide(self, seen: Observed) -> None:
        read = seen.read
        self._set(etcd_down_since=None)
        self._follow_peers(read)
        self._follow_joins(read)
        if read.final is None and read.invalid:
            # The janitor fails the job naming the bad key; act on nothing meanwhile, so that the
            # evidence stays until the final record is written.
            self._do(Wait())
            return
        mine = self.rec.failure or (self.group.failure if self.group is not None else None)
        amend = blame.amendment(read, mine)
        if amend is not None:
            self._do(amend)
        ending = self.rec.ending
        if ending is not None and not read.ended:
            self._do(Finalize(JobState.FAILED, ending.reason, ending.message))
            return
        if read.ended:
            self._stop(self.rec.spec.stop_grace_s)
            self._do(Exit("the job ended"))
            return
        if self.rec.leave is not None:
            self._leave_job(read, seen.alive)
            return
        closed = read.closed
        if closed is None:
            self._stop(self.rec.grace(read))  # the round moved on: stop before joining
            self._open_round(read, seen.alive)
            return
        me = read.me(self.rec.node)
        if me is None:
            self._outside_running_round(read, closed, seen.alive)
            return
        if self.rec.fenced_round == read.current:
            # Our workers of this round were fenced: the round cannot go on without them. (Until
            # the round moves, this is asked again: a bump cut short by an outage is retried.)
            self._event(read, RoundReason.MEMBER_LOST, f"node {self.rec.node} was fenced")
            return
        if self.rec.round != read.current:
            if self.group is not None or self.rec.state is AgentState.DONE:
                self._stop(self.rec.grace(read))
            solo = closed.size == 1
            self._set(
                round=read.current, failure=None, state=AgentState.RUNNING, part=self.rec.part.started(solo)
            )
            self._do(StartWorkers(closed, me, read.restarts, blame.silence(read.round)), Publish())
            self._note(None)
            self.group = Group(GroupOutcome.RUNNING)
        self._reassert(read, closed, me)
        self._supervise(read, closed, seen.alive)

    def _follow_joins(self, read: AgentRead) -> None:
        """While we lead a round that is still open, follow its joins (no other watch carries
        them). A node that becomes the oldest join starts here, from the read it just made;
        a watch that broke or failed to open is asked for again (``Local.joins_followed``)."""
        rec, joins = self.rec, read.current_joins
        open_ = read.closed is None and not read.ended and rec.leave is None
        leads = open_ and self.local.lease is not None and rdzv.leader(joins) == rec.node
        want = read.current if leads else None
        if want != self.local.joins_followed:
            self._do(WatchJoins(want))

    def _open_round(self, read: AgentRead, alive: frozenset[str]) -> None:
        info = read.round
        assert info is not None  # a job without one is invalid, and handled before
        rec = self.rec
        if self.local.lease is None:
            self._do(Wait())
            return
        joins = read.current_joins
        if rec.node not in {j.node for j in joins}:
            if self.now < rec.rejoin_at:
                self._do(Wait(rec.rejoin_at))
                return
            self._set(state=AgentState.JOINING, joined_round=info.round, lease=self.local.lease)
            self._do(ClearWaiting(), Join(info.round), Publish())
            return
        names = tuple(j.node for j in joins)
        if names != rec.seen_joins:
            self._set(seen_joins=names, last_join_at=self.now)
        self._set(part=self.rec.part.lead(rdzv.leader(joins) == rec.node))
        if not self.rec.leading:
            self._do(Wait())
            return
        if read.previous_head is not None and not isinstance(read, RostersRead):
            self._do(ReadJob(rosters=True))  # the previous round's members: whom to expect, in which order
            return
        previous = read.previous_result if isinstance(read, RostersRead) else None
        spec = rec.spec
        decision = rdzv.decide_close(
            info,
            joins,
            alive,
            spec.nnodes,
            now=self.now,
            last_join_at=self.rec.last_join_at,
            last_call_s=spec.last_call_s,
            join_timeout_s=spec.join_timeout_s,
            expect_grace_s=rec.grace(read) + EXPECT_EXTRA_S,
            left=read.left.get(info.round, frozenset()),
            running=read.may_still_run if isinstance(read, RostersRead) else frozenset(),
            expect=rdzv.expected(info, previous),
        )
        if decision.verdict is rdzv.Close.NOW:
            self._close(read, info, decision.why, previous)
        elif decision.verdict is rdzv.Close.FAIL:
            self._do(Finalize(JobState.FAILED, EndReason.JOIN_TIMEOUT, decision.why))
        else:
            self._claim_lead(read, info.round)
            self._do(Wait(decision.recheck_at, batch=True))

    def _claim_lead(self, read: AgentRead, round_no: int) -> None:
        """While the round stays open under us, say so in the lead key that waiting members'
        glances read (one key, where the oldest join is a sort of every join); again after each
        read that finds it gone (our join was put again)."""
        node = self.rec.node
        if read.leads.get(round_no) != node:
            mine = next(j for j in read.current_joins if j.node == node)
            self._do(ClaimLead(round_no, mine.create_revision, mine.lease))

    def _outside_running_round(self, read: AgentRead, closed: RoundHead, alive: frozenset[str]) -> None:
        """The round runs without us: wait to join at the next one if the job can grow."""
        rec = self.rec
        self._stop(rec.grace(read))
        # (A joiner that read this round's joins only counted knows it joined from its record.)
        if rec.joined_round == read.current or rec.node in {j.node for j in read.current_joins}:
            self._do(Withdraw(read.current))
        if closed.size >= rec.spec.nnodes.max:
            self._do(Exit("the job runs with every node it can use", "agent.not_needed"))
            return
        if self.local.lease is not None and rec.node not in read.waiting:
            self._set(state=AgentState.WAITING)
            result = whole(read)
            if result is None:
                self._do(ReadJob(rosters=True))  # the members, to probe each before asking in
                return
            if not self._ready(read, result, alive):
                return
            self._do(SetWaiting(), Publish())
        self._do(Wait())

    def _leave_job(self, read: AgentRead, alive: frozenset[str]) -> None:
        """Leave on purpose: open the next round without us (no restart is spent), then stop our
        workers with everyone else's, gracefully. Below MIN, the next round waits for a node (up
        to the join timeout); a single-node job resumes when its node comes back."""
        leave = self.rec.leave
        assert leave is not None
        closed = read.closed
        next_round = read.current + 1
        if closed is not None and read.me(self.rec.node) is not None:
            self._event(read, leave.reason, leave.detail, grace_s=leave.grace_s)
        elif closed is None:
            next_round = read.current  # the round is still filling: it must not wait for us
            if self.rec.node in {j.node for j in read.current_joins}:
                # Withdraw before ``left``: the nodes ``left`` wakes then see who leads without
                # us (only the leader's watch carries joins, and we may be that leader).
                self._do(Withdraw(read.current))
        self._stop(leave.grace_s if leave.grace_s is not None else self.rec.spec.stop_grace_s)
        self._do(MarkLeft(next_round), Exit("left the job"))

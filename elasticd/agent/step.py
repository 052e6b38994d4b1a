"""The agent's decisions, as one pure function: ``step(record, view, local, now)``.

Given what the agent remembers (``AgentRecord``), what it just read (``View``, or None before a
read), what this node knows (``Local``) and the time, ``step`` returns the next record and the
actions to carry out (``elasticd.agent.actions``). It does no I/O and reads no clock, so every
interleaving can be driven by unit and property tests; ``elasticd.agent.executor`` runs it.

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
    MarkDone,
    MarkLeft,
    Publish,
    ReadGlance,
    ReadSnapshot,
    Reassert,
    SetWaiting,
    StartWorkers,
    StopWorkers,
    Wait,
    WatchJoins,
    WatchPeers,
    Withdraw,
)
from elasticd.agent.nextround import bump_or_end
from elasticd.agent.record import AgentRecord, AgentState, Local, Observed, View
from elasticd.agent.stepbase import StepBase
from elasticd.jobs.decider import Group, GroupOutcome
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.glance import Glance
from elasticd.rendezvous.model import Join as JoinRecord
from elasticd.rendezvous.model import Member, RoundHead
from elasticd.rendezvous.snapshot import JobSnapshot
from elasticd.terms.state import EndReason, JobState, RoundReason, WorkerFailure

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


class _Step(StepBase):
    """The working state of one call of ``step`` (it never outlives the call)."""

    def __init__(self, rec: AgentRecord, local: Local, now: float) -> None:
        super().__init__(rec, local, now)
        self.group: Group | None = local.group  # our workers, as they will be after earlier actions

    def _stop(self, grace_s: float) -> None:
        """Stop our workers (if any); a node that was DONE is STOPPING too."""
        if self.group is None:
            if self.rec.state is AgentState.DONE:
                self._set(state=AgentState.STOPPING)
            return
        self._set(state=AgentState.STOPPING, part=self.rec.part.stopped())
        self._do(StopWorkers(grace_s))
        self.group = None

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
        self._do(ReadSnapshot(rec.round if running else None, rosters=rec.leading))

    def after_glance(self, glance: Glance) -> None:
        self._set(etcd_down_since=None)
        rec = self.rec
        if glance.quiet(rec.joined_round, rec.node):
            self._do(Wait())
            return
        closed = glance.closed and glance.round == rec.joined_round
        self._do(ReadSnapshot(rec.joined_round if closed else None))

    # -- after a full read -----------------------------------------------------------------------
    def decide(self, seen: Observed) -> None:
        snap = seen.snap
        self._set(etcd_down_since=None)
        self._follow_peers(snap)
        self._follow_joins(snap)
        if snap.final is None and snap.invalid:
            # The janitor fails the job naming the bad key; act on nothing meanwhile, so that the
            # evidence stays until the final record is written.
            self._do(Wait())
            return
        mine = self.rec.failure or (self.group.failure if self.group is not None else None)
        amend = blame.amendment(snap, mine)
        if amend is not None:
            self._do(amend)
        ending = self.rec.ending
        if ending is not None and not snap.ended:
            self._do(Finalize(JobState.FAILED, ending.reason, ending.message))
            return
        if snap.ended:
            self._stop(self.rec.spec.stop_grace_s)
            self._do(Exit("the job ended"))
            return
        if self.rec.leave is not None:
            self._leave_job(snap, seen.alive)
            return
        closed = snap.closed
        if closed is None:
            self._stop(self.rec.grace(snap))  # the round moved on: stop before joining
            self._open_round(snap, seen.alive)
            return
        me = snap.me(self.rec.node)
        if me is None:
            self._outside_running_round(snap, closed, seen.alive)
            return
        if self.rec.fenced_round == snap.current:
            # Our workers of this round were fenced: the round cannot go on without them. (Until
            # the round moves, this is asked again: a bump cut short by an outage is retried.)
            self._event(snap, RoundReason.MEMBER_LOST, f"node {self.rec.node} was fenced")
            return
        if self.rec.round != snap.current:
            if self.group is not None or self.rec.state is AgentState.DONE:
                self._stop(self.rec.grace(snap))
            solo = closed.size == 1
            self._set(
                round=snap.current, failure=None, state=AgentState.RUNNING, part=self.rec.part.started(solo)
            )
            self._do(StartWorkers(closed, me, snap.restarts, blame.silence(snap.round)), Publish())
            self._note(None)
            self.group = Group(GroupOutcome.RUNNING)
        self._reassert(snap, closed, me)
        self._supervise(snap, closed, seen.alive)

    def _reassert(self, snap: JobSnapshot, closed: RoundHead, me: Member) -> None:
        """The round's only member keeps it through a lost lease (an etcd outage past the TTL, a
        frozen daemon): there is no peer to split from, so nothing was fenced. Once a new lease
        exists, put our join and status of the round back under it, as the result recorded the
        join, so that the old lease's expiry takes nothing and the janitor, which gives a round's
        only member a grace to come back (``manager/janitor.py``), finds it. No restart, no bump.
        A round that moved on meanwhile takes the normal path before this is reached."""
        rec, lease = self.rec, self.local.lease
        if not rec.solo or lease is None or self.group is None or rec.state is not AgentState.RUNNING:
            return
        counted = snap.join_counts.get(snap.current)
        if counted is not None:
            missing = counted == 0
        else:
            missing = rec.node not in {j.node for j in snap.current_joins}
        if lease == rec.lease and not missing:
            return
        join = JoinRecord(
            me.node,
            me.address,
            closed.master_port,
            me.local_world_size,
            liveness_port=me.liveness_port,
            store=closed.agent_store,
        )
        self._set(lease=lease)
        self._do(Reassert(snap.current, join), Publish())

    def _follow_peers(self, snap: JobSnapshot) -> None:
        """While our workers run, watch our ring neighbours' daemons for a death."""
        node = self.rec.node
        running = self.group is not None and snap.me(node) is not None
        peers = snap.peers(node) if running and not snap.ended else ()
        self._do(WatchPeers(snap.current, peers))

    def _follow_joins(self, snap: JobSnapshot) -> None:
        """While we lead a round that is still open, follow its joins (no other watch carries
        them). A node that becomes the oldest join starts here, from the snapshot it just read;
        a watch that broke or failed to open is asked for again (``Local.joins_followed``)."""
        rec, joins = self.rec, snap.current_joins
        open_ = snap.closed is None and not snap.ended and rec.leave is None
        leads = open_ and self.local.lease is not None and rdzv.leader(joins) == rec.node
        want = snap.current if leads else None
        if want != self.local.joins_followed:
            self._do(WatchJoins(want))

    def _open_round(self, snap: JobSnapshot, alive: frozenset[str]) -> None:
        info = snap.round
        assert info is not None  # a job without one is invalid, and handled before
        rec = self.rec
        if self.local.lease is None:
            self._do(Wait())
            return
        joins = snap.current_joins
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
        if snap.previous_head is not None and not snap.rosters:
            self._do(
                ReadSnapshot(rosters=True)
            )  # the previous round's members: whom to expect, in which order
            return
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
            expect_grace_s=rec.grace(snap) + EXPECT_EXTRA_S,
            left=snap.left.get(info.round, set()),
            running=snap.may_still_run,
            expect=rdzv.expected(info, snap.previous_result),
        )
        if decision.verdict is rdzv.Close.NOW:
            self._close(snap, info, decision.why)
        elif decision.verdict is rdzv.Close.FAIL:
            self._do(Finalize(JobState.FAILED, EndReason.JOIN_TIMEOUT, decision.why))
        else:
            self._claim_lead(snap, info.round)
            self._do(Wait(decision.recheck_at, batch=True))

    def _claim_lead(self, snap: JobSnapshot, round_no: int) -> None:
        """While the round stays open under us, say so in the lead key that waiting members'
        glances read (one key, where the oldest join is a sort of every join); again after each
        read that finds it gone (our join was put again)."""
        node = self.rec.node
        if snap.leads.get(round_no) != node:
            mine = next(j for j in snap.current_joins if j.node == node)
            self._do(ClaimLead(round_no, mine.create_revision, mine.lease))

    def _outside_running_round(self, snap: JobSnapshot, closed: RoundHead, alive: frozenset[str]) -> None:
        """The round runs without us: wait to join at the next one if the job can grow."""
        rec = self.rec
        self._stop(rec.grace(snap))
        # (A joiner that read this round's joins only counted knows it joined from its record.)
        if rec.joined_round == snap.current or rec.node in {j.node for j in snap.current_joins}:
            self._do(Withdraw(snap.current))
        if closed.size >= rec.spec.nnodes.max:
            self._do(Exit("the job runs with every node it can use", "agent.not_needed"))
            return
        if self.local.lease is not None and rec.node not in snap.waiting:
            self._set(state=AgentState.WAITING)
            if snap.result is None:
                self._do(ReadSnapshot(rosters=True))  # the members, to probe each before asking in
                return
            if not self._ready(snap, snap.result, alive):
                return
            self._do(SetWaiting(), Publish())
        self._do(Wait())

    def _supervise(self, snap: JobSnapshot, closed: RoundHead, alive: frozenset[str]) -> None:
        """Act on our workers' exits and on the other members. Every write it asks for is safe to
        repeat, so a pass cut short by an unreachable store is simply done again."""
        rec = self.rec
        done = snap.done.get(snap.current, set())
        if self._on_exits(snap, alive, done):
            return
        if snap.all_done():
            self._do(Finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, ""))
            return
        counted = snap.join_counts.get(snap.current)
        if counted is None or counted < closed.size:  # a member's key may be gone
            result = snap.result
            if counted is not None or result is None:
                self._do(ReadSnapshot(rosters=True))  # read the joins and the members to know whose
                return
            present = {j.node for j in snap.current_joins}
            lost = [n for n in result.nodes if n not in present and n not in done and n != rec.node]
            if lost and set(lost) <= snap.left.get(snap.current, set()):
                # They left on purpose (a drain raced the close that named them): free.
                self._event(snap, RoundReason.MEMBER_LEFT, f"node(s) {', '.join(lost)} left")
                return
            if lost:
                self._event(snap, RoundReason.MEMBER_LOST, f"lost node(s) {', '.join(lost)}")
                return
        # A member cleared its own waiting note before it joined: a note is a newcomer's.
        members = set(snap.result.nodes) if snap.result is not None else {rec.node}
        newcomers = [n for n in snap.waiting if n in alive and n not in members]
        if newcomers and not done and closed.size < rec.spec.nnodes.max:
            detail = f"node(s) {', '.join(newcomers)} waiting"
            self._event(snap, RoundReason.SCALE_UP, detail, extra=tuple(newcomers))
            return
        self._do(Wait(on_exits=True))

    def _on_exits(self, snap: JobSnapshot, alive: frozenset[str], done: set[str]) -> bool:
        """Act on how our workers ended, if they did; True when that is this step's last word."""
        rec, group = self.rec, self.group
        if group is None or rec.state is AgentState.STOPPING:
            return False
        if group.outcome is GroupOutcome.FAILED:
            if rec.multi_node and not self.local.lease_valid:
                # Killed by the reaper's fence, not a failure of theirs. (Also for a round we
                # are the only member of: whether the reaper fences its workers is the
                # launcher's choice, and a failure seen exactly then costs a restart either way.)
                self._set(part=self.rec.part.fence())
                return True
            if rec.failure is None:
                self._set(failure=group.failure)
                self._do(Publish())
            if group.disk_full is not None:  # the likely cause, and a restart cannot help
                self._set(ending=group.disk_full)
                self._do(Finalize(JobState.FAILED, group.disk_full.reason, group.disk_full.message))
                return True
            failure = self.rec.failure
            summary = failure.summary() if failure is not None else "a worker failed"
            self._event(snap, RoundReason.WORKER_FAILED, summary, failure)
            return True
        if group.outcome is GroupOutcome.SUCCEEDED:
            self._set(state=AgentState.DONE)
            if rec.node not in done:
                self._do(MarkDone(snap.current), Publish())
                return True
        return False

    def _event(
        self,
        snap: JobSnapshot,
        reason: RoundReason,
        detail: str,
        failure: WorkerFailure | None = None,
        extra: tuple[str, ...] = (),
        grace_s: float | None = None,
    ) -> None:
        """Open the next round for ``reason`` or end the job (``nextround.bump_or_end``)."""
        self._do(bump_or_end(self.rec.spec, snap, self.now, reason, detail, failure, extra, grace_s))

    def _leave_job(self, snap: JobSnapshot, alive: frozenset[str]) -> None:
        """Leave on purpose: open the next round without us (no restart is spent), then stop our
        workers with everyone else's, gracefully. Below MIN, the next round waits for a node (up
        to the join timeout); a single-node job resumes when its node comes back."""
        leave = self.rec.leave
        assert leave is not None
        closed = snap.closed
        next_round = snap.current + 1
        if closed is not None and snap.me(self.rec.node) is not None:
            self._event(snap, leave.reason, leave.detail, grace_s=leave.grace_s)
        elif closed is None:
            next_round = snap.current  # the round is still filling: it must not wait for us
            if self.rec.node in {j.node for j in snap.current_joins}:
                # Withdraw before ``left``: the nodes ``left`` wakes then see who leads without
                # us (only the leader's watch carries joins, and we may be that leader).
                self._do(Withdraw(snap.current))
        self._stop(leave.grace_s if leave.grace_s is not None else self.rec.spec.stop_grace_s)
        self._do(MarkLeft(next_round), Exit("left the job"))

"""What a member does while its round runs: act on how its workers ended (a failure bumps the
round or ends the job, a success marks it done), on members lost or gone on purpose and on
newcomers waiting to be taken in; watch its ring neighbours' daemons; and, as the round's only
member, put its join back under a new lease. Every write it asks for is safe to repeat.

The second base of ``step``'s working state, over ``StepBase``: it also keeps our workers as
they will be after the actions asked so far (``group``), stops them, and turns an event into
the next round or the job's end (``nextround``). Pure, as ``step`` is: it only records what to do.
"""

from __future__ import annotations

from elasticd.agent.actions import (
    Finalize,
    MarkDone,
    Publish,
    ReadJob,
    Reassert,
    StopWorkers,
    Wait,
    WatchPeers,
)
from elasticd.agent.nextround import bump_or_end
from elasticd.agent.record import AgentRecord, AgentState, Local
from elasticd.agent.stepbase import StepBase
from elasticd.jobs.decider import Group, GroupOutcome
from elasticd.rendezvous.jobread import AgentRead, JobRead, RostersRead
from elasticd.rendezvous.model import Join as JoinRecord
from elasticd.rendezvous.model import Member, RoundHead, RoundResult
from elasticd.terms.state import EndReason, JobState, RoundReason, WorkerFailure


class SupervisingStep(StepBase):
    """What one call of ``step`` has decided so far, and our workers as it leaves them."""

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

    def _reassert(self, read: AgentRead, closed: RoundHead, me: Member) -> None:
        """The round's only member keeps it through a lost lease (an etcd outage past the TTL, a
        frozen daemon): there is no peer to split from, so nothing was fenced. Once a new lease
        exists, put our join and status of the round back under it, as the result recorded the
        join, so that the old lease's expiry takes nothing and the janitor, which gives a round's
        only member a grace to come back (``manager/janitor.py``), finds it. No restart, no bump.
        A round that moved on meanwhile takes the normal path before this is reached."""
        rec, lease = self.rec, self.local.lease
        if not rec.solo or lease is None or self.group is None or rec.state is not AgentState.RUNNING:
            return
        counted = read.join_counts.get(read.current)
        if counted is not None:
            missing = counted == 0
        else:
            missing = rec.node not in {j.node for j in read.current_joins}
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
        self._do(Reassert(read.current, join), Publish())

    def _follow_peers(self, read: AgentRead) -> None:
        """While our workers run, watch our ring neighbours' daemons for a death."""
        node = self.rec.node
        running = self.group is not None and read.me(node) is not None
        peers = read.peers(node) if running and not read.ended else ()
        self._do(WatchPeers(read.current, peers))

    def _supervise(self, read: AgentRead, closed: RoundHead, alive: frozenset[str]) -> None:
        """Act on our workers' exits and on the other members. Every write it asks for is safe to
        repeat, so a pass cut short by an unreachable store is simply done again."""
        rec = self.rec
        done = read.done_in(read.current)
        result = whole(read)
        if self._on_exits(read, alive, done):
            return
        if read.all_done():
            self._do(Finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, ""))
            return
        counted = read.join_counts.get(read.current)
        if counted is None or counted < closed.size:  # a member's key may be gone
            if counted is not None or result is None:
                self._do(ReadJob(rosters=True))  # read the joins and the members to know whose
                return
            present = {j.node for j in read.current_joins}
            lost = [n for n in result.nodes if n not in present and n not in done and n != rec.node]
            if lost and set(lost) <= read.left.get(read.current, frozenset()):
                # They left on purpose (a drain raced the close that named them): free.
                self._event(read, RoundReason.MEMBER_LEFT, f"node(s) {', '.join(lost)} left")
                return
            if lost:
                self._event(read, RoundReason.MEMBER_LOST, f"lost node(s) {', '.join(lost)}")
                return
        # A member cleared its own waiting note before it joined: a note is a newcomer's.
        members = set(result.nodes) if result is not None else {rec.node}
        newcomers = [n for n in read.waiting if n in alive and n not in members]
        if newcomers and not done and closed.size < rec.spec.nnodes.max:
            detail = f"node(s) {', '.join(newcomers)} waiting"
            self._event(read, RoundReason.SCALE_UP, detail, extra=tuple(newcomers))
            return
        self._do(Wait(on_exits=True))

    def _on_exits(self, read: AgentRead, alive: frozenset[str], done: frozenset[str]) -> bool:
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
            self._event(read, RoundReason.WORKER_FAILED, summary, failure)
            return True
        if group.outcome is GroupOutcome.SUCCEEDED:
            self._set(state=AgentState.DONE)
            if rec.node not in done:
                self._do(MarkDone(read.current), Publish())
                return True
        return False

    def _event(
        self,
        read: JobRead,
        reason: RoundReason,
        detail: str,
        failure: WorkerFailure | None = None,
        extra: tuple[str, ...] = (),
        grace_s: float | None = None,
    ) -> None:
        """Open the next round for ``reason`` or end the job (``nextround.bump_or_end``)."""
        self._do(bump_or_end(self.rec.spec, read, self.now, reason, detail, failure, extra, grace_s))


def whole(read: AgentRead) -> RoundResult | None:
    """The current round whole, when the read covered the rosters (``RostersRead``)."""
    return read.result if isinstance(read, RostersRead) else None

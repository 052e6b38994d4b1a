"""What the per-job agent remembers between steps, and what it is told by the node.

``AgentRecord`` is the agent's whole memory, frozen: each step returns a new one. ``Local`` is
what only this node knows when it steps (its lease, its workers, what an action just did);
``Observed`` is what it read from the store. Pure data: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from elasticd.etcd.keyref import Change, KeyKind
from elasticd.jobs.decider import Group
from elasticd.rendezvous.fitness import Checked
from elasticd.rendezvous.glance import Glance
from elasticd.rendezvous.jobread import AgentRead, JobRead, RostersRead
from elasticd.rendezvous.reach import Reach
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import RoundReason, SetupFailure, WorkerFailure


class AgentState(StrEnum):
    """This node's part in a job.

    JOINING  -> RUNNING   selected in the round's result
    JOINING  -> WAITING   the round closed without us and the job can grow
    JOINING  -> LEFT      the round closed without us and the job is full
    RUNNING  -> DONE      our workers all exited 0; waiting for the other members
    RUNNING  -> STOPPING  the round moved on, the job ended, we were fenced or are leaving
    DONE     -> STOPPING  (as RUNNING)
    STOPPING -> JOINING   the next round
    STOPPING -> LEFT      the job ended, or we left
    WAITING  -> JOINING   a round opened (scale-up)
    WAITING  -> LEFT      the job ended
    """

    JOINING = "JOINING"
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    DONE = "DONE"
    STOPPING = "STOPPING"
    LEFT = "LEFT"


@dataclass(frozen=True)
class Part:
    """This node's part beyond its ``AgentState``: three flags that hold in several states, so
    they are a sub-state beside it rather than more values of it (each step returns a new one).

    ``leading``: we lead the round being filled (the oldest join). Read only while JOINING.
      lead(x)      set from every read of the open round we joined (any state: a node that
                   joins again keeps its last value until it reads the round)
      withdrawn()  True -> False: a leader that cannot reach enough joiners hands the round on
    ``solo``: the workers we run are of a round whose only member is this node (never fenced).
      started(x)   our workers of a round start: x is whether we are its only member
      stopped()    -> False: our workers are stopped
    ``fenced``: our lease was lost while what we run has peers: stop first, rejoin as a newcomer.
      fence()      False -> True: the lease is lost (``JobAgent.fence``), or a failure is seen
                   while it is invalid (the reaper's fence killed our workers)
      fenced_at(r) while fenced, our workers of round r are stopped: report r once back
      unfence()    True -> False: the workers are stopped and the lease is valid again
    ``fenced_round`` is kept after ``unfence``: the step reports that round's loss once.
    """

    leading: bool = False
    solo: bool = False
    fenced: bool = False
    fenced_round: int = -1

    def lead(self, leads: bool) -> Part:
        return replace(self, leading=leads)

    def withdrawn(self) -> Part:
        return replace(self, leading=False)

    def started(self, solo: bool) -> Part:
        return replace(self, solo=solo)

    def stopped(self) -> Part:
        return replace(self, solo=False)

    def fence(self) -> Part:
        return replace(self, fenced=True)

    def fenced_at(self, round_no: int) -> Part:
        if not self.fenced:
            raise ValueError("only a fenced part stops its workers for the fence")
        return replace(self, fenced_round=round_no)

    def unfence(self) -> Part:
        if not self.fenced:
            raise ValueError("only a fenced part is unfenced")
        return replace(self, fenced=False)


@dataclass(frozen=True)
class Leave:
    """A request to leave the job on purpose (daemon stop, drain)."""

    reason: RoundReason
    detail: str
    grace_s: float | None = None
    stopping: bool = False  # the daemon stops (its lease ends with it), rather than a drain


@dataclass(frozen=True)
class AgentRecord:
    """The agent's memory. ``round`` is the round whose workers it runs (or ran).

    Its state is ``state`` (``AgentState``) with ``part`` (``Part``: leading, solo, fenced); the
    other fields are what it remembers (rounds, times, a failure, a pending leave or ending).
    """

    spec: JobSpec
    node: str
    state: AgentState = AgentState.JOINING
    round: int = -1
    failure: WorkerFailure | None = None
    part: Part = field(default_factory=Part)
    lease: int | None = None  # the lease our join (and status) of our round were last put under
    leave: Leave | None = None
    joined_round: int = -1
    seen_joins: tuple[str, ...] = ()
    last_join_at: float = 0.0
    etcd_down_since: float | None = None
    ending: SetupFailure | None = None  # the job must end for a reason not its own: say so until it has
    rejoin_at: float = 0.0  # withdrew as a leader that cannot reach its peers: not before this
    note: str | None = None  # the pending note we published last (why we wait)

    @property
    def fenced(self) -> bool:
        """Our lease was lost: stop multi-node workers, rejoin as a newcomer."""
        return self.part.fenced

    @property
    def fenced_round(self) -> int:
        """The round whose workers a fence stopped: reported once back."""
        return self.part.fenced_round

    @property
    def solo(self) -> bool:
        """The workers we run are of a round whose only member is this node."""
        return self.part.solo

    @property
    def leading(self) -> bool:
        """Whether we lead the round being filled."""
        return self.part.leading

    @property
    def multi_node(self) -> bool:
        return self.spec.nnodes.max > 1

    @property
    def fenceable(self) -> bool:
        """Whether a lost lease must stop what we run. Only when peers exist: a round whose only
        member is this node cannot split, so its workers run on through an outage or a lost lease
        and the node re-asserts its part under its new lease (see ``step``)."""
        return self.multi_node and not self.solo

    def woken_by(self, change: Change) -> bool:
        """Whether a change of the job's keys can matter to this agent. Statuses and notes never
        do (no watch carries them: they are parts, ``Keys.watched``; this holds should one);
        other nodes' joins only to a round's leader (only its watch carries them, and one that
        arrives as it stops leading is dropped): that keeps a round's cost per participant
        constant instead of linear in the number of nodes."""
        if change.kind in (KeyKind.NODE_STATUS, KeyKind.PENDING):
            return False
        joining = self.state is AgentState.JOINING and not self.leading
        return not (change.kind is KeyKind.JOIN and not change.deleted and joining)

    def grace(self, read: JobRead) -> float:
        """How long workers get between SIGTERM and SIGKILL when the round moves on."""
        if read.round is not None and read.round.grace_s is not None:
            return read.round.grace_s
        return self.spec.stop_grace_s


@dataclass(frozen=True)
class Local:
    """What this node knows when it steps, and what the last actions reported."""

    lease: int | None = None
    lease_valid: bool = True
    group: Group | None = None  # None: no workers of ours exist
    setup_failed: SetupFailure | None = None  # starting our workers failed (not the job's fault)
    etcd_error: str | None = None  # the last action could not reach the store
    joins_followed: int | None = None  # the round whose joins our watch follows (None: none)
    reach: Reach | None = None  # what our last probe of peers' liveness ports found
    checked: Checked | None = None  # what our last node check of the joiners' links found


@dataclass(frozen=True)
class Observed:
    """A full read: the job as read and, of the nodes ``presence_asked(read)`` names, those
    whose presence in the job (under their lease) is there."""

    read: AgentRead
    alive: frozenset[str] = field(default_factory=frozenset)


def presence_asked(read: AgentRead) -> frozenset[str] | None:
    """The nodes whose liveness ``step`` asks about after reading ``read`` (None: every node of
    the job). It asks about the waiting nodes (a scale-up takes only live ones) and the newcomers
    a round names (its leader waits only for live ones); about the members of a round only from a
    read of the rosters (the next round's leader: whom to expect; a node outside the round: whom
    to probe), which is O(N) already. So a member's read in a running round asks about no one,
    usually, and costs O(1), not a read of every member's presence; a member's loss reaches it
    through the job's presence watch (``manager/presence.py``)."""
    if isinstance(read, RostersRead):
        return None
    expect = read.round.expect if read.round is not None else ()
    return frozenset(read.waiting).union(expect)


View = Observed | Glance

"""The closed set of actions a step can return; ``elasticd.agent.executor`` carries them out.

Reads are actions too: a step that needs to know more returns ``ReadGlance`` or ``ReadJob``
and is called again with what was read. A list of actions ends with ``Wait`` (until woken),
``Exit`` (done with the job), a read, or nothing (step again at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from elasticd.progress.goodput import Silence
from elasticd.rendezvous.fitness import CheckTarget
from elasticd.rendezvous.glance import Seen
from elasticd.rendezvous.model import FinalRecord, Member, RoundHead, RoundInfo, RoundResult
from elasticd.rendezvous.model import Join as JoinRecord
from elasticd.rendezvous.reach import Target
from elasticd.terms.state import EndReason, JobState


@dataclass(frozen=True)
class ReadGlance:
    """Read the small view of round ``round`` that a joined non-leader needs."""

    round: int


@dataclass(frozen=True)
class ReadJob:
    """Read the job (round ``counted``'s joins only counted) and the live nodes: its own
    assignment of the current round (``MemberRead``), or with ``rosters`` every round whole
    (``RostersRead``: a round's leader, a node outside a running round, a member that lost a
    peer)."""

    counted: int | None = None
    rosters: bool = False


@dataclass(frozen=True)
class Wait:
    """Sleep until woken, until ``until`` (wall clock), or (``on_exits``) a worker exits."""

    until: float | None = None
    on_exits: bool = False
    batch: bool = False  # let joins that arrive together be read together first


@dataclass(frozen=True)
class Exit:
    """This node is done with the job: the executor stops what runs and cleans its keys up."""

    why: str = ""
    event: str = "agent.exit"  # the log event that says so


@dataclass(frozen=True)
class StopWorkers:
    grace_s: float


@dataclass(frozen=True)
class StartWorkers:
    """Start our workers of ``result``'s round as ``member``; ``restarts`` spent so far."""

    result: RoundHead
    member: Member
    restarts: int
    silence: Silence | None = None  # the hang that opened the round (``blame.silence``)


@dataclass(frozen=True)
class Publish:
    """Write this node's part of the job (state, round, pids, failure) under our lease."""


@dataclass(frozen=True)
class Join:
    round: int


@dataclass(frozen=True)
class Reassert:
    """Put our join of round ``round`` back, as its result recorded it, under our current lease:
    the round's only member keeps its place through a lost lease (no restart, no bump)."""

    round: int
    join: JoinRecord


@dataclass(frozen=True)
class Withdraw:
    round: int


@dataclass(frozen=True)
class ClaimLead:
    """Say that we lead round ``round`` (``JobStore.claim_lead``): the read that decided it
    showed our join (created at ``epoch``, under ``lease``) the oldest. Waiting members' glances
    then read that one key instead of sorting every join. The write is guarded by that join and
    put under its lease, not under whatever lease we hold now: it must die with the join."""

    round: int
    epoch: int
    lease: int


@dataclass(frozen=True)
class SetWaiting:
    pass


@dataclass(frozen=True)
class ClearWaiting:
    pass


@dataclass(frozen=True)
class Probe:
    """Try a connect to each of ``targets`` (node, address, liveness port) of round ``round``, at
    once, each for at most ``PROBE_TIMEOUT_S``; what it found is the next steps' ``Local.reach``."""

    round: int
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class CheckNodes:
    """Measure the link to each of ``targets`` (node, address, check port) of round ``round``
    (``--node-check``: latency and bandwidth, by a process of the job's user, within
    ``fitness.PROBE_DEADLINE_S``); what it found is the next steps' ``Local.checked``."""

    round: int
    targets: tuple[CheckTarget, ...]


@dataclass(frozen=True)
class NotePending:
    """Publish why this node waits (None: clear it), in the job's pending notes (``status``)."""

    note: str | None


@dataclass(frozen=True)
class CloseRound:
    result: RoundResult
    why: str
    # The round it closes, for the log (how long the rendezvous took, and why it was opened).
    opened: RoundInfo | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Bump:
    seen: Seen
    info: RoundInfo
    spend: bool


@dataclass(frozen=True)
class Amend:
    """Rewrite the round's or the final record (``record``) if it is still at ``seen_mod``: this
    node's failure came first and the record must name it (the root cause by time, across nodes)."""

    seen_mod: int
    record: RoundInfo | FinalRecord


@dataclass(frozen=True)
class Finalize:
    state: JobState
    code: EndReason
    reason: str
    failure: dict[str, Any] | None = None


@dataclass(frozen=True)
class MarkDone:
    round: int


@dataclass(frozen=True)
class MarkLeft:
    round: int


@dataclass(frozen=True)
class WatchPeers:
    """Watch these members' daemons for a death while our workers of ``round`` run."""

    round: int
    peers: tuple[Member, ...]


@dataclass(frozen=True)
class WatchJoins:
    """Follow round ``round``'s joins as they arrive (None: none). Only a round's leader needs
    them, and no other watch carries them (``Keys.watched``); once the watch exists the agent
    is woken, to read what came before it."""

    round: int | None


Action = (
    ReadGlance
    | ReadJob
    | Wait
    | Exit
    | StopWorkers
    | StartWorkers
    | Publish
    | Join
    | Reassert
    | Withdraw
    | ClaimLead
    | SetWaiting
    | ClearWaiting
    | Probe
    | CheckNodes
    | NotePending
    | CloseRound
    | Bump
    | Amend
    | Finalize
    | MarkDone
    | MarkLeft
    | WatchPeers
    | WatchJoins
)

# Our marks in the job's records, carried out as they are (``JobAgent._mark``).
Mark = Withdraw | ClaimLead | ClearWaiting | MarkDone | MarkLeft

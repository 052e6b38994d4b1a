"""Rendezvous records as they are stored in etcd (JSON), one dataclass each.

Each record is read with ``elasticd.decode`` (types from the hints, extra checks in
``__post_init__``, from ``fieldchecks``): etcd is shared, and a record that would make a member
crash, or run workers with a nonsensical world, must be refused where it is read. The same checks
run when the daemon builds a record itself, so it never writes what it would refuse to read.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from elasticd.decode import DecodeError, decode
from elasticd.progress.goodput import Mark, Tally
from elasticd.progress.slowness import MAX_TRACKED as MAX_STRAGGLERS
from elasticd.progress.slowness import RankScore
from elasticd.progress.tracker import MAX_RANK, RankProgress
from elasticd.rendezvous.fieldchecks import (
    check_address,
    check_failure,
    check_grace,
    check_node,
    check_node_part,
    check_port,
    check_time,
    need,
)
from elasticd.terms.ids import MAX_ROUND
from elasticd.terms.spec import MAX_NODES, MAX_NPROC_PER_NODE
from elasticd.terms.state import EndReason, JobState, RoundReason

MAX_MEMBERS = MAX_NODES
MAX_EXPECT = 128  # newcomers a round names to wait for (``RoundInfo.expect``): the record stays small


@dataclass(frozen=True)
class RoundInfo:
    """Value of ``jobs/<job>/round``; only ever advanced by compare-and-swap."""

    round: int
    reason: RoundReason
    opened_at: float  # wall clock; the join timeout counts from here
    # Newcomers the round waits for before it may close early (at most MAX_EXPECT: more close at
    # last call); with ``expect_members``, the previous round's live members too, which its leader
    # reads from that round's assignments (so the record does not grow with the job).
    expect: tuple[str, ...] = ()
    detail: str = ""  # human-readable cause, e.g. the first failure's summary
    failure: dict[str, Any] | None = None  # the WorkerFailure that opened it, if any
    grace_s: float | None = None  # SIGTERM -> SIGKILL for the previous round's workers (drain --grace)
    repeats: int = 0  # rounds in a row, this one included, opened by the same failure (see rootcause)
    expect_members: bool = False

    def __post_init__(self) -> None:
        need(0 <= self.round <= MAX_ROUND, f"round must be 0..{MAX_ROUND}, got {self.round}")
        need(0 <= self.repeats <= MAX_ROUND, f"repeats must be 0..{MAX_ROUND}, got {self.repeats}")
        need(len(self.expect) <= MAX_EXPECT, f"expect names at most {MAX_EXPECT} nodes")
        check_time("opened_at", self.opened_at)
        for node in self.expect:
            check_node("expect", node)
        check_grace(self.grace_s)
        check_failure(self.failure)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["reason"] = self.reason.value
        out["expect"] = list(self.expect)
        return out

    @classmethod
    def from_json(cls, data: Any) -> RoundInfo:
        return decode(cls, data)


@dataclass(frozen=True)
class Join:
    """Value of ``parts/<job>/<round>/join/<node>``, held under the node's lease."""

    node: str
    address: str
    port: int  # a free port on that node: MASTER_PORT if the node becomes group rank 0
    local_world_size: int
    create_revision: int = 0  # from etcd, not stored: orders the joins
    lease: int = 0  # from etcd, not stored: the node's lease
    liveness_port: int = 0  # the node's liveness listener (see elasticd.node.liveness)
    store: bool = False  # a store host of the job listens on ``port`` (``jobs.agentstore``)
    # With --node-check: the node's check server (0: none started) and its compute figure
    # (``rendezvous.fitness``); None: no figure (no check, or it did not start).
    check_port: int = 0
    compute: float | None = None

    def __post_init__(self) -> None:
        check_node_part(self.node, self.address, self.liveness_port, self.local_world_size)
        check_port("port", self.port)
        need(0 <= self.check_port <= 65535, "check_port must be 0..65535")
        if self.compute is not None:
            need(math.isfinite(self.compute) and 0 <= self.compute <= 1e15, "compute must be a figure")

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "address": self.address,
            "port": self.port,
            "local_world_size": self.local_world_size,
            "liveness_port": self.liveness_port,
            "store": self.store,
        } | ({"check_port": self.check_port, "compute": self.compute} if self.check_port else {})

    @classmethod
    def from_json(cls, data: Any, create_revision: int = 0, lease: int = 0) -> Join:
        """The stored join; its revision and lease come from etcd, whatever the value says."""
        join = decode(cls, data)
        return replace(join, create_revision=create_revision, lease=lease)


@dataclass(frozen=True)
class Member:
    node: str
    address: str
    group_rank: int
    rank_offset: int  # global rank of this node's local rank 0
    local_world_size: int
    liveness_port: int = 0

    def __post_init__(self) -> None:
        check_node_part(self.node, self.address, self.liveness_port, self.local_world_size)


@dataclass(frozen=True)
class RoundResult:
    """A closed round whole: every member in rank order. Held in memory only (the leader builds
    it; ``status`` and the next leader assemble it from the round's head and assignments,
    ``elasticd.rendezvous.roster``): stored as one value it would grow with the job."""

    round: int
    members: tuple[Member, ...]
    world_size: int
    master_addr: str
    master_port: int
    closed_at: float = 0.0
    epoch: int = 0  # the leader's join's create_revision: ties the head to its assignments
    agent_store: bool = False  # group rank 0's node hosts the store: TORCHELASTIC_USE_AGENT_STORE
    nodes: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        """Every member computes its ranks from this record: it must describe one world exactly
        (group ranks 0..n-1 in order, rank offsets adding up, one entry per node)."""
        object.__setattr__(self, "nodes", tuple(m.node for m in self.members))
        need(0 <= self.round <= MAX_ROUND, f"round must be 0..{MAX_ROUND}, got {self.round}")
        need(bool(self.members), "a result has at least one member")
        need(len(set(self.nodes)) == len(self.nodes), "a node is listed twice among the members")
        offset = 0
        for i, m in enumerate(self.members):
            need(m.group_rank == i, f"members[{i}] has group_rank {m.group_rank}, not {i}")
            need(m.rank_offset == offset, f"members[{i}] has rank_offset {m.rank_offset}, not {offset}")
            offset += m.local_world_size
        need(self.world_size == offset, f"world_size is {self.world_size}, the members add up to {offset}")
        need(self.master_addr == self.members[0].address, "master_addr is not group rank 0's address")
        check_port("master_port", self.master_port)
        check_time("closed_at", self.closed_at)

    @property
    def size(self) -> int:
        return len(self.members)

    def member(self, node: str) -> Member | None:
        return next((m for m in self.members if m.node == node), None)

    def head(self) -> RoundHead:
        """What every node reads of the round: its size, world and master, not its members."""
        return RoundHead(
            self.round,
            self.epoch,
            len(self.members),
            self.world_size,
            self.master_addr,
            self.master_port,
            self.closed_at,
            self.agent_store,
        )


@dataclass(frozen=True)
class RoundHead:
    """Value of ``jobs/<job>/rdzv/<round>/result``: a closed round, as every node reads it, in a
    few hundred bytes whatever its size. Written once, after every assignment of the round
    (``Assignment``) is in place, so a node that reads the head finds its own."""

    round: int
    epoch: int  # the leader's join's create_revision; its assignments carry the same
    size: int  # members (nodes)
    world_size: int
    master_addr: str
    master_port: int
    closed_at: float = 0.0
    agent_store: bool = False  # every rank is a client of a store hosted on the master's node

    def __post_init__(self) -> None:
        need(0 <= self.round <= MAX_ROUND, f"round must be 0..{MAX_ROUND}, got {self.round}")
        need(self.epoch >= 0, "epoch must be a revision")
        need(1 <= self.size <= MAX_MEMBERS, f"size must be 1..{MAX_MEMBERS}, got {self.size}")
        most = self.size * MAX_NPROC_PER_NODE
        need(self.size <= self.world_size <= most, f"world_size must be {self.size}..{most}")
        check_address("master_addr", self.master_addr)
        check_port("master_port", self.master_port)
        check_time("closed_at", self.closed_at)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> RoundHead:
        return decode(cls, data)


@dataclass(frozen=True)
class Assignment:
    """Value of ``rounds/<job>/<round>/<node>``: one member's part in a closed round (its ranks)
    and its ring neighbours (whose daemons it watches), written by the round's leader before the
    head. A member reads the head and this, O(1) bytes whatever the job's size."""

    round: int
    epoch: int  # the head's: an assignment left by a leader that did not close the round has another
    member: Member
    peers: tuple[Member, ...] = ()  # its neighbours in rank order (``decider.ring_neighbours``)

    def __post_init__(self) -> None:
        need(0 <= self.round <= MAX_ROUND, f"round must be 0..{MAX_ROUND}, got {self.round}")
        need(self.epoch >= 0, "epoch must be a revision")
        need(len(self.peers) <= 2, "an assignment names at most 2 peers")
        need(all(p.node != self.member.node for p in self.peers), "a node is not its own peer")

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "epoch": self.epoch,
            "member": asdict(self.member),
            "peers": [asdict(p) for p in self.peers],
        }

    @classmethod
    def from_json(cls, data: Any) -> Assignment:
        return decode(cls, data)


# -- the end, and per-node marks -------------------------------------------------------------------
@dataclass(frozen=True)
class FinalRecord:
    """Value of ``jobs/<job>/final``: how the job ended, written once."""

    state: JobState
    reason: str
    code: EndReason
    failure: dict[str, Any] | None = None
    ended_at: float = 0.0

    def __post_init__(self) -> None:
        need(self.state.terminal, f"state must be SUCCEEDED, FAILED or KILLED, got {self.state.value}")
        check_time("ended_at", self.ended_at)
        check_failure(self.failure)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"state": self.state.value, "code": self.code.value}

    @classmethod
    def from_json(cls, data: Any) -> FinalRecord:
        return decode(cls, data)


@dataclass(frozen=True)
class DrainRecord:
    """Value of ``drain/<node>`` and ``jobs/<job>/drain/<node>``: an operator asked a node to leave."""

    grace_s: float | None = None  # SIGTERM -> SIGKILL for the node's workers; None: the job's own
    at: float = 0.0
    by: str = ""

    def __post_init__(self) -> None:
        check_grace(self.grace_s)
        check_time("at", self.at)
        need(len(self.by) <= 256, "by must be a user name")

    @classmethod
    def from_json(cls, data: Any) -> DrainRecord:
        return decode(cls, data)


@dataclass(frozen=True)
class _Stamp:
    at: float

    def __post_init__(self) -> None:
        check_time("at", self.at)


@dataclass(frozen=True)
class WaitingRecord(_Stamp):
    """Value of ``jobs/<job>/waiting/<node>``: the node wants to join the running job."""


@dataclass(frozen=True)
class DoneRecord(_Stamp):
    """Value of ``jobs/<job>/rdzv/<r>/done/<node>``: the node's workers all exited 0."""


@dataclass(frozen=True)
class LeadRecord(_Stamp):
    """Value of ``parts/<job>/<r>/lead/<node>``: the node leads round r, its join the oldest
    (``epoch``: that join's create revision, which the key's write was guarded by)."""

    epoch: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch <= 0:
            raise DecodeError("epoch", "must be a revision (a positive integer)")


@dataclass(frozen=True)
class LeftRecord(_Stamp):
    """Value of ``jobs/<job>/rdzv/<r>/left/<node>``: the node stopped and will not join round r."""


_STATE = re.compile(r"^[A-Z][A-Z_]{0,31}$")
_DEVICES = re.compile(r"^[0-9A-Za-z,._-]{0,4096}$")  # GPU indices and MIG UUIDs (CUDA_VISIBLE_DEVICES)


@dataclass(frozen=True)
class NodeStatus:
    """Value of ``reports/<job>/<node>``: that node's part, as its agent last published it."""

    state: str  # an AgentState, or FAILED while a failed group awaits the next round
    round: int
    devices: str
    pids: tuple[int, ...]
    updated_at: float
    failure: dict[str, Any] | None = None
    progress: tuple[RankProgress, ...] = ()  # each local rank's reports (elasticd.progress)
    stragglers: tuple[int, ...] = ()  # the round's ranks this node (group rank 0's) names stragglers
    scores: tuple[RankScore, ...] = ()  # and every rank's score it judged by (aligned windows)
    goodput: Tally | None = None  # where the job's time went here since its submission (progress.goodput)
    ledger: Mark | None = None  # what the ledger picks up from after a daemon restart (progress.goodput)

    def __post_init__(self) -> None:
        need(bool(_STATE.match(self.state)), f"state must be an upper-case name, got {self.state[:40]!r}")
        need(len(self.progress) <= MAX_NPROC_PER_NODE, f"progress lists at most {MAX_NPROC_PER_NODE} ranks")
        need(len(self.stragglers) <= MAX_STRAGGLERS, f"stragglers lists at most {MAX_STRAGGLERS} ranks")
        need(all(0 <= r <= MAX_RANK for r in self.stragglers), "stragglers must be ranks")
        need(len(self.scores) <= MAX_STRAGGLERS, f"scores lists at most {MAX_STRAGGLERS} ranks")
        need(-1 <= self.round <= MAX_ROUND, f"round must be -1..{MAX_ROUND}, got {self.round}")
        need(bool(_DEVICES.match(self.devices)), "devices must be a list of device indices or MIG UUIDs")
        need(all(0 < p < 2**31 for p in self.pids), "pids must be process ids")
        check_time("updated_at", self.updated_at)
        check_failure(self.failure)

    @classmethod
    def from_json(cls, data: Any) -> NodeStatus:
        return decode(cls, data)


MAX_NOTE = 4096


def pending_note(data: Any) -> str:
    """Value of ``parts/<job>/pending/<node>``: why an allowed node cannot take part now (text)."""
    note = decode(str, data)
    if len(note) > MAX_NOTE:
        raise DecodeError("", f"a note is at most {MAX_NOTE} characters")
    return note

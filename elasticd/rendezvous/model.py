"""Rendezvous records as they are stored in etcd (JSON), one dataclass each."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class RoundReason(StrEnum):
    """Why a round was opened. Only failures spend the job-wide restart budget."""

    START = "start"  # the job was submitted
    WORKER_FAILED = "worker_failed"  # a worker exited non-zero or by a signal (spends)
    MEMBER_LOST = "member_lost"  # a member's lease expired or its daemon died (spends)
    SCALE_UP = "scale_up"  # a node is waiting to join a running job
    MEMBER_LEFT = "member_left"  # a member left on purpose (drain, daemon stop)

    @property
    def spends_budget(self) -> bool:
        return self in (RoundReason.WORKER_FAILED, RoundReason.MEMBER_LOST)


@dataclass(frozen=True)
class RoundInfo:
    """Value of ``jobs/<job>/round``; only ever advanced by compare-and-swap."""

    round: int
    reason: RoundReason
    opened_at: float  # wall clock; the join timeout counts from here
    expect: tuple[str, ...] = ()  # nodes the round waits for before it may close early
    detail: str = ""  # human-readable cause, e.g. the first failure's summary
    failure: dict[str, Any] | None = None  # the WorkerFailure that opened it, if any
    grace_s: float | None = None  # SIGTERM -> SIGKILL for the previous round's workers (drain --grace)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["reason"] = self.reason.value
        out["expect"] = list(self.expect)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundInfo:
        return cls(
            round=int(data["round"]),
            reason=RoundReason(data["reason"]),
            opened_at=float(data["opened_at"]),
            expect=tuple(data.get("expect", ())),
            detail=str(data.get("detail", "")),
            failure=data.get("failure"),
            grace_s=data.get("grace_s"),
        )


@dataclass(frozen=True)
class Join:
    """Value of ``jobs/<job>/rdzv/<round>/join/<node>``, held under the node's lease."""

    node: str
    address: str
    port: int  # a free port on that node: MASTER_PORT if the node becomes group rank 0
    local_world_size: int
    create_revision: int = 0  # from etcd, not stored: orders the joins
    lease: int = 0  # from etcd, not stored: the node's lease
    liveness_port: int = 0  # the node's liveness listener (see elasticd.node.liveness)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "address": self.address,
            "port": self.port,
            "local_world_size": self.local_world_size,
            "liveness_port": self.liveness_port,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], create_revision: int = 0, lease: int = 0) -> Join:
        return cls(
            data["node"],
            data["address"],
            int(data["port"]),
            int(data["local_world_size"]),
            create_revision,
            lease,
            int(data.get("liveness_port", 0)),
        )


@dataclass(frozen=True)
class Member:
    node: str
    address: str
    group_rank: int
    rank_offset: int  # global rank of this node's local rank 0
    local_world_size: int
    liveness_port: int = 0


@dataclass(frozen=True)
class RoundResult:
    """Value of ``jobs/<job>/rdzv/<round>/result``: written once, read identically by every member."""

    round: int
    members: tuple[Member, ...]
    world_size: int
    master_addr: str
    master_port: int
    closed_at: float = 0.0
    nodes: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(m.node for m in self.members))

    def member(self, node: str) -> Member | None:
        return next((m for m in self.members if m.node == node), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "members": [asdict(m) for m in self.members],
            "world_size": self.world_size,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "closed_at": self.closed_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundResult:
        return cls(
            round=int(data["round"]),
            members=tuple(Member(**m) for m in data["members"]),
            world_size=int(data["world_size"]),
            master_addr=str(data["master_addr"]),
            master_port=int(data["master_port"]),
            closed_at=float(data.get("closed_at", 0.0)),
        )

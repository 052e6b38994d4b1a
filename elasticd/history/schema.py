"""The ``events`` command's arguments and reply: part of the control protocol's schema
(``elasticd.wire`` lists the command), kept here to keep ``wire`` from growing.

Light on purpose (no etcd client, no zmq): clients import it through ``elasticd.wire``. No
``from __future__ import annotations`` (as in ``elasticd.wire``: TypedDicts read at run time).
"""

from dataclasses import dataclass
from typing import Any, TypedDict


@dataclass(frozen=True)
class EventsArgs:
    job: str | None = None  # only this job's events (None: every event the caller may read)
    after: int = 0  # only events after this sequence number: the previous reply's ``cursor``
    limit: int | None = None  # only the last N of them

    def __post_init__(self) -> None:
        if self.after < 0:
            raise ValueError(f"argument 'after' must be >= 0, got {self.after}")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"argument 'limit' must be >= 0, got {self.limit}")


class EventView(TypedDict):
    """One event of the cluster's history (``elasticd.history.model.ClusterEvent``)."""

    seq: int  # its place in the history: increases by one per event, cluster-wide
    happened_at: float
    kind: str  # submitted, joined, round, restart, worker_failed, hang, root_cause, succeeded,
    # failed, killed, left, drain, undrain, removed, node_up, node_down, lease_lost (more may come)
    job: str | None
    node: str | None  # the node it happened on or to
    message: str  # for people
    fields: dict[str, Any]  # its details (round, reason, cause, root_cause, ...): scalars


class SkippedEventView(TypedDict):
    key: str  # an event key that did not decode: not shown
    why: str


class EventsReply(TypedDict):
    events: list[EventView]  # oldest first; only those the caller may read
    cursor: int  # pass it back as ``after`` to get what follows
    skipped: list[SkippedEventView]

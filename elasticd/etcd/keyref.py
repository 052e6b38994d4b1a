"""What a key of the layout names, parsed (``KeyRef``), and a watch event routed (``Change``).

The kinds of key are the vocabulary of the layout (``elasticd.etcd.keys`` builds and parses
them); deciders and watchers match on these alone, without the codec. Pure: no etcd client.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class KeyKind(StrEnum):
    NODE = "node"  # nodes/<node>: read on demand, watched by none
    NODE_DRAIN = "node_drain"  # drain/<node>
    GPU = "gpu"  # gpus/<node>/<uuid>: a GPU out of the pool, and why (elasticd.manager.gpus)
    JANITOR = "janitor"  # janitor: the node that does cluster-wide clean-up
    SPEC = "spec"  # jobs/<job>/spec: the job's head (elasticd.terms.head)
    BODY = "body"  # specs/<job>: the job's full spec; outside jobs/, and outside the daemons' watch
    ROUND = "round"
    RESTARTS = "restarts"
    FINAL = "final"
    RESULT = "result"  # jobs/<job>/rdzv/<r>/result: the round's head (elasticd.rendezvous.roster)
    ASSIGNMENT = "assignment"  # rounds/<job>/<r>/<node>: one member's part; unwatched, like parts/
    PRESENCE = "presence"  # presence/<job>/<node>: under its lease; watched by the job's agents alone
    JOIN = "join"  # parts/<job>/<r>/join/<node>: outside the daemons' watch and the scan's read
    DONE = "done"  # parts/<job>/<r>/done/<node>: beside the joins, outside the watch and the scan
    LEAD = "lead"  # parts/<job>/<r>/lead/<node>: the round's leader says so (one key: an O(1) glance)
    LEFT = "left"
    WAITING = "waiting"  # jobs/<job>/waiting/<node>
    NODE_STATUS = "node_status"  # reports/<job>/<node>: unwatched, and outside the scan's read
    PENDING = "pending"  # notes/<job>/<node>: in the copy of every job; its news wakes no one
    JOB_DRAIN = "job_drain"  # jobs/<job>/drain/<node>
    EVENT = "event"  # events/...: the cluster's event history (elasticd.history.rings)
    EVENT_SEQ = "event_seq"  # event_seq: the last event's sequence number
    CHECK_REQUEST = "check_request"  # checks/<node>: an operator's ``check`` asks the node to serve one
    CHECK_ANSWER = "check_answer"  # checked/<node>: the node's check server (port) and compute figure


@dataclass(frozen=True)
class KeyRef:
    """A parsed key: its kind and the job, round and node it names (empty or None if none)."""

    kind: KeyKind
    job: str = ""
    round: int | None = None
    node: str = ""


@dataclass(frozen=True)
class Change:
    """A watch event, routed: the job it concerns (None: node-wide) and what changed.

    ``ref`` is None for a key of a job that does not parse: its job must still look (and fail)."""

    job: str | None
    ref: KeyRef | None
    deleted: bool

    @property
    def kind(self) -> KeyKind | None:
        return self.ref.kind if self.ref is not None else None

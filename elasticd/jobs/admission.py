"""Pure rule: should this node take part in a job it is not yet part of?"""

from __future__ import annotations

from dataclasses import dataclass

from elasticd.rendezvous.jobread import JobRead, JoinsRead
from elasticd.terms.head import JobHead
from elasticd.terms.state import EndReason

ROOT_UID = 0


@dataclass(frozen=True)
class Admission:
    join: bool
    note: str | None = None  # why this node, though allowed, cannot take part now (shown by status)


def admit(
    read: JobRead,
    node: str,
    free_slots: int,
    total_slots: int,
    unit: str,
    draining: bool = False,
    single_host_only: bool = False,
    joined: int | None = None,
) -> Admission:
    """A drained node (node-wide, or for this job) joins nothing; others join where there is a seat.
    A node whose address other hosts cannot reach (``single_host_only``) joins no multi-node job.
    ``joined``: the joins of the open round, as counted (None: those ``read`` holds)."""
    head = read.head
    if head is None or read.ended or read.round is None or not head.allows(node):
        return Admission(False)
    if draining or node in read.drains:
        return Admission(False)
    closed = read.closed  # a running round: join at the next one
    if joined is None:  # (a read of every job holds no join)
        joined = len(read.current_joins) if isinstance(read, JoinsRead) else 0
    seats = head.nnodes.max - (closed.size if closed is not None else joined)
    if seats <= 0:
        return Admission(False)
    if single_host_only and head.nnodes.max > 1:
        return Admission(False, single_host_note(node))
    if free_slots < head.nproc_per_node:
        need = head.nproc_per_node
        return Admission(
            False, f"{node} is waiting for {need} free {unit} ({free_slots} of {total_slots} free now)"
        )
    return Admission(True)


def single_host_note(node: str) -> str:
    return (
        f"{node} takes no multi-node job: its address is the default 127.0.0.1 while etcd is external, "
        "so workers on other hosts could not reach it; set `address` (--address, ELASTICD_ADDRESS) to "
        "this host's address on the training network (or to 127.0.0.1 if every node runs on this host)"
    )


@dataclass(frozen=True)
class Refusal:
    code: EndReason
    reason: str


def refuse(head: JobHead, node: str, daemon_uid: int, allow_root_jobs: bool) -> Refusal | None:
    """Whether this node must fail a job it is allowed to run, because of whom it would run as.

    The spec's uid is only a claim: anyone who can write to etcd can write ``"uid": 0``. Whether a
    job runs as root is this node's own configuration's decision (``allow_root_jobs``), and a
    daemon that is not root cannot switch users at all, so it runs only its own user's jobs.
    Failing (rather than just not joining) tells the submitter at once instead of leaving the
    job pending until its join timeout.
    """
    if not head.allows(node):
        return None
    return refuse_identity(head.uid, head.user, node, daemon_uid, allow_root_jobs)


def refuse_identity(uid: int, user: str, node: str, daemon_uid: int, allow_root_jobs: bool) -> Refusal | None:
    """The rule itself, for a job of ``uid``: at submit (the caller) and for every spec read."""
    if uid == ROOT_UID and daemon_uid == ROOT_UID and not allow_root_jobs:
        return Refusal(
            EndReason.ROOT_NOT_ALLOWED,
            f"node {node} does not run jobs as root (uid 0): allow_root_jobs is off "
            "(elasticd --allow-root-jobs); submit as a user",
        )
    if uid == ROOT_UID and daemon_uid != ROOT_UID:
        return Refusal(
            EndReason.ROOT_NOT_ALLOWED, f"node {node} runs elasticd as uid {daemon_uid}, not as root"
        )
    if daemon_uid != ROOT_UID and uid != daemon_uid:
        return Refusal(
            EndReason.SPAWN_FAILED,
            f"node {node} runs elasticd as uid {daemon_uid}, which cannot start workers "
            f"as uid {uid} ({user})",
        )
    return None

"""Which failure a round is blamed on, across nodes and across rounds. Pure: no I/O.

Every node describes its own root cause (``jobs.rootcause``), and the first node to act on a
failure writes it into the next round's record (or the final one). That node is not always the
one whose worker failed first: a crash on node B breaks the collective of node A's ranks, and A
may bump first with their "Connection closed by peer". So a node that reads a record naming
another node's failure of the same round, later than its own, amends the record by
compare-and-swap (``amendment``): the first failure by time wins, whoever wrote first, and the
one it displaced is listed among the also-failed. ``repeats`` counts a failure that repeats
itself round after round with no progress, so that the job can stop instead of burning its budget;
a failure from outside the job (``jobs.rootcause.from_outside``) is never counted.
"""

from __future__ import annotations

import math
from dataclasses import replace

from elasticd.agent.actions import Amend
from elasticd.decode import DecodeError, decode
from elasticd.jobs.rootcause import earlier, from_outside, same_way, with_also_failed
from elasticd.progress.goodput import Silence
from elasticd.rendezvous.jobread import JobRead
from elasticd.rendezvous.model import RoundInfo
from elasticd.terms.state import FailureKind, RoundReason, WorkerFailure


def _failure(data: dict[str, object] | None) -> WorkerFailure | None:
    if data is None:
        return None
    try:
        return decode(WorkerFailure, data)
    except DecodeError:  # validated when the record was read; defensive only
        return None


def amendment(read: JobRead, mine: WorkerFailure | None) -> Amend | None:
    """The write that makes the job's record name ``mine`` (this node's root cause) if it failed
    before the failure the record names, in the same round; else None."""
    if mine is None:
        return None
    final, info = read.final, read.round
    if final is not None:
        theirs = _failure(final.failure)
        if theirs is None or not earlier(mine, theirs):
            return None
        root = with_also_failed(mine, theirs)
        reason = final.reason.replace(theirs.summary(), root.summary())
        return Amend(read.final_mod, replace(final, failure=root.to_json(), reason=reason))
    if info is None or info.reason is not RoundReason.WORKER_FAILED:
        return None
    theirs = _failure(info.failure)
    if theirs is None or not earlier(mine, theirs):
        return None
    root = with_also_failed(mine, theirs)
    detail = root.summary() if info.detail == theirs.summary() else info.detail
    # The count was made for the failure the record named; a root cause from outside the job
    # (another node's rank killed, say, and ``theirs`` only its echo) starts no chain.
    count = 1 if from_outside(root) else info.repeats
    return Amend(read.round_mod, replace(info, failure=root.to_json(), detail=detail, repeats=count))


def repeats(previous: RoundInfo | None, failure: WorkerFailure) -> int:
    """How many rounds in a row, the one ``failure`` would open included, fail the same way."""
    if previous is None or previous.reason is not RoundReason.WORKER_FAILED:
        return 1
    before = _failure(previous.failure)
    if before is None or not same_way(before, failure):
        return 1
    return max(previous.repeats, 1) + 1


def silence(info: RoundInfo | None) -> Silence | None:
    """The hang round ``info`` was opened by, as every member reads it: from when the hung rank
    went silent to when the round moved on. Its peers' ledgers book that time as hung too
    (``progress.goodput``): they were blocked by it, though their own workers never failed."""
    failure = _failure(info.failure) if info is not None else None
    if info is None or failure is None or failure.kind is not FailureKind.HANG:
        return None
    since = failure.failed_at
    if since is None or not (math.isfinite(since) and since <= info.opened_at):
        return None
    return Silence(since, info.opened_at)

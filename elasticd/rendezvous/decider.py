"""Pure rendezvous rules: no I/O and no clock (``now`` is passed in), so each is unit-tested.

Invariants they keep (see docs/architecture/invariants.md):
- Agreement: the result is computed once, by the round's leader, and written once.
- Stable ranks: survivors keep their relative order; newcomers follow in join order.
- One bump per event: callers apply ``plan_bump`` through a compare-and-swap on the round.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from elasticd.rendezvous.model import MAX_EXPECT, Join, Member, RoundInfo, RoundResult
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import RoundReason


def leader(joins: Sequence[Join]) -> str | None:
    """The join with the lowest create_revision leads the round (closes it)."""
    return min(joins, key=lambda j: j.create_revision).node if joins else None


def order_members(joins: Sequence[Join], previous: RoundResult | None, max_nodes: int) -> list[Join]:
    """Survivors of the previous round first, in their old order; then newcomers by join order."""
    old = {m.node: m.group_rank for m in previous.members} if previous else {}
    survivors = sorted((j for j in joins if j.node in old), key=lambda j: old[j.node])
    newcomers = sorted((j for j in joins if j.node not in old), key=lambda j: j.create_revision)
    return (survivors + newcomers)[:max_nodes]


def build_result(round_no: int, ordered: Sequence[Join], closed_at: float, epoch: int = 0) -> RoundResult:
    """The round whole; ``epoch``: the closing leader's join's create revision (``roster``)."""
    members = []
    offset = 0
    for group_rank, j in enumerate(ordered):
        members.append(Member(j.node, j.address, group_rank, offset, j.local_world_size, j.liveness_port))
        offset += j.local_world_size
    lead = ordered[0]
    return RoundResult(
        round_no, tuple(members), offset, lead.address, lead.port, closed_at, epoch, agent_store=lead.store
    )


class Close(StrEnum):
    NOW = "now"
    WAIT = "wait"
    FAIL = "fail"


@dataclass(frozen=True)
class CloseDecision:
    verdict: Close
    why: str = ""
    recheck_at: float | None = None  # when a WAIT should be re-evaluated even if nothing changes


def decide_close(
    info: RoundInfo,
    joins: Sequence[Join],
    alive: Collection[str],
    nnodes: NodeRange,
    *,
    now: float,
    last_join_at: float,
    last_call_s: float,
    join_timeout_s: float,
    expect_grace_s: float,
    left: Collection[str] = (),
    running: Collection[str] = (),
    expect: Sequence[str] = (),
) -> CloseDecision:
    """Should the leader close the round now?

    - MAX nodes joined: close.
    - At least MIN joined and every node the round expects (the previous members and announced
      newcomers) that is still alive has joined: close at once, without last call.
    - At least MIN joined and no join for ``last_call_s``: close, unless an expected live node
      has not joined yet and ``expect_grace_s`` (its workers' stop grace) has not passed.
    - Fewer than MIN after ``join_timeout_s``: fail.

    ``expect``: the nodes the round expects (``expected``: the previous members it names, whom
    the leader reads from the previous round's assignments, and its announced newcomers).

    An expected node that ``left`` (it stopped its workers and will not rejoin) counts as arrived:
    that is how a round waits for a drained node's workers to be gone before it starts new ones.

    No grace closes over an expected node in ``running`` (a member of the previous round that is
    not done and whose lease lives, so its workers may still run: ``RostersRead.may_still_run``):
    until it rejoins (it stops them first), reports ``left`` or its lease ends, the round waits,
    and fails at ``join_timeout_s``. Time alone proves nothing: a member whose requests fail
    retries at its own pace while its lease lives.
    """
    count = len(joins)
    joined = {j.node for j in joins}
    missing = [n for n in expect if n in alive and n not in joined and n not in left]
    deadline = info.opened_at + join_timeout_s
    held = [n for n in missing if n in running]
    if held:
        return _held_by(held, now, deadline, join_timeout_s)
    if count >= nnodes.max and not (missing and now < info.opened_at + expect_grace_s):
        return CloseDecision(Close.NOW, f"{count} of at most {nnodes.max} nodes joined")
    if count >= nnodes.min:
        if expect and not missing:
            return CloseDecision(Close.NOW, "every expected node rejoined")
        quiet_until = last_join_at + last_call_s
        grace_until = info.opened_at + expect_grace_s if missing else 0.0
        if now >= quiet_until and now >= grace_until:
            return CloseDecision(Close.NOW, f"last call: {count} nodes joined")
        return CloseDecision(Close.WAIT, "last call", max(quiet_until, grace_until))
    if now >= deadline:
        return CloseDecision(
            Close.FAIL, f"only {count} of the {nnodes.min} nodes needed joined within {join_timeout_s:g}s"
        )
    return CloseDecision(Close.WAIT, f"{count} of {nnodes.min} nodes joined", deadline)


def _held_by(held: Sequence[str], now: float, deadline: float, join_timeout_s: float) -> CloseDecision:
    """A round held by previous members whose workers may still run: wait, and fail at the deadline."""
    named = ", ".join(held)
    if now >= deadline:
        why = (
            f"node(s) {named} of the previous round neither rejoined nor left within"
            f" {join_timeout_s:g}s while their leases lived: their workers may still run"
        )
        return CloseDecision(Close.FAIL, why)
    return CloseDecision(Close.WAIT, f"waiting for {named} to stop their workers", deadline)


@dataclass(frozen=True)
class BumpPlan:
    """What to do about an event in a running round: open the next one, or fail the job."""

    fail: bool
    spend: bool
    why: str


def plan_bump(reason: RoundReason, restarts_used: int, max_restarts: int, detail: str) -> BumpPlan:
    if reason.spends_budget and restarts_used >= max_restarts:
        return BumpPlan(True, False, f"{detail}; no restarts left ({restarts_used} of {max_restarts} used)")
    return BumpPlan(False, reason.spends_budget, detail)


def ring_neighbours(result: RoundResult, node: str) -> list[Member]:
    """The members either side of ``node`` in group-rank order: each death is seen by two peers,
    and each node watches at most two, whatever the size of the job."""
    members = list(result.members)
    index = next((i for i, m in enumerate(members) if m.node == node), None)
    if index is None or len(members) < 2:
        return []
    around = {members[(index - 1) % len(members)].node: members[(index - 1) % len(members)]}
    around[members[(index + 1) % len(members)].node] = members[(index + 1) % len(members)]
    return [m for n, m in around.items() if n != node]


def next_expect(extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The newcomers the next round names to wait for (at most ``MAX_EXPECT``: the round's record
    stays small; more close at last call). Its live members it expects by ``expect_members``."""
    return tuple(dict.fromkeys(extra))[:MAX_EXPECT]


def expected(info: RoundInfo, previous: RoundResult | None) -> tuple[str, ...]:
    """Whom round ``info`` waits for before it may close early: the previous round's members when
    it names them (``expect_members``; the leader reads that round whole), then its newcomers."""
    members = previous.nodes if info.expect_members and previous is not None else ()
    return tuple(dict.fromkeys([*members, *info.expect]))


__all__ = [
    "BumpPlan",
    "Close",
    "CloseDecision",
    "build_result",
    "decide_close",
    "expected",
    "leader",
    "next_expect",
    "order_members",
    "plan_bump",
]

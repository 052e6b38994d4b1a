"""A closed round as etcd holds it: a small head and one assignment per member. Pure.

One value holding every member grows with the job (133 KB at 1,024 nodes; past ~11,000 it is
over etcd's 1.5 MiB request limit) and every member would read all of it. So a round is stored
as (``elasticd.etcd.keys``):

- one ``Assignment`` per member, ``rounds/<job>/<r>/<node>``: its ranks, its ring neighbours;
- the ``RoundHead``, ``jobs/<job>/rdzv/<r>/result``: size, world size, master address and port.

The leader writes the assignments in transactions of at most ``MAX_TXN_PUTS`` puts and
``MAX_TXN_BYTES`` bytes (etcd refuses more than 128 operations, or 1.5 MiB, in one request),
each guarded by the head not existing yet and its own join being the one it led with, then the
head alone, last: a node acts on a round only once it reads its head, and by then every
assignment of the round is in place. Both records are under ``RECORD_BOUND`` bytes whatever N.
A member reads the head and its own assignment; ``status`` of the job and the next round's
leader read every assignment, in pages (``rosterread``), and ``assemble`` the whole round,
checking it against the head; the scan of every job reads heads alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from elasticd.decode import DecodeError
from elasticd.rendezvous.model import Assignment, Member, RoundHead, RoundResult

RECORD_BOUND = 4096  # bytes of a head or an assignment, as stored (its JSON)
MAX_TXN_PUTS = 120  # etcd's --max-txn-ops is 128 by default; the compares are counted apart
MAX_TXN_BYTES = 512 * 1024  # a third of etcd's default --max-request-bytes (1.5 MiB)


def encoded(value: Any) -> bytes:
    """A value as the store writes it (``etcd.client``: compact JSON)."""
    return json.dumps(value, separators=(",", ":")).encode()


def assignments(result: RoundResult) -> list[Assignment]:
    """Every member's assignment, in rank order; each names its neighbours either side (one
    pass: ``decider.ring_neighbours`` per member would be O(N²))."""
    members = result.members
    n = len(members)
    out = []
    for i, m in enumerate(members):
        around = {p.node: p for p in (members[(i - 1) % n], members[(i + 1) % n]) if p.node != m.node}
        out.append(Assignment(result.round, result.epoch, m, tuple(around.values())))
    return out


def batches(items: Sequence[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
    """``items`` (key, value to encode) cut into transactions of at most ``MAX_TXN_PUTS`` puts and
    ``MAX_TXN_BYTES`` bytes, in order. An item over ``RECORD_BOUND`` is a bug of the caller's
    (``ValueError``): the records' fields are bounded."""
    out: list[list[tuple[str, Any]]] = []
    size = 0
    for key, value in items:
        length = len(encoded(value))
        if length > RECORD_BOUND:
            raise ValueError(f"{key}: {length} bytes, over the bound of {RECORD_BOUND}")
        cost = len(key) + length
        if not out or len(out[-1]) >= MAX_TXN_PUTS or size + cost > MAX_TXN_BYTES:
            out.append([])
            size = 0
        out[-1].append((key, value))
        size += cost
    return out


def bounded(raw: bytes, what: str) -> bytes:
    """``raw`` if it is within ``RECORD_BOUND`` (checked before it is decoded), else DecodeError."""
    if len(raw) > RECORD_BOUND:
        raise DecodeError("", f"{what} is {len(raw)} bytes, over the bound of {RECORD_BOUND}")
    return raw


def own(head: RoundHead, found: Assignment | None) -> Assignment | None:
    """A node's assignment in ``head``'s round: one a leader that did not close it left is none."""
    if found is None or found.round != head.round or found.epoch != head.epoch:
        return None
    return found


def assemble(head: RoundHead, found: Iterable[Assignment]) -> RoundResult:
    """The whole round from its head and its assignments (those of another epoch are a leader's
    that did not close it, and left out); DecodeError when they do not make the head's round."""
    ranked: dict[int, Member] = {}
    for a in found:
        if a.round != head.round or a.epoch != head.epoch:
            continue
        if a.member.group_rank in ranked:
            raise DecodeError("group_rank", f"{a.member.group_rank} is assigned twice in round {head.round}")
        ranked[a.member.group_rank] = a.member
    if len(ranked) != head.size:
        raise DecodeError("", f"round {head.round} has {len(ranked)} of its {head.size} assignments")
    members = tuple(ranked[r] for r in sorted(ranked))
    try:
        result = RoundResult(
            head.round,
            members,
            head.world_size,
            head.master_addr,
            head.master_port,
            head.closed_at,
            head.epoch,
            agent_store=head.agent_store,
        )
    except ValueError as exc:
        raise DecodeError("", f"round {head.round}'s assignments do not make its head: {exc}") from exc
    return result

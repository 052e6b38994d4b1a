"""``load_checkpoint``'s memory path: which step the job resumes from, and from where.

At every load the ranks exchange one report each (``collective.all_gather_json``: tensor
collectives only, so torch without numpy will do): what their node's keeper holds of the
checkpoint (its own snapshots and the replicas it received), its replication link, and the job's
key if it has one. From the same reports every rank computes the same answers
(pure functions below, unit-tested): the job's key (the first keeper's that has one, else rank 0's
proposal), each node's replication peer (the next node in rank order, a ring), and the step: the
newest step any keeper holds (the state is the same on every rank, so a step one rank finished is
whole for all). Each rank then loads it from the nearest copy: its own keeper first (its own rank's
snapshot, else any rank's), else another node's keeper over the authenticated link.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from elasticd.workers.snapshot_program import collective, frame, replica
from elasticd.workers.snapshot_program.client import KeeperClient, SnapshotError
from elasticd.workers.snapshot_program.protocol import BadMessage
from elasticd.workers.snapshot_program.replies import Held


@dataclass(frozen=True)
class Source:
    """Where a rank loads the agreed step from: its own keeper (``held``) or another node's."""

    step: int
    rank: int  # the rank whose snapshot it is
    held: Held | None  # on this node's keeper
    peer: tuple[str, int] | None  # else on the keeper there


def report(client: KeeperClient | None, name: str, me: int) -> tuple[dict[str, Any], list[Held], str]:
    """This rank's report, what its keeper holds, and why it holds nothing (when it does not)."""
    mine: dict[str, Any] = {
        "rank": me,
        "key": None,
        "proposal": os.urandom(32).hex(),
        "address": "",
        "port": 0,
    }
    mine["held"] = []
    if client is None:
        return mine, [], "no snapshot keeper (snapshot_bytes is 0, or not under elasticd)"
    try:
        mine["key"], mine["address"], mine["port"] = client.key()
        held = client.held(name)
    except SnapshotError as exc:
        return mine, [], f"snapshot keeper: {exc}"
    mine["held"] = [[h.rank, h.step] for h in held]
    return mine, held, "" if held else "no snapshot in memory"


def gather(mine: dict[str, Any], dist: Any) -> list[dict[str, Any]]:
    """Every rank's report (a collective when ``dist`` is given)."""
    return [r for r in collective.all_gather_json(mine, dist) if isinstance(r, dict)]


def _valid(r: dict[str, Any]) -> bool:
    return isinstance(r.get("rank"), int) and isinstance(r.get("held"), list)


def choose_key(reports: list[dict[str, Any]]) -> str:
    ordered = sorted((r for r in reports if _valid(r)), key=lambda r: r["rank"])
    for r in ordered:
        if isinstance(r.get("key"), str):
            return str(r["key"])
    return str(ordered[0]["proposal"])


def _link(r: dict[str, Any]) -> tuple[str, int] | None:
    address, port = r.get("address"), r.get("port")
    return (
        (address, port) if isinstance(address, str) and address and type(port) is int and port > 0 else None
    )


def ring_peer(reports: list[dict[str, Any]], me: int) -> tuple[str, int] | None:
    """The keeper this rank's node replicates to: the next node's, in rank order (None: alone)."""
    nodes: list[tuple[str, int]] = []
    mine = None
    for r in sorted((r for r in reports if _valid(r)), key=lambda r: r["rank"]):
        link = _link(r)
        if link is not None and link not in nodes:
            nodes.append(link)
        if r["rank"] == me:
            mine = link
    if mine is None or len(nodes) < 2:
        return None
    return nodes[(nodes.index(mine) + 1) % len(nodes)]


def sources(reports: list[dict[str, Any]], held: list[Held], me: int) -> list[Source]:
    """Where this rank may load the newest step any keeper holds, nearest first (empty: none)."""
    steps = {int(s) for r in reports if _valid(r) for _, s in r["held"]}
    if not steps:
        return []
    step = max(steps)
    here = sorted((h for h in held if h.step == step), key=lambda h: (h.rank != me, h.replica, h.rank))
    out = [Source(step, h.rank, h, None) for h in here]
    mine = next((_link(r) for r in reports if _valid(r) and r["rank"] == me), None)
    remote: list[tuple[bool, int, tuple[str, int]]] = []
    for r in reports:
        link = _link(r)
        if not _valid(r) or link is None or link == mine:
            continue
        remote += [(rank != me, rank, link) for rank, s in r["held"] if s == step]
    out += [Source(step, rank, None, link) for _, rank, link in sorted(set(remote))]
    return out


def load(client: KeeperClient, name: str, key: str, source: Source) -> Any:
    if source.held is not None:
        return client.load(name, source.held)[1]
    assert source.peer is not None
    try:
        buf = replica.fetch(source.peer, bytes.fromhex(key), name, source.rank, source.step)
        return frame.read(buf, views=True)[1]  # the received bytes are ours: no second copy
    except (OSError, BadMessage, ValueError) as exc:
        raise SnapshotError(f"from {source.peer[0]}:{source.peer[1]}: {exc}") from exc

"""Reachability as a condition of membership: whom a round may take in. Pure (``now`` is passed in).

A node cut from its peers but not from etcd keeps its lease and joins every round; a round that
takes it in stalls until the hang timeout. So, before the leader closes a round, it probes every
other joiner's liveness port (a TCP connect, by the executor: ``Probe``; what it found comes back
as a ``Reach``), and ``admit`` judges:

- a joiner the leader cannot reach is left out of the round (not a failure: no restart is spent);
- if that leaves fewer than MIN, the round waits, probing again (and fails at the join timeout,
  as a round short of MIN does);
- a leader that cannot reach a majority of two or more other joiners is most likely the cut one
  itself: it withdraws its join, so that the next oldest leads, and rejoins after a backoff.

A node outside a running round announces itself (``waiting``, which makes the members open a
round for it) only once it reaches every member itself (``ready``): a cut node is never taken back,
and never makes the members restart, while it is cut. A connect needs both directions of the
link, so what the prober reaches, reaches it. Silence is judged here only for admission: a peer's
*death* is still proven only by ``elasticd.node.liveness``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from elasticd.rendezvous.model import Join, Member

PROBE_TIMEOUT_S = 1.0  # one connect; a peer on the same network answers in well under a millisecond
PROBE_FRESH_S = 2.0  # a probe older than this is repeated before it decides anything
REJOIN_BACKOFF_S = 2.0  # a leader that withdrew as unreachable: the others join first meanwhile

Target = tuple[str, str, int]  # node, address, liveness port


@dataclass(frozen=True)
class Reach:
    """What the last probe found: of round ``round``'s nodes, whom it reached, at ``at``."""

    round: int
    reached: frozenset[str]
    unreached: frozenset[str]
    at: float

    def covers(self, round_no: int, nodes: Iterable[str], now: float) -> bool:
        """Whether it says something about each of ``nodes`` in ``round_no``, recently enough."""
        known = self.reached | self.unreached
        return self.round == round_no and now - self.at < PROBE_FRESH_S and all(n in known for n in nodes)


def targets(parts: Iterable[Join | Member], me: str) -> tuple[Target, ...]:
    """Whom to probe: every other node that publishes a liveness port (one that does not cannot be
    probed, and is taken as reachable: a daemon that publishes none still forms rounds)."""
    return tuple((p.node, p.address, p.liveness_port) for p in parts if p.node != me and p.liveness_port)


class Admit(StrEnum):
    """What the leader does with the joins of a round it would close (``ready``: GO, PROBE, WAIT)."""

    GO = "go"  # close with ``joins``
    PROBE = "probe"  # probe ``targets`` first
    WAIT = "wait"  # too few reachable: wait until ``recheck_at``
    WITHDRAW = "withdraw"  # we are the cut one: withdraw, rejoin after the backoff
    FAIL = "fail"  # too few reachable until the join timeout


@dataclass(frozen=True)
class Admission:
    verdict: Admit
    joins: tuple[Join, ...] = ()
    left_out: tuple[str, ...] = ()
    targets: tuple[Target, ...] = ()
    why: str = ""
    recheck_at: float | None = None


def _unreached(round_no: int, probe: tuple[Target, ...], reach: Reach | None, now: float) -> list[str] | None:
    names = [t[0] for t in probe]
    if reach is None or not reach.covers(round_no, names, now):
        return None
    return [n for n in names if n in reach.unreached]


def admit(
    round_no: int,
    joins: Sequence[Join],
    me: str,
    reach: Reach | None,
    min_nodes: int,
    *,
    now: float,
    deadline: float,
) -> Admission:
    """The leader ``me`` would close round ``round_no`` with ``joins``: whom may it take?"""
    probe = targets(joins, me)
    if not probe:
        return Admission(Admit.GO, tuple(joins))
    unreached = _unreached(round_no, probe, reach, now)
    if unreached is None:
        return Admission(Admit.PROBE, targets=probe)
    if not unreached:
        return Admission(Admit.GO, tuple(joins))
    named = ", ".join(unreached)
    if len(probe) >= 2 and 2 * len(unreached) > len(probe):
        why = f"{me} cannot reach {len(unreached)} of {len(probe)} other joiners ({named}): another leads"
        return Admission(Admit.WITHDRAW, left_out=(me,), why=why)
    kept = tuple(j for j in joins if j.node not in unreached)
    if len(kept) >= min_nodes:
        return Admission(Admit.GO, kept, tuple(unreached), why=f"left out {named}: unreachable from {me}")
    why = (
        f"round {round_no} waits: {named} unreachable from {me}, {len(kept)} of the {min_nodes} nodes needed"
    )
    if now >= deadline:
        return Admission(Admit.FAIL, why=why)
    assert reach is not None  # ``_unreached`` judged it
    return Admission(Admit.WAIT, why=why, recheck_at=min(reach.at + PROBE_FRESH_S, deadline))


def ready(round_no: int, members: Sequence[Member], me: str, reach: Reach | None, now: float) -> Admission:
    """May ``me``, outside running round ``round_no``, ask to be taken in (GO)? Only once it reaches
    every member: otherwise the next round would leave it out again, or stall on it."""
    probe = targets(members, me)
    if not probe:
        return Admission(Admit.GO)
    unreached = _unreached(round_no, probe, reach, now)
    if unreached is None:
        return Admission(Admit.PROBE, targets=probe)
    if not unreached:
        return Admission(Admit.GO)
    assert reach is not None
    why = (
        f"cannot reach {', '.join(unreached)} of round {round_no} on their liveness ports:"
        " waits to be taken back once it can"
    )
    return Admission(Admit.WAIT, left_out=(me,), why=why, recheck_at=reach.at + PROBE_FRESH_S)

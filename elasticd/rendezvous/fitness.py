"""The pre-flight check as a condition of membership (``--node-check``): whom a round may take in,
after ``reach``. Pure (``now`` is passed in).

Every joiner measured its compute when it joined (``Join.compute``, by its check server, run as
the job's user: ``workers.check_program``), and serves peers' checks on ``Join.check_port``. The
leader, before it closes the round, measures its link to each other joiner (latency and
bandwidth: the executor's ``CheckNodes``, what it found comes back as ``Checked``), and ``admit``
judges:

- a joiner far below its peers (``unfit``: compute or bandwidth under ``FAR`` times the others'
  median, latency over ``RTT_FACTOR`` times theirs plus ``RTT_SLACK_S``, a check that failed) is
  left out of the round, with the reason in the round's event and the job's pending note (not a
  failure: no restart is spent), as an unreachable joiner is;
- if that leaves fewer than MIN, the round waits, checking again every ``RECHECK_S`` (a
  fixed-size job takes another node that joins, or fails at the join timeout);
- a leader far below its peers withdraws, so that another leads (and leaves it out).

Figures are compared only among the round's own nodes: with fewer than two others to compare
with, a figure judges nothing (two nodes: the slower is far below when under half the other).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elasticd.rendezvous.model import Join
from elasticd.rendezvous.reach import Admission, Admit

FAR = 0.5  # compute or bandwidth under this share of the others' median is far below them
RTT_FACTOR = 3.0  # latency over this multiple of the others' median ...
RTT_SLACK_S = 0.002  # ... plus this (a loopback or LAN round trip is well under it) is far above
CHECK_FRESH_S = 10.0  # a check older than this is repeated before it decides anything
RECHECK_S = 10.0  # a round short of fit nodes checks again this often
PROBE_DEADLINE_S = 3.0  # the leader's measurement of every link, in all
MAX_FIGURE = 1e15

CheckTarget = tuple[str, str, int]  # node, address, check port


@dataclass(frozen=True)
class Link:
    """The leader's measurement of its link to one joiner: round trip and bulk rate, or why not."""

    rtt_s: float | None = None
    bytes_per_s: float | None = None
    error: str = ""

    def __post_init__(self) -> None:
        for name in ("rtt_s", "bytes_per_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_FIGURE):
                raise ValueError(f"{name} must be a non-negative number")


@dataclass(frozen=True)
class Checked:
    """What the leader's last check of round ``round`` found, by node, at ``at``."""

    round: int
    links: Mapping[str, Link]
    at: float

    def covers(self, round_no: int, nodes: Sequence[str], now: float) -> bool:
        return (
            self.round == round_no and now - self.at < CHECK_FRESH_S and all(n in self.links for n in nodes)
        )


def check_targets(joins: Sequence[Join], me: str) -> tuple[CheckTarget, ...]:
    """Whose link to measure: every other joiner that serves a check."""
    return tuple((j.node, j.address, j.check_port) for j in joins if j.node != me and j.check_port)


def _below(name: str, mine: float, others: list[float]) -> str | None:
    if len(others) < 1:
        return None
    median = statistics.median(others)
    if median > 0 and mine < FAR * median:
        return f"{name} {mine:.3g} against its peers' {median:.3g} ({mine / median:.2f}x)"
    return None


def unfit(compute: Mapping[str, float | None], links: Mapping[str, Link]) -> dict[str, str]:
    """The nodes far below their peers, each with why. ``compute``: every node's figure (None: it
    did not measure: its check did not start); ``links``: the leader's to each other node."""
    out: dict[str, str] = {}
    for node, link in links.items():
        if link.error:
            out[node] = f"its network check failed: {link.error}"
    for node, mine in compute.items():
        if mine is None:
            out.setdefault(node, "its check did not start")
            continue
        others = [v for n, v in compute.items() if n != node and v is not None]
        if (why := _below("compute", mine, others)) is not None:
            out.setdefault(node, why)
    rates = {n: lk.bytes_per_s for n, lk in links.items() if lk.bytes_per_s is not None}
    rtts = {n: lk.rtt_s for n, lk in links.items() if lk.rtt_s is not None}
    for node, rate in rates.items():
        others = [v for n, v in rates.items() if n != node]
        if len(others) >= 1 and (why := _below("bandwidth", rate, others)) is not None:
            out.setdefault(node, why)
    for node, rtt in rtts.items():
        others = [v for n, v in rtts.items() if n != node]
        if others and rtt > RTT_FACTOR * statistics.median(others) + RTT_SLACK_S:
            out.setdefault(
                node,
                f"latency {rtt * 1e3:.2f} ms against its peers' {statistics.median(others) * 1e3:.2f} ms",
            )
    return out


def admit(
    round_no: int,
    joins: Sequence[Join],
    me: str,
    checked: Checked | None,
    min_nodes: int,
    *,
    now: float,
    deadline: float,
) -> Admission:
    """The leader ``me`` would close round ``round_no`` with ``joins`` (the ones it reaches): which
    pass the check? ``PROBE``: measure ``targets`` first."""
    targets = check_targets(joins, me)
    if targets and (checked is None or not checked.covers(round_no, [t[0] for t in targets], now)):
        return Admission(Admit.PROBE, targets=targets)
    links = checked.links if checked is not None and targets else {}
    bad = unfit({j.node: j.compute for j in joins}, {n: lk for n, lk in links.items() if n != me})
    if not bad:
        return Admission(Admit.GO, tuple(joins))
    named = "; ".join(f"{n}: {why}" for n, why in sorted(bad.items()))
    if me in bad:
        return Admission(
            Admit.WITHDRAW, left_out=(me,), why=f"{me} failed its node check ({named}): another leads"
        )
    kept = tuple(j for j in joins if j.node not in bad)
    if len(kept) >= min_nodes:
        return Admission(Admit.GO, kept, tuple(sorted(bad)), why=f"left out by the node check: {named}")
    why = (
        f"round {round_no} waits: {len(kept)} of the {min_nodes} nodes needed passed the node check ({named})"
    )
    if now >= deadline:
        return Admission(Admit.FAIL, why=why)
    return Admission(Admit.WAIT, why=why, recheck_at=min(now + RECHECK_S, deadline))

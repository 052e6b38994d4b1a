"""Which ranks hang, and on what evidence. Pure: the caller samples, this module judges.

A rank that reports progress (``protocol``) hangs when its last report is older than its phase's
timeout: whatever it does (sleeps, spins, waits on a peer), it makes no progress.

A rank that never reported (a plain torchrun script, or one still starting) is judged by what it
cannot hide: it hangs when, over samples spanning the whole timeout, its process tree used less
than ``CPU_FRACTION`` of the elapsed time in CPU *and* its main thread's stack (sampled only once
it looks stalled: see ``looks_stalled``) did not change. Either alone is not enough: a rank
waiting on I/O uses no CPU yet moves; a rank spinning in a loop stays on one line yet burns CPU.
When stacks cannot be taken (no py-spy, not permitted), the CPU evidence decides alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elasticd.progress.protocol import Phase

CPU_FRACTION = 0.05
STALL_WINDOW_S = 1.0  # CPU this flat this long: start taking stack samples
STACK_LAG_S = 3.0  # stack samples start this much after the CPU evidence does (see the sampler)
PEER_GRACE_S = 1.5  # how long a node whose hung ranks all wait on the others leaves to their nodes


@dataclass(frozen=True)
class CpuSample:
    at: float
    cpu_s: float  # user + system seconds of the rank's whole process tree


@dataclass(frozen=True)
class StackSample:
    at: float
    digest: str  # of the main thread's frames (``stacks.digest``)
    frame: str  # its innermost frame, ``train.py:42 in step``


@dataclass(frozen=True)
class Evidence:
    rank: int
    phase: Phase
    last_report_at: float | None  # None: it never reported
    cpu: tuple[CpuSample, ...] = ()  # oldest first
    stacks: tuple[StackSample, ...] = ()  # oldest first
    stacks_available: bool = True


@dataclass(frozen=True)
class Hung:
    rank: int
    since: float  # when the evidence starts: the last report, else the first flat CPU sample
    silent_s: float  # how long it has made no progress
    frame: str  # the innermost frame of its main thread, "" when unknown
    reported: bool  # judged by its reports (else by CPU and stacks)


def flat_since(
    cpu: Sequence[CpuSample], now: float, timeout: float, fraction: float = CPU_FRACTION
) -> float | None:
    """The start of a CPU-flat span covering ``timeout`` before ``now``, or None."""
    before = [s for s in cpu if s.at <= now - timeout]
    if not before or cpu[-1].at <= before[-1].at:
        return None
    first, last = before[-1], cpu[-1]
    used = last.cpu_s - first.cpu_s
    return first.at if used < fraction * (last.at - first.at) else None


def _still(stacks: Sequence[StackSample], since: float, timeout: float, lag: float) -> bool:
    """The main thread's stack did not move from ``since`` on, over samples spanning the timeout
    (but for the sampler's lag in starting to take them)."""
    seen = [s for s in stacks if s.at >= since]
    if len(seen) < 2 or len({s.digest for s in seen}) != 1:
        return False
    return seen[-1].at - seen[0].at >= max(0.0, timeout - lag)


def judge(
    ev: Evidence,
    timeouts: Mapping[Phase, float],
    now: float,
    fraction: float = CPU_FRACTION,
    lag: float = STACK_LAG_S,
) -> Hung | None:
    timeout = timeouts[ev.phase]
    frame = ev.stacks[-1].frame if ev.stacks else ""
    if ev.last_report_at is not None:
        due = now >= ev.last_report_at + timeout
        return Hung(ev.rank, ev.last_report_at, now - ev.last_report_at, frame, True) if due else None
    since = flat_since(ev.cpu, now, timeout, fraction)
    if since is None:
        return None
    if ev.stacks_available and not _still(ev.stacks, since, timeout, lag):
        return None
    return Hung(ev.rank, since, now - since, frame, False)


def decide(
    evidence: Sequence[Evidence],
    timeouts: Mapping[Phase, float],
    now: float,
    fraction: float = CPU_FRACTION,
    lag: float = STACK_LAG_S,
) -> list[Hung]:
    """The hung ranks, longest silent first."""
    hung = [h for ev in evidence if (h := judge(ev, timeouts, now, fraction, lag)) is not None]
    return sorted(hung, key=lambda h: (h.since, h.rank))


def looks_stalled(cpu: Sequence[CpuSample], fraction: float = CPU_FRACTION) -> bool:
    """Whether the last ``STALL_WINDOW_S`` of CPU samples are flat: time to look at its stack."""
    if len(cpu) < 2:
        return False
    last = cpu[-1]
    before = [s for s in cpu if s.at <= last.at - STALL_WINDOW_S]
    if not before:
        return False
    first = before[-1]
    return last.cpu_s - first.cpu_s < fraction * (last.at - first.at)


def held_for_peers(
    hung: Sequence[Hung],
    waiting: Mapping[int, bool],
    elsewhere: bool,
    held_since: float | None,
    now: float,
    grace: float = PEER_GRACE_S,
) -> bool:
    """Whether to hold a hang back for ``grace`` (counted from ``held_since``, the first tick that
    held it) rather than declare it now. Only when every hung rank here waits in a collective and
    the round has ranks on other nodes (``elsewhere``): the rank they wait for is likely one of
    those, and its node names it as the root cause if it declares first. Two nodes judge on their
    own clocks' ticks, so without the hold the node of a rank that went silent a fraction of a
    second later (it still reached the collective) can win the race to write the round's failure.
    If the other node never declares (its ranks look busy, or it has no say), this one does."""
    if not elsewhere or not hung or not all(waiting.get(h.rank, False) for h in hung):
        return False
    return held_since is None or now < held_since + grace


def root_cause(hung: Sequence[Hung], waiting: Mapping[int, bool]) -> list[Hung]:
    """``hung`` with the likely cause first: a rank not waiting in a collective (``waiting``,
    from its stack) before one that waits for the others, then the longest silent."""
    return sorted(hung, key=lambda h: (waiting.get(h.rank, False), h.since, h.rank))

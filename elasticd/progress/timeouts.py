"""How long a rank may go without progress before it counts as hung: fixed, or learned. Pure.

``--hang-timeout SECONDS`` gives every phase the same timeout. ``--hang-timeout auto`` learns one
per phase from the durations this attempt has seen: ``max(floor, FACTOR * p99)`` once a phase has
``MIN_SAMPLES`` durations, and a generous ``UNLEARNED_S`` before that (a first checkpoint, or the
start-up, whose one duration per attempt is never enough to learn from). A step that takes ten
times longer than nearly every step before it is not a slow step: it is stuck.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from elasticd.progress.protocol import Phase

FACTOR = 10.0
MIN_SAMPLES = 10
WINDOW = 256  # durations kept per phase
FLOOR_S = {Phase.STARTUP: 300.0, Phase.STEP: 30.0, Phase.CHECKPOINT: 120.0}
UNLEARNED_S = {Phase.STARTUP: 900.0, Phase.STEP: 900.0, Phase.CHECKPOINT: 900.0}
MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 7 * 86400.0


@dataclass(frozen=True)
class HangPolicy:
    """The job's ``--hang-timeout``: ``seconds`` for every phase, or ``auto`` (``seconds`` None)."""

    seconds: float | None

    @property
    def auto(self) -> bool:
        return self.seconds is None


def p99(values: Sequence[float]) -> float:
    """The 99th percentile (nearest rank) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


class TimeoutLearner:
    def __init__(self, policy: HangPolicy) -> None:
        self.policy = policy
        self._seen: dict[Phase, deque[float]] = {p: deque(maxlen=WINDOW) for p in Phase}

    def observe(self, phase: Phase, seconds: float) -> None:
        """A duration of ``phase`` (a step, a checkpoint, a start-up); nonsense is ignored."""
        if math.isfinite(seconds) and seconds >= 0:
            self._seen[phase].append(seconds)

    def samples(self, phase: Phase) -> int:
        return len(self._seen[phase])

    def timeout(self, phase: Phase) -> float:
        if self.policy.seconds is not None:
            return self.policy.seconds
        seen = self._seen[phase]
        if len(seen) < MIN_SAMPLES:
            return UNLEARNED_S[phase]
        return min(MAX_TIMEOUT_S, max(FLOOR_S[phase], FACTOR * p99(seen)))

    def timeouts(self) -> dict[Phase, float]:
        return {p: self.timeout(p) for p in Phase}

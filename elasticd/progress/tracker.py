"""Per-rank progress from the reports of ``protocol``: last step, steps/s, phase. Pure: every
call takes ``now``.

Step times are kept in a bounded window per rank. Step times cannot say which rank is slow in
synchronous training (every rank waits for the slowest, so all step alike): that is ``slowness``'s,
from where each rank's time goes.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from elasticd.progress.protocol import MAX_STEP, Phase, PhaseReport, Report, StepReport
from elasticd.progress.slowness import Evidence

WINDOW = 64  # step durations kept per rank
MAX_RANK = 2**31 - 1


def _finite(value: float | None, what: str) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{what} must be a non-negative number or null")


@dataclass(frozen=True)
class RankProgress:
    """What a rank's reports say, as published in its node's status."""

    rank: int
    step: int | None  # the last step reported; None: none yet
    last_step_at: float | None  # when it was reported (the daemon's clock)
    steps_per_s: float | None  # over the window; None: fewer than two reports
    step_time_s: float | None  # median seconds per step over the window
    samples: int  # step durations in the window
    phase: Phase
    # Seconds outside collectives and waiting in them over ``slowness.WINDOW_S`` (the daemon's
    # looks at the rank's main thread, ``threadstate``); None until enough was seen.
    computing_s: float | None = None
    waiting_s: float | None = None
    # Of computing_s, runnable but waiting for a CPU: the node's ranks' mean (``slowness.pool``).
    queued_s: float | None = None
    evidence_at: float | None = None  # when the window ends (``slowness.aligned_end``)

    def __post_init__(self) -> None:
        """Read back from etcd, where anyone with access could have written it."""
        if not 0 <= self.rank <= MAX_RANK:
            raise ValueError(f"rank must be 0..{MAX_RANK}")
        if self.step is not None and not 0 <= self.step <= MAX_STEP:
            raise ValueError(f"step must be 0..{MAX_STEP} or null")
        if not 0 <= self.samples <= WINDOW:
            raise ValueError(f"samples must be 0..{WINDOW}")
        for name in ("last_step_at", "steps_per_s", "step_time_s", "evidence_at"):
            _finite(getattr(self, name), name)
        if (self.computing_s is None) != (self.waiting_s is None):
            raise ValueError("computing_s and waiting_s are both given or both null")
        if self.queued_s is not None and self.computing_s is None:
            raise ValueError("queued_s is given only with computing_s")
        _ = self.evidence  # bounded by the window

    @property
    def evidence(self) -> Evidence | None:
        if self.computing_s is None or self.waiting_s is None:
            return None
        return Evidence(self.computing_s, self.waiting_s, self.queued_s or 0.0)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["phase"] = self.phase.value
        return out


class RankTracker:
    """One rank's reports. ``on_duration(phase, seconds)`` hears each finished start-up, step and
    checkpoint (for ``timeouts.TimeoutLearner``)."""

    def __init__(
        self, rank: int, started_at: float, on_duration: Callable[[Phase, float], None] | None = None
    ) -> None:
        self.rank = rank
        self.started_at = started_at
        self.phase = Phase.STARTUP
        self.phase_since = started_at
        self.step: int | None = None
        self.last_step_at: float | None = None
        self.last_report_at: float | None = None  # any valid report: a step or a phase change
        self._durations: deque[float] = deque(maxlen=WINDOW)
        self._points: deque[tuple[float, int]] = deque(maxlen=WINDOW + 1)  # (time, step)
        self._on_duration = on_duration or (lambda phase, seconds: None)

    def report(self, report: Report, now: float) -> None:
        self.last_report_at = now
        match report:
            case StepReport(step):
                self._step(step, now)
            case PhaseReport(phase):
                self._enter(phase, now)

    def _enter(self, phase: Phase, now: float) -> None:
        if phase is self.phase:
            return
        if self.phase is not Phase.STEP:  # a finished start-up or checkpoint
            self._on_duration(self.phase, max(0.0, now - self.phase_since))
        self.phase, self.phase_since = phase, now

    def _step(self, step: int | None, now: float) -> None:
        n = (0 if self.step is None else min(MAX_STEP, self.step + 1)) if step is None else step
        previous, was = self.last_step_at, self.step
        self._enter(Phase.STEP, now)
        if previous is not None and was is not None and n > was:
            per_step = max(0.0, now - previous) / (n - was)
            self._durations.append(per_step)
            if self.phase_since <= previous:  # a checkpoint in between is not a step's time
                self._on_duration(Phase.STEP, per_step)
        if was is not None and n < was:  # the script started over (resumed from a checkpoint)
            self._points.clear()
        self.step, self.last_step_at = n, now
        self._points.append((now, n))

    def snapshot(self) -> RankProgress:
        rate = None
        if len(self._points) >= 2:
            (t0, s0), (t1, s1) = self._points[0], self._points[-1]
            rate = (s1 - s0) / (t1 - t0) if t1 > t0 and s1 >= s0 else None
        median = statistics.median(self._durations) if self._durations else None
        return RankProgress(
            rank=self.rank,
            step=self.step,
            last_step_at=self.last_step_at,
            steps_per_s=rate,
            step_time_s=median,
            samples=len(self._durations),
            phase=self.phase,
        )

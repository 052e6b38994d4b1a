"""Per-rank progress (fake clock), the auto-timeout learner and the straggler rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.progress.protocol import Phase, PhaseReport, StepReport
from elasticd.progress.timeouts import (
    FACTOR,
    FLOOR_S,
    MIN_SAMPLES,
    UNLEARNED_S,
    HangPolicy,
    TimeoutLearner,
    p99,
)
from elasticd.progress.tracker import RankTracker


def test_steps_rate_and_median_step_time() -> None:
    t = RankTracker(3, started_at=100.0)
    assert t.snapshot().step is None and t.phase is Phase.STARTUP
    for i in range(5):
        t.report(StepReport(i), 110.0 + 2 * i)
    snap = t.snapshot()
    assert (snap.rank, snap.step, snap.last_step_at, snap.phase) == (3, 4, 118.0, Phase.STEP)
    assert snap.steps_per_s == pytest.approx(0.5) and snap.step_time_s == pytest.approx(2.0)
    assert snap.samples == 4


def test_step_without_a_number_counts_on() -> None:
    t = RankTracker(0, 0.0)
    t.report(StepReport(None), 1.0)
    t.report(StepReport(None), 2.0)
    t.report(StepReport(10), 3.0)
    t.report(StepReport(None), 4.0)
    assert t.snapshot().step == 11


def test_durations_reach_the_learner_per_phase() -> None:
    seen: list[tuple[Phase, float]] = []
    t = RankTracker(0, 100.0, lambda phase, s: seen.append((phase, s)))
    t.report(StepReport(0), 130.0)  # start-up took 30 s
    t.report(StepReport(1), 131.0)
    t.report(PhaseReport(Phase.CHECKPOINT), 131.5)
    t.report(PhaseReport(Phase.STEP), 141.5)  # a 10 s checkpoint
    t.report(StepReport(2), 142.0)  # the step around the checkpoint is not a step time
    t.report(StepReport(4), 144.0)  # two steps in 2 s
    assert seen == [(Phase.STARTUP, 30.0), (Phase.STEP, 1.0), (Phase.CHECKPOINT, 10.0), (Phase.STEP, 1.0)]


def test_a_restart_from_a_checkpoint_resets_the_rate() -> None:
    t = RankTracker(0, 0.0)
    for i, at in enumerate([1.0, 2.0, 3.0]):
        t.report(StepReport(10 + i), at)
    t.report(StepReport(5), 4.0)
    t.report(StepReport(6), 6.0)
    assert t.snapshot().steps_per_s == pytest.approx(0.5)


def test_fixed_policy_is_the_same_for_every_phase() -> None:
    learner = TimeoutLearner(HangPolicy(30.0))
    learner.observe(Phase.STEP, 1000.0)
    assert learner.timeouts() == {p: 30.0 for p in Phase}


def test_auto_learns_a_multiple_of_the_p99_with_a_floor() -> None:
    learner = TimeoutLearner(HangPolicy(None))
    assert learner.timeout(Phase.STEP) == UNLEARNED_S[Phase.STEP]
    for _ in range(MIN_SAMPLES):
        learner.observe(Phase.STEP, 0.5)
    assert learner.timeout(Phase.STEP) == FLOOR_S[Phase.STEP]  # 10 * 0.5 s is below the floor
    for _ in range(100):
        learner.observe(Phase.STEP, 20.0)
    assert learner.timeout(Phase.STEP) == FACTOR * 20.0
    assert learner.timeout(Phase.CHECKPOINT) == UNLEARNED_S[Phase.CHECKPOINT]  # learned separately
    learner.observe(Phase.STEP, float("nan"))
    learner.observe(Phase.STEP, -1.0)
    assert learner.samples(Phase.STEP) == MIN_SAMPLES + 100


@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=200))
def test_p99_is_an_observed_value_above_nearly_all(values: list[float]) -> None:
    q = p99(values)
    assert q in values
    assert sum(v > q for v in values) <= len(values) // 100


def test_status_renders_progress_per_rank() -> None:
    from elasticctl.render import progress_table

    member = {
        "node": "n1",
        "progress": [
            {"rank": 1, "step": 40, "last_step_at": 990.0, "steps_per_s": 0.5, "step_time_s": 2.0,
             "samples": 9, "phase": "step", "computing_s": 19.0, "waiting_s": 1.0, "score": 0.5,
             "straggler": True},
            {"rank": 0, "step": None, "last_step_at": None, "steps_per_s": None, "step_time_s": None,
             "samples": 0, "phase": "startup", "computing_s": None, "waiting_s": None, "score": None,
             "straggler": False},
        ],
    }  # fmt: skip
    text = progress_table({"members": [member]}, now=1000.0)  # type: ignore[typeddict-item]
    rows = [line.split() for line in text.splitlines()]
    assert rows[0][:4] == ["RANK", "NODE", "STEP", "STEPS/S"]
    assert rows[0][-2:] == ["SCORE", "COMPUTE/WAIT"]
    assert rows[1] == ["0", "n1", "-", "-", "-", "startup", "-", "-"]
    assert rows[2] == ["1", "n1", "40", "0.5", "10s", "ago", "step", "0.50", "19.0s/1.0s", "straggler"]
    assert progress_table({"members": [{"node": "n1", "progress": [member["progress"][1]]}]}, 0.0) == ""  # type: ignore[typeddict-item]

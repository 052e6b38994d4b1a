"""bench_goodput's arithmetic: torchrun's checkpoint interval, and the figures from a progress log."""

from __future__ import annotations

import sys

from tests.support import REPO

sys.path.append(str(REPO / "bench"))  # bench/ is scripts, not a package

from bench_goodput import Calib, Fault, Line, figures, interval, outside_goodput, schedule


def test_interval_keeps_checkpointing_within_five_percent() -> None:
    assert interval(0.1, 0.05) == 40  # 0.1 s per 40 steps of 0.05 s: 5%
    assert interval(0.101, 0.05) == 41
    assert interval(0.001, 0.05) == 1


def test_figures_count_redone_steps_and_goodput() -> None:
    calib = Calib(step_s=0.1, save_s=0.2, state_bytes=1, every=40)

    def log(*steps: tuple[int, float, int]) -> list[Line]:
        return [Line(step, at, attempt, 0.1, 0.0) for step, at, attempt in steps]

    # steps 0-4, a crash, steps 3 and 4 again (2 redone), a crash after a commit (0 redone: 7
    # follows 6 in the next attempt), then a step past the window's end that does not count
    lines = log((0, 100.0, 0), (1, 100.1, 0), (2, 100.2, 0), (3, 100.3, 0), (4, 100.4, 0), (3, 101.4, 1),
                (4, 101.5, 1), (5, 101.6, 1), (6, 101.7, 1), (7, 102.7, 2), (8, 200.0, 2))  # fmt: skip
    r = figures("x", lines, t0=100.0, duration=10.0, faults=2, calib=calib)
    assert r.useful_steps == 7  # from step 0 to step 7 within [100, 110]
    assert r.capacity_steps == 100.0 and r.goodput == 0.07
    assert (r.resumptions, r.redone, r.redone_max, r.redone_per_fault) == (2, 2, 2, 1.0)
    assert r.downtime_median_s == 1.0


def test_schedule_kills_workers_and_one_node_between_them() -> None:
    assert schedule(180, 30, node_kill=False) == [Fault(30 * k, False, k % 2) for k in range(1, 6)]
    faults = schedule(180, 30, node_kill=True)
    assert [f for f in faults if f.node] == [Fault(75, True, 1)]
    assert [f.at_s for f in faults] == [30, 60, 75, 90, 120, 150]
    assert schedule(20, 30, node_kill=True) == [Fault(15, True, 1)]
    assert schedule(10, 30, node_kill=True) == [Fault(5, True, 1)]


def test_outside_goodput_counts_first_runs_less_their_saves() -> None:
    # a line's time is after its save: the step was reported save_s before it
    lines = [Line(0, 10.0, 0, 0.1, 0.5), Line(1, 11.5, 0, 0.1, 0.5), Line(2, 13.0, 0, 0.1, 0.5),
             Line(1, 20.0, 1, 0.1, 0.5), Line(2, 21.5, 1, 0.1, 0.5), Line(3, 23.0, 1, 0.1, 0.5)]  # fmt: skip
    # steps 1 and 2 (1.5 s apart, less a 0.5 s save: 1 s each), 1 and 2 again (redone), then 3
    assert outside_goodput(lines, 30.0) == 3.0 / 30.0
    assert outside_goodput(lines, 0.0) == 0.0

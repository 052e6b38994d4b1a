"""The soak's closing lines on the job's goodput, from a sample of status's reply."""

from __future__ import annotations

import sys
from typing import Any

from tests.support import REPO

sys.path.append(str(REPO / "bench"))  # bench/ is scripts, not a package

from soak import goodput_lines


def test_the_soak_prints_the_jobs_time_by_cause() -> None:
    reply: dict[str, Any] = {
        "ratio": 0.625,
        "wall_s": 400.0,
        "by_cause_s": {"productive": 250.0, "redone": 2.0, "restart": 100.0, "checkpoint": 8.0,
                       "waiting": 30.0, "hung": 6.0, "startup": 4.0},
    }  # fmt: skip
    lines = goodput_lines(reply)
    assert lines[0] == "goodput: 0.625 of 400.0 s"
    assert lines[1].split() == ["productive", "250.0", "s", "62.5%"]
    assert lines[3].split() == ["restart", "100.0", "s", "25.0%"]
    assert [line.split()[0] for line in lines[1:]] == list(reply["by_cause_s"])


def test_a_job_without_a_figure_says_so() -> None:
    assert goodput_lines(None) == ["goodput: none reported"]
    empty = goodput_lines({"ratio": None, "wall_s": 0.0, "by_cause_s": {"productive": 0.0}})
    assert empty == ["goodput: - of 0.0 s", "  productive       0.0 s     -"]

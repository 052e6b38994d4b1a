"""Goodput in ``status``: the job's figure from its nodes' reports, and the one line that shows it."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest

from elasticctl import render
from elasticd.jobs.view import goodput_of, job_view
from elasticd.progress.goodput import Tally
from elasticd.rendezvous.jobread import RostersRead
from elasticd.rendezvous.model import FinalRecord, NodeStatus
from elasticd.terms.state import EndReason, JobState
from elasticd.wire import JobView
from tests import fakes

SUBMITTED = 1700000000.5  # fakes.make_spec's


def report(at: float, tally: Tally | None) -> NodeStatus:
    return NodeStatus("RUNNING", 0, "", (), at, goodput=tally)


def test_the_nodes_reports_add_up_to_the_wall_time_since_submission() -> None:
    read = RostersRead(fakes.JOB, head=fakes.make_head())
    read = replace(
        read,
        node_status={
            **read.node_status,
            "n1": report(SUBMITTED + 100, Tally(productive_s=80, waiting_s=10, restart_s=10)),
        },
    )
    read = replace(
        read,
        node_status={**read.node_status, "n2": report(SUBMITTED + 50, Tally(productive_s=30, hung_s=20))},
    )  # drained at 50
    read = replace(
        read, node_status={**read.node_status, "n3": report(SUBMITTED + 99, None)}
    )  # an older daemon's
    goodput = goodput_of(read)
    assert goodput is not None and goodput["wall_s"] == 100
    seconds = goodput["by_cause_s"]
    assert sum(seconds.values()) == pytest.approx(100)
    assert seconds["productive"] == pytest.approx(110 / 150 * 100) and goodput["ratio"] == pytest.approx(
        110 / 150
    )
    assert seconds["hung"] == pytest.approx(20 / 150 * 100)
    view = job_view(read, "n1")
    assert view["goodput"] == goodput


def test_an_ended_job_counts_to_its_end_and_a_job_without_reports_has_none() -> None:
    read = RostersRead(fakes.JOB, head=fakes.make_head())
    assert goodput_of(read) is None and "goodput" not in job_view(read, "n1")
    read = replace(
        read,
        node_status={**read.node_status, "n1": report(SUBMITTED + 58, Tally(productive_s=50, startup_s=8))},
    )
    read = replace(read, final=FinalRecord(JobState.SUCCEEDED, "", EndReason.SUCCEEDED, None, SUBMITTED + 60))
    goodput = goodput_of(read)
    assert goodput is not None and goodput["wall_s"] == 60


def test_status_shows_goodput_and_the_largest_losses_on_one_line() -> None:
    read = RostersRead(fakes.JOB, head=fakes.make_head())
    tally = Tally(productive_s=3000, restart_s=300, hung_s=180, checkpoint_s=40, waiting_s=10, startup_s=0.2)
    read = replace(read, node_status={**read.node_status, "n1": report(SUBMITTED + tally.total_s, tally)})
    text = render.job_detail(cast(JobView, job_view(read, "n1")), SUBMITTED + 4000)
    line = next(x for x in text.splitlines() if x.startswith("goodput:"))
    assert line == "goodput:        0.85 of 58m50s; lost: restart 5m00s, hung 3m00s, checkpoint 40s"
    empty = replace(read.node_status["n1"], goodput=Tally())
    read = replace(read, node_status={**read.node_status, "n1": empty})
    assert "goodput:" not in render.job_detail(cast(JobView, job_view(read, "n1")), SUBMITTED + 4000)

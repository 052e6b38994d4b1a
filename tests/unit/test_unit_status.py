"""A job's lifecycle in ``status``: an ended job's world and members' end states, start and end
times (``elasticd.jobs.view``), their rendering, ISO 8601 in JSON, and the status command's
filters, ids and one look of ``--watch`` (``elasticctl.render``, ``elasticctl.views.status``)."""

from __future__ import annotations

import argparse
import json
import time
import typing
from dataclasses import replace
from datetime import datetime
from typing import Any, cast

import pytest

from elasticctl import render
from elasticctl.commands import status as status_command
from elasticctl.entry import UsageError
from elasticctl.parser import build_parser
from elasticctl.views import status as status_view
from elasticd import wire
from elasticd.control.params import parse_args
from elasticd.decode import Unknown, decode
from elasticd.jobs.view import job_row, job_view, selected, started_at
from elasticd.rendezvous.decider import build_result
from elasticd.rendezvous.jobread import InvalidKey, RostersRead
from elasticd.rendezvous.model import FinalRecord, Join, NodeStatus, RoundInfo
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason, WorkerFailure
from elasticd.wire import JobRow, JobView, MemberEndState, StatusArgs, request
from tests import fakes

JOB = fakes.JOB
SUBMITTED = 1700000000.5  # fakes.make_spec's
CLOSED = SUBMITTED + 4.0


def job_read(
    round_no: int,
    members: tuple[str, ...] = (),
    *,
    result_round: int | None = None,
    final: FinalRecord | None = None,
    failure: dict[str, Any] | None = None,
    **fields: Any,
) -> RostersRead:
    """A job in round ``round_no`` whose round ``result_round`` (default: that one) closed with
    ``members`` (2 workers each)."""
    read = RostersRead(JOB, head=fakes.make_head(nnodes=NodeRange(1, 4)), final=final, **fields)
    read = replace(read, round=RoundInfo(round_no, RoundReason.START, 0.0, failure=failure))
    if members:
        r = round_no if result_round is None else result_round
        joins = [Join(n, f"10.0.0.{i + 1}", 29400 + i, 2, 0) for i, n in enumerate(members)]
        read = replace(read, results={**read.results, r: build_result(r, joins, CLOSED + r)})
    return read


def failure(node: str, attempt: int) -> dict[str, Any]:
    return WorkerFailure.from_exit(
        node=node, attempt=attempt, rank=1, local_rank=1, returncode=3, message="", tail=""
    ).to_json()


def final(state: JobState, code: EndReason, fail: dict[str, Any] | None = None) -> FinalRecord:
    return FinalRecord(state, "", code, fail, CLOSED + 60.0)


def status(state: str, round_no: int, fail: dict[str, Any] | None = None) -> NodeStatus:
    return NodeStatus(state, round_no, "0,1", (), 1.0, fail)


def members(view: dict[str, Any]) -> dict[str, str]:
    return {m["node"]: m["state"] for m in view["members"]}


# -- the end of a job, from what its records hold after it -------------------------------------------
def test_a_succeeded_job_keeps_its_world_and_says_each_member_succeeded() -> None:
    read = job_read(
        0,
        ("n1", "n2"),
        final=final(JobState.SUCCEEDED, EndReason.SUCCEEDED),
        done={0: {"n1", "n2"}},
        node_status={"n1": status("STOPPING", 0), "n2": status("LEFT", 0)},  # what agents left behind
    )
    view = job_view(read, "n1")
    assert (view["state"], view["world_size"], view["nodes"]) == ("SUCCEEDED", 4, ["n1", "n2"])
    assert members(view) == {"n1": "SUCCEEDED", "n2": "SUCCEEDED"}
    assert view["master"] == "10.0.0.1:29400"
    assert view["node_states"] == {"n1": "STOPPING", "n2": "LEFT"}  # as published, unchanged


def test_a_failed_job_names_the_failed_stopped_and_lost_members() -> None:
    read = job_read(
        2,
        ("n1", "n2", "n3", "n4"),
        final=final(JobState.FAILED, EndReason.WORKER_FAILED, failure("n2", 2)),
        node_status={
            "n1": status("STOPPING", 2),
            "n2": status("STOPPING", 2),
            "n4": status("FAILED", 2, failure("n4", 2)),  # crashed with it, reported its own
        },  # n3: no status (its daemon is gone)
    )
    view = job_view(read, "n1")
    assert view["world_size"] == 8
    assert members(view) == {"n1": "STOPPED", "n2": "FAILED", "n3": "LOST", "n4": "FAILED"}


def test_a_failure_of_an_earlier_round_fails_no_member_of_the_last() -> None:
    read = job_read(
        3,
        ("n1", "n2"),
        final=final(JobState.FAILED, EndReason.WORKER_FAILED, failure("n2", 1)),
        node_status={"n1": status("STOPPING", 3), "n2": status("STOPPING", 3, failure("n2", 1))},
    )
    assert members(job_view(read, "n1")) == {"n1": "STOPPED", "n2": "STOPPED"}


def test_a_killed_job_says_killed_except_for_members_done_or_lost() -> None:
    read = job_read(
        1,
        ("n1", "n2", "n3"),
        final=final(JobState.KILLED, EndReason.KILLED),
        done={1: {"n3"}},
        node_status={"n1": status("STOPPING", 1)},
    )
    assert members(job_view(read, "n1")) == {"n1": "KILLED", "n2": "LOST", "n3": "SUCCEEDED"}


def test_a_job_that_ended_between_rounds_shows_the_last_round_that_ran() -> None:
    """Round 2 failed on n2, round 3 never closed (join timeout): round 2's result is kept."""
    read = job_read(
        3,
        ("n1", "n2"),
        result_round=2,
        final=final(JobState.FAILED, EndReason.JOIN_TIMEOUT),
        failure=failure("n2", 2),  # what opened round 3
        node_status={"n1": status("JOINING", 3)},
    )
    view = job_view(read, "n1")
    assert (view["round"], view["world_size"], view["master"]) == (3, 4, "10.0.0.1:29400")
    assert members(view) == {"n1": "STOPPED", "n2": "FAILED"}


def test_a_job_ended_by_an_invalid_record_has_end_states_too() -> None:
    read = job_read(0, ("n1",), node_status={"n1": status("RUNNING", 0)})
    read = replace(read, invalid=(InvalidKey(f"jobs/{JOB}/rdzv/0/join/n1", "port: must be int", 5),))
    assert members(job_view(read, "n1")) == {"n1": "STOPPED"}


def test_a_job_that_never_ran_has_no_world() -> None:
    view = job_view(job_read(0, final=final(JobState.KILLED, EndReason.KILLED)), "n1")
    assert (view["world_size"], view["members"], view["master"]) == (0, [], "")
    assert (view["started_at"], view["ended_at"]) == (None, CLOSED + 60.0)


def test_a_running_job_shows_its_members_agent_states() -> None:
    read = job_read(1, ("n1", "n2"), node_status={"n1": status("RUNNING", 1)})
    assert members(job_view(read, "n1")) == {"n1": "RUNNING", "n2": "GONE"}


def test_end_states_are_the_wire_states() -> None:
    assert {s.value for s in MemberEndState} == {"SUCCEEDED", "FAILED", "KILLED", "STOPPED", "LOST"}
    view = job_view(job_read(0, ("n1",), final=final(JobState.KILLED, EndReason.KILLED)), "n1")
    decode(JobView, json.loads(json.dumps(view)), unknown=Unknown.REJECT)


# -- start and end ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("read", "expected"),
    [
        (job_read(0), None),  # pending: never ran
        (job_read(0, ("n1",)), CLOSED),  # round 0's close
        (job_read(1, ("n1",), result_round=0), CLOSED),
        (job_read(5, ("n1",)), SUBMITTED),  # round 0's result is deleted: the submission stands in
        (job_read(0, final=final(JobState.FAILED, EndReason.JOIN_TIMEOUT)), None),
    ],
)
def test_started_at(read: RostersRead, expected: float | None) -> None:
    assert started_at(read) == expected
    assert job_view(read, "n1")["started_at"] == expected


def test_started_at_of_an_old_result_without_its_close() -> None:
    read = job_read(0, ("n1",))
    read = replace(read, results={**read.results, 0: build_result(0, [Join("n1", "10.0.0.1", 1, 2, 0)], 0.0)})
    assert started_at(read) == SUBMITTED


# -- filters ---------------------------------------------------------------------------------------
def test_selected_by_state_and_user() -> None:
    running = job_read(0, ("n1",))
    killed = job_read(0, final=final(JobState.KILLED, EndReason.KILLED))
    assert selected(running, (), None) and selected(running, [JobState.RUNNING], "u")
    assert not selected(running, [JobState.KILLED, JobState.FAILED], None)
    assert selected(killed, [JobState.KILLED, JobState.FAILED], None)
    assert not selected(running, (), "someone-else")
    unreadable = RostersRead(JOB, invalid=(InvalidKey(f"jobs/{JOB}/spec", "bad", 3),), found=3)
    assert selected(unreadable, [JobState.FAILED], None) and not selected(unreadable, (), "u")


# -- rendering: local times, durations, ISO 8601 ------------------------------------------------------
def test_iso_times_converts_every_time_and_nothing_else() -> None:
    at = datetime.fromisoformat("2026-11-23T16:40:00.123+00:00").timestamp()
    view = {
        "ended_at": at,
        "started_at": None,
        "restarts": 3,
        "failure": {"failed_at": at, "also_failed": [{"failed_at": at, "rank": 2}]},
        "argv": ["ended_at"],
        "stale": True,
    }
    iso = "2026-11-23T16:40:00.123+00:00"
    assert render.iso_times(view) == view | {
        "ended_at": iso,
        "failure": {"failed_at": iso, "also_failed": [{"failed_at": iso, "rank": 2}]},
    }


def _hints(td: Any) -> dict[str, Any]:
    return typing.get_type_hints(td)


# Floats without a unit: a rank's slowness score, a job's goodput (0..1), a node check's compute
# (iterations a second) and bulk rate (bytes a second).
RATIOS = {"score", "ratio", "compute", "bytes_per_s"}


def test_time_fields_are_every_time_of_the_wire() -> None:
    """The wire's convention, which ``iso_times`` relies on: times are floats in ``*_at`` fields,
    and ``TIME_FIELDS`` lists them all."""
    found = set()
    for name in dir(wire):
        td = getattr(wire, name)
        if not typing.is_typeddict(td):
            continue
        for field, hint in _hints(td).items():
            floats = float in (typing.get_args(hint) or (hint,))
            if field.endswith("_at"):
                assert floats, f"{name}.{field}"
                found.add(field)
            elif floats and field not in RATIOS:
                assert field.endswith("_s"), f"{name}.{field}: a float that is neither a time nor seconds"
    assert found == wire.TIME_FIELDS


NOW = datetime(2026, 11, 23, 16, 40, 0).timestamp()  # local time


@pytest.mark.parametrize(
    ("ts", "text"),
    [
        (None, "-"),
        (NOW - 65, "16:38:55"),
        (datetime(2026, 3, 2, 9, 5, 7).timestamp(), "Mar 02 09:05"),
        (datetime(2025, 12, 31, 23, 0).timestamp(), "2025-12-31"),
    ],
)
def test_short_time(ts: float | None, text: str) -> None:
    assert render.short_time(ts, NOW) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (59.9, "59s"), (65, "1m05s"), (3725, "1h02m"), (2 * 86400 + 3 * 3600, "2d03h")],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert render.duration(seconds) == text


def _view(read: RostersRead) -> JobView:
    return typing.cast(JobView, json.loads(json.dumps(job_view(read, "n1"))))


def test_jobs_table_has_started_ended_and_duration() -> None:
    ended = job_read(0, ("n1",), final=final(JobState.SUCCEEDED, EndReason.SUCCEEDED), done={0: {"n1"}})
    running, pending = job_read(0, ("n1",)), job_read(0)
    now = CLOSED + 3725
    lines = render.jobs_table([_view(ended), _view(running), _view(pending)], now).splitlines()
    header = lines[0].split()
    assert header[5:9] == ["RESTARTS", "STARTED", "ENDED", "DURATION"]
    started = render.short_time(CLOSED, now)
    assert lines[1].split()[6:9] == [started, render.short_time(CLOSED + 60, now), "1m00s"]
    assert lines[2].split()[6:9] == [started, "-", "1h02m"]  # until now
    assert lines[3].split()[4:9] == ["0", "0/3", "-", "-", "-"]  # never ran


def test_job_detail_has_local_times_and_the_duration() -> None:
    read = job_read(0, ("n1",), final=final(JobState.KILLED, EndReason.KILLED))
    read = replace(read, node_status={**read.node_status, "n1": status("STOPPING", 0)})
    text = render.job_detail(_view(read), CLOSED + 1000)
    assert f"started:        {render.long_time(CLOSED)}" in text
    assert f"ended:          {render.long_time(CLOSED + 60)}" in text
    assert "duration:       1m00s" in text
    assert "KILLED" in [line.split()[3] for line in text.splitlines() if line.startswith("  n1")]


# -- the status command ------------------------------------------------------------------------------
class Canned:
    """Answers ``status`` from canned views, as the daemon would (filters applied), and records requests."""

    def __init__(self, *reads: RostersRead) -> None:
        self.snaps = reads
        self.sent: list[StatusArgs] = []

    def request(self, cmd: str, args: object, timeout_s: float | None = None) -> Any:
        assert cmd == "status" and isinstance(args, StatusArgs)
        self.sent.append(parse_args(StatusArgs, json.loads(json.dumps(request(args)))))
        views = [job_view(s, "n1") for s in self.snaps if selected(s, args.states, args.user)]
        if args.job is not None:
            return json.loads(json.dumps({"job": views[0]}))
        if args.rows:
            return json.loads(json.dumps({"rows": [job_row(v) for v in views]}))
        return json.loads(json.dumps({"jobs": views}))


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["status", *argv])


def ended(job_id: str, state: JobState = JobState.SUCCEEDED) -> RostersRead:
    code = EndReason.SUCCEEDED if state is JobState.SUCCEEDED else EndReason.KILLED
    read = job_read(0, ("n1",), final=final(state, code), done={0: {"n1"}})
    read = replace(read, job_id=job_id)
    return read


def test_refresh_sends_the_filters_and_prints_ids() -> None:
    client = Canned(ended("a"), job_read(0, ("n1",)), ended("b", JobState.KILLED))
    assert status_view.refresh(client, parse("--state", "succeeded,Killed", "--user", "u", "-q")) == "a\nb"
    assert client.sent == [StatusArgs(None, [JobState.SUCCEEDED, JobState.KILLED], "u", rows=True)]
    assert status_view.refresh(client, parse("-q", "--user", "nobody")) == ""


def test_refresh_as_json_has_iso_times() -> None:
    out = json.loads(status_view.refresh(Canned(ended("a")), parse("a", "--json")))
    assert out["id"] == "a" and out["ended_at"] == render.iso(CLOSED + 60)
    assert out["started_at"] == render.iso(CLOSED) and out["submitted_at"] == render.iso(SUBMITTED)
    assert render.iso(CLOSED)[-10:] == ".500+00:00"
    listed = json.loads(status_view.refresh(Canned(ended("a")), parse("--json")))
    assert [j["ended_at"] for j in listed] == [render.iso(CLOSED + 60)]


def test_refresh_renders_the_table_or_the_detail() -> None:
    client = Canned(ended("a"))
    assert status_view.refresh(client, parse(), lambda: CLOSED).splitlines()[0].split()[0] == "JOB"
    assert status_view.refresh(client, parse("a"), lambda: CLOSED).splitlines()[0].split() == ["id:", "a"]
    assert [a.rows for a in client.sent] == [True, False]  # the table asks for rows, a job for its view
    listed = status_view.refresh(client, parse("--json"))
    assert client.sent[-1].rows is False and json.loads(listed)[0]["argv"]  # whole views


def test_the_table_of_rows_is_the_table_of_views() -> None:
    """A ``JobRow`` carries every field the table shows: the table drawn from rows is the same."""
    failed = job_read(0, ("n1", "n2"), final=final(JobState.FAILED, EndReason.WORKER_FAILED))
    reads = [ended("a"), job_read(0, ("n1",)), failed, job_read(0)]
    views = [job_view(s, "n1") for s in reads]
    views[-1]["queue"] = {"place": 2, "of": 7, "why": "its turn"}
    rows: list[JobRow] = [json.loads(json.dumps(job_row(v))) for v in views]
    rows[-1]["queue"] = {"place": 2, "of": 7}
    assert render.jobs_table(rows, CLOSED) == render.jobs_table(cast(list[JobView], views), CLOSED)
    assert all(len(json.dumps(r)) < len(json.dumps(v)) / 2 for r, v in zip(rows, views, strict=True))


@pytest.mark.parametrize(
    "argv",
    [["--state", "DONE"], ["--watch", "0"], ["--watch", "x"], ["--json", "-q"]],
)
def test_bad_status_options_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2


def test_filters_do_not_go_with_a_job() -> None:
    with pytest.raises(UsageError, match="--state and --user"):
        status_view.status_args(parse("a", "--state", "RUNNING"))


def test_watch_defaults_and_stops_with_exit_0_on_ctrl_c(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse("--watch").watch == status_command.WATCH_DEFAULT_S and parse().watch is None
    assert parse("--watch", "0.5").watch == 0.5
    client = Canned(ended("a"))
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", sleep)
    assert status_view.run(client, parse("-q", "--state", "SUCCEEDED", "--watch", "0.5")) == 0
    assert capsys.readouterr().out == "a\n\na\n\n"  # two looks, an empty line after each
    assert sleeps == [0.5, 0.5]


# -- the cause: failures classified --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "fail", "cause"),
    [
        (EndReason.SUCCEEDED, None, None),
        (EndReason.KILLED, None, None),
        (EndReason.WORKER_FAILED, "user_code", "user_code"),
        (EndReason.REPEATED_FAILURE, "hang", "hang"),
        (EndReason.OOM, "oom", "oom"),
        (EndReason.NODES_LOST, None, "node_lost"),
        (EndReason.ENTRY_UNAVAILABLE, None, "infrastructure"),
        (EndReason.LOG_DISK_FULL, None, "infrastructure"),
        (EndReason.JOIN_TIMEOUT, None, "infrastructure"),
    ],
)
def test_status_classifies_what_ended_the_job(code: EndReason, fail: str | None, cause: str | None) -> None:
    stored = failure("a", 0) | {"kind": fail} if fail else None
    state = {EndReason.SUCCEEDED: JobState.SUCCEEDED, EndReason.KILLED: JobState.KILLED}.get(
        code, JobState.FAILED
    )
    view = job_view(job_read(0, ("a",), final=final(state, code, stored)), "a")
    assert view["cause"] == cause


def test_status_of_a_running_job_names_the_cause_of_its_last_restart() -> None:
    read = job_read(1, ("a",), failure=failure("a", 0) | {"kind": "signal"})
    assert job_view(read, "a")["cause"] == "signal"
    lost = job_read(1, ("a",))
    assert lost.round is not None
    lost = replace(lost, round=RoundInfo(1, RoundReason.MEMBER_LOST, 0.0))
    assert job_view(lost, "a")["cause"] == "node_lost"
    assert job_view(job_read(0, ("a",)), "a")["cause"] is None


def test_the_failure_text_names_the_exception_the_hang_frame_and_other_nodes_ranks() -> None:
    fail = failure("b", 2) | {
        "exception": "ZeroDivisionError",
        "frame": "train.py:42 in step",
        "also_failed": [
            {
                "rank": 0,
                "local_rank": 0,
                "exit_code": 1,
                "signal": None,
                "message": "",
                "failed_at": None,
                "node": "a",
            }
        ],
    }
    text = render.failure(typing.cast(JobView, {"failure": fail}))
    assert "exit code 3 (ZeroDivisionError)" in text
    assert "hung in: train.py:42 in step" in text
    assert "also failed: rank 0 (on a), exit code 1" in text


def test_a_waiting_jobs_place_in_the_queue_is_shown() -> None:
    pending = _view(job_read(0))
    pending["queue"] = {"place": 3, "of": 12, "why": "priority 0; u's waiting job 2, in turn 2"}
    running = _view(job_read(0, ("n1",)))
    lines = render.jobs_table([pending, running], CLOSED).splitlines()
    assert lines[0].split()[9] == "QUEUE"
    assert lines[1].split()[9] == "3/12" and lines[2].split()[9] == "-"
    assert "queue:          3 of 12 waiting (priority 0; u's waiting job 2, in turn 2)" in render.job_detail(
        pending, CLOSED
    )
    assert "queue:" not in render.job_detail(running, CLOSED)


def test_gpus_table() -> None:
    from elasticctl.render import gpus_table

    node: Any = {
        "node": "n1",
        "inventory": {"gpus": [{"index": 0, "uuid": "GPU-a", "memory_mib": 81559, "mig": []},
                               {"index": 1, "uuid": "GPU-b", "memory_mib": 81559,
                                "mig": [{"uuid": "MIG-x"}]}]},
        "gpu_states": [
            {"uuid": "GPU-a", "state": "healthy", "reason": "", "memory_used_mib": 1024,
             "utilization_pct": 35, "job": "train", "rank": 3},
            {"uuid": "GPU-b", "state": "unhealthy", "reason": "Xid 79", "memory_used_mib": None,
             "utilization_pct": None, "job": None, "rank": None},
        ],
    }  # fmt: skip
    text = gpus_table([node])
    assert text is not None
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "GPU", "UUID", "STATE", "MEMORY", "UTIL", "JOB", "RANK", "REASON"]
    assert lines[1].split() == ["n1", "0", "GPU-a", "healthy", "1024/81559", "MiB", "35%", "train", "3"]
    assert "1 (MIG x1)" in lines[2] and lines[2].rstrip().endswith("Xid 79")
    assert gpus_table([cast(Any, {"node": "cpu-host", "inventory": {"gpus": []}})]) is None

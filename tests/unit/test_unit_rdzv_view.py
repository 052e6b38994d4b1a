"""elasticd.jobs.view: a job's state and status view, derived from a read of its keys."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from elasticd.jobs.view import job_state, job_view
from elasticd.rendezvous.decider import build_result
from elasticd.rendezvous.jobread import InvalidKey, RostersRead, bare
from elasticd.rendezvous.model import FinalRecord, Join, NodeStatus, RoundInfo, WaitingRecord
from elasticd.terms.spec import JobSpec, NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason, WorkerFailure
from tests import fakes

JOB = "train-0a1b2c3d"


def make_spec(**overrides: Any) -> JobSpec:
    return fakes.make_spec(
        **(
            {"nnodes": NodeRange(2, 3), "max_restarts": 5, "submitted_on": "n1", "nodes": ("n1", "n2", "n3")}
            | overrides
        )
    )


FAILURE = WorkerFailure.from_exit(
    node="n2", attempt=1, rank=3, local_rank=1, returncode=-9, message="", tail="oom\n"
).to_json()


def job_read(
    round_no: int = 0,
    *,
    spec: JobSpec | None = None,
    joins: tuple[str, ...] = (),
    members: tuple[tuple[str, int], ...] | None = None,
    final: FinalRecord | None = None,
    detail: str = "",
    failure: dict[str, Any] | None = None,
    **fields: Any,
) -> RostersRead:
    read = RostersRead(JOB, head=fakes.head_of(spec or make_spec()), final=final, **fields)
    read = replace(read, round=RoundInfo(round_no, RoundReason.START, 0.0, detail=detail, failure=failure))
    read = replace(
        read,
        joins={
            **read.joins,
            round_no: tuple(Join(n, f"h-{n}", 29500, 2, i + 1) for i, n in enumerate(joins)),
        },
    )
    if members is not None:
        ordered = [Join(n, f"10.0.0.{i + 1}", 29400 + i, lws, 0) for i, (n, lws) in enumerate(members)]
        read = replace(read, results={**read.results, round_no: build_result(round_no, ordered, 1.0)})
    return read


_CODES = {"SUCCEEDED": EndReason.SUCCEEDED, "KILLED": EndReason.KILLED, "FAILED": EndReason.WORKER_FAILED}


def _final(state: str, reason: str = "", failure: dict[str, Any] | None = None) -> FinalRecord:
    return FinalRecord(JobState(state), reason, _CODES[state], failure, 99.0)


def _status(state: str, devices: str, pids: list[int]) -> NodeStatus:
    return NodeStatus(state, 2, devices, tuple(pids), 1.0)


# -- job_state ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("read", "state"),
    [
        (RostersRead(JOB), JobState.PENDING),
        (job_read(0), JobState.PENDING),
        (job_read(0, joins=("n1",)), JobState.PENDING),
        (job_read(1), JobState.RESTARTING),
        (job_read(7, joins=("n1", "n2")), JobState.RESTARTING),
        (job_read(0, members=(("n1", 2),)), JobState.RUNNING),
        (job_read(3, members=(("n1", 2),)), JobState.RUNNING),
        (job_read(0, final=_final("SUCCEEDED")), JobState.SUCCEEDED),
        (job_read(2, final=_final("FAILED"), members=(("n1", 2),)), JobState.FAILED),  # final wins
        (job_read(0, final=_final("KILLED")), JobState.KILLED),
    ],
)
def test_job_state(read: RostersRead, state: JobState) -> None:
    assert job_state(read) is state


def test_job_state_restarting_when_only_an_earlier_round_has_a_result() -> None:
    read = job_read(2, joins=("n1",))
    read = replace(read, results={**read.results, 1: build_result(1, [Join("n1", "h", 1, 2, 0)], 0.0)})
    assert job_state(read) is JobState.RESTARTING


# -- job_view ----------------------------------------------------------------------------------------


# test_view_running's members, in group rank order
_RUNNING_MEMBERS = [
    {
        "node": "n2",
        "address": "10.0.0.1",
        "group_rank": 0,
        "ranks": [0, 1],
        "state": "RUNNING",
        "devices": "0,1",
        "pids": [5, 6],
    },
    {
        "node": "n1",
        "address": "10.0.0.2",
        "group_rank": 1,
        "ranks": [2, 2],
        "state": "RUNNING",
        "devices": "0",
        "pids": [7],
    },
    # no status from n3: its daemon is gone
    {
        "node": "n3",
        "address": "10.0.0.3",
        "group_rank": 2,
        "ranks": [3, 6],
        "state": "GONE",
        "devices": "",
        "pids": [],
    },
]


def test_view_running() -> None:
    read = job_read(
        2,
        joins=("n1", "n2", "n3"),
        members=(("n2", 2), ("n1", 1), ("n3", 4)),
        restarts=1,
        waiting={"n5": WaitingRecord(1.0), "n4": WaitingRecord(2.0)},
        node_status={
            "n1": _status("RUNNING", "0", [7]),
            "n2": _status("RUNNING", "0,1", [5, 6]),
        },
    )
    view = job_view(read, "n2")
    assert view["id"] == JOB
    assert view["state"] == "RUNNING"
    assert view["reason"] == "round 2"
    assert view["round"] == view["attempt"] == 2
    assert view["restarts"] == 1
    assert view["world_size"] == 7
    assert view["master"] == "10.0.0.1:29400"
    assert view["nodes"] == ["n2", "n1", "n3"]
    assert view["members"] == _RUNNING_MEMBERS
    assert view["waiting_nodes"] == ["n4", "n5"]
    assert view["node_states"] == {"n1": "RUNNING", "n2": "RUNNING"}
    assert (view["devices"], view["pids"]) == ("0,1", [5, 6])  # the local node's
    assert view["ended_at"] is None
    assert "error" not in view and "failure" not in view
    spec = make_spec()
    assert {k: view[k] for k in ("name", "user", "max_restarts", "nnodes", "nproc_per_node", "argv")} == {
        "name": "train",
        "user": "u",
        "max_restarts": 5,
        "nnodes": "2:3",
        "nproc_per_node": 2,
        "argv": spec.argv,
    }
    assert (view["submitted_at"], view["submitted_on"]) == (1700000000.5, "n1")
    assert view["allowed_nodes"] == ["n1", "n2", "n3"]


def test_a_job_of_one_node_at_most_shows_the_loopback_master_its_ranks_were_told() -> None:
    spec = make_spec(nnodes=NodeRange(1, 1), nodes=("n1",))
    view = job_read(0, spec=spec, members=(("n1", 2),))
    assert job_view(view, "n1")["master"] == "127.0.0.1:29400"


def test_view_member_ranks_cover_the_world() -> None:
    view = job_view(job_read(1, members=(("a", 3), ("b", 1), ("c", 2))), "a")
    ranks = [r for m in view["members"] for r in range(m["ranks"][0], m["ranks"][1] + 1)]
    assert ranks == list(range(view["world_size"]))


def test_view_local_node_not_a_member() -> None:
    view = job_view(job_read(0, members=(("n1", 2),)), "elsewhere")
    assert (view["devices"], view["pids"]) == ("", [])


def test_view_pending() -> None:
    read = job_read(0, joins=("n1",), pending={"n2": "n2 is waiting for 2 free GPUs (0 of 8 free now)"})
    view = job_view(read, "n1")
    assert view["state"] == "PENDING"
    assert view["reason"] == "n2 is waiting for 2 free GPUs (0 of 8 free now); 1 of 2 node(s) joined round 0"
    assert view["world_size"] == 0
    assert view["members"] == [] and view["nodes"] == []
    assert view["master"] == ""
    assert view["round"] == 0


def test_view_pending_without_notes() -> None:
    assert job_view(job_read(0), "n1")["reason"] == "0 of 2 node(s) joined round 0"


def test_a_view_from_the_read_of_every_job_counts_no_join() -> None:
    """The read of every job carries no join (a ``JobRead``, not a ``JoinsRead``): its view says
    what the round needs, not how many joined, and that it waits on its nodes; ``status <job>``
    counts them."""
    view = job_view(bare(job_read(0)), "n1")
    assert view["reason"] == "round 0 needs 2 node(s)" and view["waits_for"] == "nodes"


def test_view_restarting() -> None:
    read = job_read(
        3,
        joins=("n1", "n3"),
        detail="rank 3 failed",
        failure=FAILURE,
        pending={"n4": "note four", "n5": "note five"},
        restarts=2,
    )
    read = replace(
        read,
        results={
            **read.results,
            2: build_result(2, [Join("n1", "h", 1, 2, 0), Join("n2", "h", 1, 2, 0)], 0.0),
        },
    )
    view = job_view(read, "n1")
    assert view["state"] == "RESTARTING"
    assert view["reason"] == "rank 3 failed; note four; note five; 2 of 2 node(s) joined round 3"
    assert view["world_size"] == 0  # not running: the previous round's world is gone
    assert view["members"] == [] and view["master"] == ""
    assert view["failure"] == FAILURE  # the failure that opened the round
    assert "error" not in view
    assert (view["round"], view["restarts"]) == (3, 2)


def test_view_without_spec() -> None:
    read = job_read(0, joins=("n1",))
    read = replace(read, head=None)
    view = job_view(read, "n1")
    assert view["reason"] == "1 of 1 node(s) joined round 0"
    assert "name" not in view and "argv" not in view


@pytest.mark.parametrize(
    ("final", "error"),
    [
        (_final("FAILED", "no restarts left (3 of 3 used)", FAILURE), "no restarts left (3 of 3 used)"),
        (_final("FAILED", "", FAILURE), WorkerFailure(**FAILURE).summary()),
        (_final("FAILED", ""), "failed"),
    ],
)
def test_view_failed(final: FinalRecord, error: str) -> None:
    read = job_read(
        2, members=(("n1", 2), ("n2", 2)), final=final, node_status={"n1": _status("STOPPING", "", [1, 2])}
    )
    view = job_view(read, "n1")
    assert view["state"] == "FAILED"
    assert view["error"] == error
    assert view["reason"] == final.reason
    assert view["code"] == "worker_failed"
    assert view["world_size"] == 4  # the last round's world, kept after the end
    assert view["pids"] == []  # terminal: no live workers shown
    assert view["ended_at"] == final.ended_at


def test_view_failed_failure_from_final_wins_over_round() -> None:
    other = FAILURE | {"rank": 0, "message": "round's"}
    read = job_read(1, final=_final("FAILED", "", FAILURE), failure=other)
    view = job_view(read, "n1")
    assert view["failure"] == FAILURE
    assert view["error"] == WorkerFailure(**FAILURE).summary()


def test_view_failed_falls_back_to_round_failure() -> None:
    read = job_read(1, final=_final("FAILED", ""), failure=FAILURE)
    assert job_view(read, "n1")["error"] == WorkerFailure(**FAILURE).summary()


@pytest.mark.parametrize("state", ["SUCCEEDED", "KILLED"])
def test_view_ended_without_error(state: str) -> None:
    read = job_read(1, members=(("n1", 2),), final=_final(state, "killed by u" if state == "KILLED" else ""))
    view = job_view(read, "n1")
    assert view["state"] == state
    assert "error" not in view
    assert view["world_size"] == 2  # the last round's
    assert view["ended_at"] == 99.0
    assert view["reason"] == ("killed by u" if state == "KILLED" else "")


def test_view_of_a_job_with_an_invalid_record_is_failed_naming_the_key() -> None:
    read = job_read(0, members=(("n1", 2),))
    read = replace(read, invalid=(InvalidKey(f"jobs/{JOB}/rdzv/0/join/n1", "port: must be int, got str", 5),))
    view = job_view(read, "n1")
    assert view["state"] == "FAILED" and view["code"] == "invalid_record"
    assert (
        view["reason"]
        == view["error"]
        == f"invalid record at jobs/{JOB}/rdzv/0/join/n1: port: must be int, got str"
    )
    assert view["invalid_records"] == [
        {"key": f"jobs/{JOB}/rdzv/0/join/n1", "why": "port: must be int, got str"}
    ]


def test_view_of_a_job_whose_spec_is_unreadable() -> None:
    read = RostersRead(
        JOB, invalid=(InvalidKey(f"jobs/{JOB}/spec", "malformed job spec: uid ...", 3),), found=3
    )
    view = job_view(read, "n1")
    assert (view["id"], view["state"]) == (JOB, "FAILED")
    assert f"jobs/{JOB}/spec" in view["reason"] and "argv" not in view


def test_final_wins_over_invalid_records() -> None:
    read = job_read(1, final=_final("KILLED", "killed by u"))
    read = replace(read, invalid=(InvalidKey(f"jobs/{JOB}/pending/n1", "must be str, got int", 5),))
    view = job_view(read, "n1")
    assert (view["state"], view["reason"], view["code"]) == ("KILLED", "killed by u", "killed")

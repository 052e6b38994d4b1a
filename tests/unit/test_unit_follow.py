"""Following a job from the CLI, against canned replies: the job's life told once per change, from
the view every logs reply carries; what logs asks for; where other nodes' ranks are; --since; and
which ranks and attempts the daemon refuses (``elasticd.jobs.logscope``)."""

from __future__ import annotations

import argparse
import datetime
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from elasticctl import cli, exits, life
from elasticctl.client import Client, DaemonError
from elasticctl.commands.logs import parse_since
from elasticctl.follow import elsewhere_notes
from elasticctl.life import Life
from elasticctl.parser import build_parser
from elasticd.control.params import parse_args
from elasticd.errors import AttemptNotFound, InvalidArgs, RankNotFound
from elasticd.jobs.logscope import check_scope, round_view, spans
from elasticd.jobs.ranktext import NO_TIME
from elasticd.jobs.view import job_view
from elasticd.rendezvous.decider import build_result
from elasticd.rendezvous.jobread import RostersRead
from elasticd.rendezvous.model import FinalRecord, Join, RoundInfo
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason, WorkerFailure
from elasticd.wire import LogsArgs, RoundView
from tests import fakes

JOB = fakes.JOB
FAILURE = WorkerFailure.from_exit(
    node="n1", attempt=0, rank=1, local_rank=1, returncode=3, message="", tail="boom\n"
).to_json()


def job_read(
    round_no: int,
    reason: RoundReason = RoundReason.START,
    *,
    members: tuple[tuple[str, int], ...] = (),
    nnodes: NodeRange | None = None,
    **fields: Any,
) -> RostersRead:
    spec = fakes.make_spec(nnodes=nnodes or NodeRange(1, 2), max_restarts=3)
    read = RostersRead(JOB, head=fakes.head_of(spec), found=3, **fields)
    detail = WorkerFailure(**{**FAILURE, "also_failed": ()}).summary()
    failed = reason is RoundReason.WORKER_FAILED
    info = RoundInfo(round_no, reason, 100.0 + round_no, detail=detail if failed else "",
                     failure=FAILURE if failed else None)  # fmt: skip
    read = replace(read, round=info)
    if members:
        joins = [Join(n, f"10.0.0.{i + 1}", 29400 + i, size, 0) for i, (n, size) in enumerate(members)]
        read = replace(
            read, results={**read.results, round_no: build_result(round_no, joins, 110.0 + round_no)}
        )
    return read


def reply(read: RostersRead, chunks: list[tuple[int, int, str]] | None = None, more: bool = False) -> Any:
    """A logs reply as the daemon sends it, with the job as ``snap`` has it."""
    chunks = chunks or []
    view = job_view(read, "n1")
    return json.loads(json.dumps({
        "chunks": [{"attempt": a, "rank": r, "text": t} for a, r, t in chunks],
        "cursor": {f"attempt_{a}/rank_{r}.log": len(t) for a, r, t in chunks},
        "state": view["state"], "node": "n1", "more": more, "job": view, "round_info": round_view(read),
        "attempt_started_at": {"0": 100.0, "1": 150.0},
    }))  # fmt: skip


RESTARTED = (
    "restarting: round 1 (restart 1 of 3): a worker failed: rank 1 (local 1 on n1) failed with exit code 3"
)
PENDING = job_read(0, pending={"n1": "n1 is waiting for 2 free slots (0 of 2 free now)"})
RUNNING = job_read(0, members=(("n1", 2),))
RESTARTING = job_read(1, RoundReason.WORKER_FAILED, restarts=1)
RUNNING_AGAIN = job_read(1, RoundReason.WORKER_FAILED, members=(("n1", 2),), restarts=1)
SUCCEEDED = job_read(
    1,
    RoundReason.WORKER_FAILED,
    members=(("n1", 2),),
    restarts=1,
    final=FinalRecord(JobState.SUCCEEDED, "", EndReason.SUCCEEDED, None, 120.0),
)


class Scripted(Client):
    """The real client up to the socket: each request is recorded and answered by the next reply."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        super().__init__(Path("/nonexistent"))
        self.replies = replies
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def call(self, cmd: str, timeout_s: float | None = None, **args: Any) -> Any:
        self.sent.append((cmd, json.loads(json.dumps(args))))
        if cmd == "submit":
            return job_view(PENDING, "n1")
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("elasticctl.follow.time.sleep", lambda s: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")


def run(monkeypatch: pytest.MonkeyPatch, replies: list[dict[str, Any]], *argv: str) -> tuple[int, Scripted]:
    client = Scripted(replies)
    monkeypatch.setattr(cli, "Client", lambda *a, **k: client)
    return cli.main(["--socket", "/s", *argv]), client


def notes(err: str) -> list[str]:
    """stderr's notes, with their local times taken out."""
    return [re.sub(r"^elasticctl: \d\d:\d\d:\d\d ", "", line) for line in err.splitlines()]


def test_submit_follow_tells_each_change_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_sleep: None
) -> None:
    replies = [reply(PENDING), reply(PENDING), reply(RUNNING, [(0, 0, "a\n"), (0, 1, "b\n")]),
               reply(RUNNING), reply(RESTARTING), reply(RESTARTING), reply(RUNNING_AGAIN, [(1, 0, "c\n")]),
               reply(SUCCEEDED)]  # fmt: skip
    code, client = run(monkeypatch, replies, "submit", "--follow", "train.py")
    out, err = capsys.readouterr()
    assert code == 0
    assert out == f"{JOB}\n[rank0]: a\n[rank1]: b\n[rank0]: c\n"
    assert notes(err) == [
        "pending: waits for free slots: n1 is waiting for 2 free slots (0 of 2 free now); "
        "0 of 1 node(s) joined round 0",
        "running: round 0, world size 2 on n1",
        RESTARTED,
        "running: round 1, world size 2 on n1",
        f"{JOB} SUCCEEDED after 1 restart(s)",
    ]
    assert [cmd for cmd, _ in client.sent] == ["submit"] + ["logs"] * 8  # the end from the last reply


def test_a_failed_job_ends_following_with_the_failed_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_sleep: None
) -> None:
    failed = job_read(0, members=(("n1", 2),), final=FinalRecord(
        JobState.FAILED, "no restarts left", EndReason.WORKER_FAILED, FAILURE, 120.0))  # fmt: skip
    code, _ = run(monkeypatch, [reply(failed)], "logs", "-f", JOB)
    assert code == exits.EXIT_JOB_FAILED
    assert "first failure: rank 1" in capsys.readouterr().err
    code, _ = run(monkeypatch, [reply(SUCCEEDED)], "logs", "-f", JOB)
    assert code == 0


def test_following_waits_while_this_node_winds_the_ended_job_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_sleep: None
) -> None:
    """A failed job's keeper here writes its last snapshots after the job is FAILED: following
    returns once this node says it is done (so a job submitted next finds them), told once."""
    failed = job_read(0, members=(("n1", 2),), final=FinalRecord(
        JobState.FAILED, "no restarts left", EndReason.WORKER_FAILED, FAILURE, 120.0))  # fmt: skip
    winding = [reply(failed) | {"finishing_here": True}] * 3
    monkeypatch.setattr("elasticctl.follow.FINISH_NOTE_S", 0.0)
    code, client = run(monkeypatch, [*winding, reply(failed) | {"finishing_here": False}], "logs", "-f", JOB)
    assert code == exits.EXIT_JOB_FAILED
    assert [cmd for cmd, _ in client.sent] == ["logs"] * 4
    err = capsys.readouterr().err
    assert err.count("winding it up") == 1, err
    monkeypatch.setattr("elasticctl.follow.FINISH_WAIT_S", 0.0)  # a node that never says it is done
    code, client = run(monkeypatch, winding, "logs", "-f", JOB)
    assert code == exits.EXIT_JOB_FAILED and len(client.sent) == 1


def test_logs_asks_for_its_options_and_the_tail_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_sleep: None
) -> None:
    replies = [reply(RUNNING, [(0, 0, "a\n")], more=True), reply(RUNNING, [(0, 0, "b\n")]),
               reply(RUNNING, [(0, 0, "c\n")]), reply(SUCCEEDED)]  # fmt: skip
    code, client = run(monkeypatch, replies, "logs", JOB, "-f", "-t", "--tail", "5", "--rank", "0",
                       "--attempt", "0", "--since", "1970-01-01T00:02")  # fmt: skip
    assert code == 0
    sent = [LogsArgs(**args) for cmd, args in client.sent]
    assert [a.tail for a in sent] == [5, None, None, None]
    assert {(a.rank, a.attempt, a.partial) for a in sent} == {(0, 0, False)}  # no terminal: whole lines
    assert sent[0].since == datetime.datetime(1970, 1, 1, 0, 2).timestamp()
    assert sent[1].cursor == {"attempt_0/rank_0.log": 2}
    out, err = capsys.readouterr()
    # What was there at the start (until a reply says nothing more is waiting) has no time.
    lines = out.splitlines()
    assert lines[:2] == [f"{NO_TIME} [rank0]: a", f"{NO_TIME} [rank0]: b"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d\d\d \[rank0\]: c", lines[2])
    assert "pending" not in err and "running:" not in err  # the life is submit --follow's


def test_elsewhere_notes_name_the_node_and_the_command() -> None:
    view = job_view(job_read(0, members=(("n1", 2), ("n2", 2), ("n3", 1))), "n1")
    run_there = f"run `elasticctl logs {JOB}` there"
    assert elsewhere_notes(JOB, view, "n1", None) == [
        f"the logs of ranks 2-3 of {JOB} are on node n2: {run_there}",
        f"the logs of rank 4 of {JOB} are on node n3: {run_there}",
    ]
    assert elsewhere_notes(JOB, view, "n1", 3) == [
        f"the logs of ranks 2-3 of {JOB} are on node n2: run `elasticctl logs {JOB} --rank 3` there"
    ]
    assert elsewhere_notes(JOB, view, "n1", 1) == [] and elsewhere_notes(JOB, view, None, None) == []


def test_logs_says_once_where_the_other_ranks_are(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_sleep: None
) -> None:
    two = job_read(0, members=(("n1", 1), ("n2", 1)))
    code, _ = run(monkeypatch, [reply(two, [(0, 0, "a\n")]), reply(two)], "logs", JOB)
    out, err = capsys.readouterr()
    assert (code, out) == (0, "[rank0]: a\n")
    assert err.count("are on node n2") == 1


# -- the life, from views the daemon builds ---------------------------------------------------------------
def said(*reads: RostersRead) -> list[str]:
    story = Life()
    out = []
    for read in reads:
        view = json.loads(json.dumps(job_view(read, "n1")))
        out += [text for _, text in story.update(view, round_view(read), 500.0)]
    return out


@pytest.mark.parametrize(
    ("reason", "detail", "told"),
    [
        (RoundReason.MEMBER_LOST, "lost node(s) n2", "restarting: round 2 (restart 1 of 3): a node was lost: "
         "lost node(s) n2"),
        (RoundReason.SCALE_UP, "node(s) n3 waiting", "re-forming: round 2 (no restart spent): scaling up: "
         "node(s) n3 waiting"),
        (RoundReason.MEMBER_LEFT, "node n2 drained", "re-forming: round 2 (no restart spent): a node left "
         "(drained or stopped): node n2 drained"),
    ],
)  # fmt: skip
def test_why_a_round_opened(reason: RoundReason, detail: str, told: str) -> None:
    read = job_read(2, reason, restarts=1 if reason.spends_budget else 0)
    assert read.round is not None
    read = replace(read, round=RoundInfo(2, reason, 102.0, detail=detail))
    assert said(read) == [told]


def test_a_wait_for_nodes_is_told_once_it_lasts() -> None:
    waiting = job_read(0, nnodes=NodeRange(2, 2))
    view = job_view(waiting, "n1")
    story = Life()
    assert story.update(view, round_view(waiting), 10.0) == []
    assert story.update(view, round_view(waiting), 10.0 + life.QUIET_S - 0.1) == []
    told = "pending: waits for nodes: 0 of 2 node(s) joined round 0"
    assert story.update(view, round_view(waiting), 10.0 + life.QUIET_S) == [(10.0, told)]
    assert story.update(view, round_view(waiting), 99.0) == []


def test_a_round_that_opened_and_closed_between_two_polls_is_told_whole() -> None:
    assert said(RUNNING, RUNNING_AGAIN, RUNNING_AGAIN) == [
        "running: round 0, world size 2 on n1",
        RESTARTED,
        "running: round 1, world size 2 on n1",
    ]


def test_a_round_that_ran_and_ended_between_two_polls_is_told() -> None:
    assert said(RESTARTING, SUCCEEDED) == [RESTARTED, "running: round 1, world size 2 on n1"]
    killed = job_read(0, final=FinalRecord(JobState.KILLED, "killed", EndReason.KILLED))
    assert said(killed) == []


def test_a_round_on_several_nodes_and_its_times() -> None:
    read = job_read(0, members=(("a", 2), ("b", 1)))
    story = Life()
    told = story.update(job_view(read, "a"), round_view(read), 500.0)
    assert told == [(110.0, "running: round 0, world size 3 on 2 nodes: a (ranks 0-1), b (rank 2)")]
    info: RoundView | None = round_view(RESTARTING)
    assert info is not None and (info["opened_at"], info["closed_at"]) == (101.0, None)


def test_waiting_for_capacity_is_told_again_only_when_it_changes() -> None:
    first = job_read(1, RoundReason.SCALE_UP, pending={"n2": "no room"})
    other = job_read(1, RoundReason.SCALE_UP, pending={"n3": "no room"})
    assert said(first, first, other)[1:] == [
        "restarting: waits for free slots on n2",
        "restarting: waits for free slots on n3",
    ]


def test_every_round_reason_has_words() -> None:
    assert set(life.WHY) == {r.value for r in RoundReason}


def test_views_that_are_not_a_jobs_state_are_ignored() -> None:
    assert Life().update({"state": "DONE", "stale": True}, None, 1.0) == []


# -- --since ----------------------------------------------------------------------------------------------
NOW = datetime.datetime(2025, 5, 1, 15, 0, 0).timestamp()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", NOW - 90),
        ("10m", NOW - 600),
        ("1.5h", NOW - 5400),
        ("2d", NOW - 2 * 86400),
        ("14:30", datetime.datetime(2025, 5, 1, 14, 30).timestamp()),
        ("14:30:05", datetime.datetime(2025, 5, 1, 14, 30, 5).timestamp()),
        ("2025-04-30T08:00", datetime.datetime(2025, 4, 30, 8, 0).timestamp()),
    ],
)
def test_parse_since(text: str, expected: float) -> None:
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "10", "ten minutes", "-5m", "25:00"])
def test_parse_since_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="takes a duration"):
        parse_since(text, NOW)


@pytest.mark.parametrize(
    "argv", [["--tail", "-1"], ["--attempt", "x"], ["--rank", "-1"], ["--since", "soon"]]
)
def test_logs_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["logs", JOB, *argv])
    assert info.value.code == exits.EXIT_USAGE and argv[0] in capsys.readouterr().err


# -- which ranks and attempts a job has (elasticd.jobs.logscope) ------------------------------------------
def test_a_rank_beyond_the_jobs_largest_world_is_refused() -> None:
    with pytest.raises(RankNotFound, match=r"has no rank 4: it has at most 4 \(2 node\(s\) x 2 per node\)"):
        check_scope(PENDING, 4, None, [])
    check_scope(PENDING, 3, None, [])  # an elastic job may still get it


def test_a_rank_of_an_ended_job_exists_if_it_ran() -> None:
    check_scope(SUCCEEDED, 1, None, [])  # in the last round's result
    check_scope(SUCCEEDED, 3, None, [(0, 3)])  # it has logs here
    with pytest.raises(RankNotFound, match="has no rank 2: its ranks were 0-1"):
        check_scope(SUCCEEDED, 2, None, [])
    never = job_read(0, final=FinalRecord(JobState.KILLED, "killed", EndReason.KILLED))
    with pytest.raises(RankNotFound, match="no rank of it ever ran"):
        check_scope(never, 0, None, [])


def test_an_attempt_the_job_has_not_come_to_is_refused() -> None:
    check_scope(RUNNING_AGAIN, None, 1, [])
    with pytest.raises(AttemptNotFound, match=r"has no attempt 2 \(its attempts so far: 0-1\)"):
        check_scope(RUNNING_AGAIN, None, 2, [])


def test_spans() -> None:
    assert spans([6, 0, 1, 2, 3, 8, 9]) == "0-3, 6, 8-9" and spans([]) == ""


class OlderDaemon(Scripted):
    """A daemon from before ``partial``: unknown arguments are invalid."""

    def call(self, cmd: str, timeout_s: float | None = None, **args: Any) -> Any:
        if "partial" in args:
            self.sent.append((cmd, args))
            raise DaemonError("invalid_args", "unknown arguments: ['partial']")
        return super().call(cmd, timeout_s, **args)


def test_on_a_terminal_unfinished_lines_are_asked_for_and_older_daemons_still_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_sleep: None
) -> None:
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    client = OlderDaemon([reply(SUCCEEDED, [(1, 0, "\r 5%|\r 9%|")]), reply(SUCCEEDED)])
    monkeypatch.setattr(cli, "Client", lambda *a, **k: client)
    assert cli.main(["--socket", "/s", "logs", JOB, "-f"]) == 0
    assert [args.get("partial") for _, args in client.sent] == [True, None, None]
    assert capsys.readouterr().out == "[rank0]:  5%|\r[rank0]:  9%|\n"


def test_a_nodes_own_view_tells_nothing() -> None:
    stale = {"id": JOB, "state": "RUNNING", "stale": True, "round": 1, "reason": "etcd is unreachable"}
    assert Life().update(stale, None, 1.0) == []


@pytest.mark.parametrize("name", ["rank", "attempt", "tail"])
def test_the_daemon_refuses_negative_counts(name: str) -> None:
    with pytest.raises(InvalidArgs, match=f"argument '{name}' must be >= 0, got -1"):
        parse_args(LogsArgs, {"job": JOB, name: -1})
    assert getattr(parse_args(LogsArgs, {"job": JOB, name: 0}), name) == 0

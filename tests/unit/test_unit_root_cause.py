"""The root cause of a failed round: the first worker to fail, by time (not the lowest rank), the
others listed once as "also failed", and every text saying each fact once."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from elasticctl import render
from elasticd.decode import decode
from elasticd.jobs import attempt as launch_mod
from elasticd.jobs import logdir
from elasticd.jobs.attempt import ProcessWorkers
from elasticd.jobs.decider import SETTLE_S, Group, GroupOutcome
from elasticd.jobs.failurereport import describe_failure
from elasticd.jobs.ranktext import rank_prefixed
from elasticd.jobs.rootcause import Exit, by_first_failure, parse_error_file
from elasticd.progress.accounts import Accounts
from elasticd.progress.goodput import Mode, Tally
from elasticd.progress.protocol import StepReport
from elasticd.rendezvous.fieldchecks import check_failure
from elasticd.terms.state import MAX_ALSO_FAILED, FailedRank, WorkerFailure, exit_text
from elasticd.wire import FailureView, JobView
from elasticd.workers import group as group_mod
from elasticd.workers.group import Launch, Worker

pytestmark = pytest.mark.timeout(30)
T0 = 1_700_000_000.0  # a whole second
JOB = "job-rc"


# -- the choice, pure ------------------------------------------------------------------------------
def test_the_first_to_exit_is_the_root_cause_not_the_lowest_rank() -> None:
    exits = [Exit(0, 0, 1, T0 + 0.40), Exit(1, 1, 1, T0 + 0.10), Exit(2, 2, 0, T0 + 0.05)]
    assert [e.rank for e in by_first_failure(exits)] == [1, 0]  # rank 2 succeeded: not a failure


def test_an_error_file_timestamp_puts_a_failure_first() -> None:
    # rank 1 wrote its error in the second T0 but took long to exit (interpreter shutdown);
    # rank 0 failed because of it, in a later second, and exited first.
    exits = [Exit(0, 0, 1, T0 + 1.2), Exit(1, 1, 1, T0 + 1.5, error_at=T0)]
    assert by_first_failure(exits)[0].rank == 1


def test_whole_second_timestamps_do_not_beat_a_finer_exit_time_in_the_same_second() -> None:
    # torch writes str(int(time.time())): rank 0's error at T0 + 0.6 reads as T0. Rank 1 exited
    # (no error file) at T0 + 0.3: within the second, the exits' order decides.
    exits = [Exit(0, 0, 1, T0 + 0.7, error_at=T0), Exit(1, 1, -9, T0 + 0.3)]
    assert [e.rank for e in by_first_failure(exits)] == [1, 0]


def test_an_error_timestamp_after_the_exit_is_bounded_by_the_exit() -> None:
    exits = [Exit(0, 0, 1, T0 + 0.2, error_at=T0 + 3600), Exit(1, 1, 1, T0 + 0.5)]
    assert by_first_failure(exits)[0].rank == 0


def test_ties_go_to_the_lower_rank_and_failed_at_prefers_the_error_file() -> None:
    exits = [Exit(3, 1, 1, T0 + 0.5), Exit(2, 0, 1, T0 + 0.5)]
    assert [e.rank for e in by_first_failure(exits)] == [2, 3]
    assert Exit(0, 0, 1, T0 + 0.5, error_at=T0).failed_at == T0
    assert Exit(0, 0, 1, T0 + 0.5).failed_at == T0 + 0.5


@pytest.mark.parametrize(
    ("data", "parsed"),
    [
        (  # what torch's @record writes (error_handler.ErrorHandler.record_exception)
            {
                "message": {
                    "message": "RuntimeError: boom",
                    "extraInfo": {"py_callstack": "Traceback ...", "timestamp": str(int(T0))},
                }
            },
            ("RuntimeError: boom", T0),
        ),
        ({"message": "ValueError: x\nsecond line", "timestamp": 1700000001}, ("second line", T0 + 1)),
        ({"message": {"message": "E: y", "extraInfo": {"timestamp": "soon"}}}, ("E: y", None)),
        ({"message": {"message": "E: y", "extraInfo": "nope"}}, ("E: y", None)),
        ({"message": "x", "timestamp": True}, ("x", None)),
        ({"message": "x", "timestamp": "nan"}, ("x", None)),
        ({"message": "x", "timestamp": -5}, ("x", None)),
        ([1, 2], ("", None)),
        ({}, ("", None)),
    ],
)
def test_error_file_parsing(data: Any, parsed: tuple[str, float | None]) -> None:
    assert parse_error_file(data) == parsed


@pytest.mark.torch
def test_error_file_parsing_reads_what_torch_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handler_mod = pytest.importorskip("torch.distributed.elastic.multiprocessing.errors.error_handler")
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        raise RuntimeError("Connection closed by peer")
    except RuntimeError as exc:
        handler_mod.ErrorHandler().record_exception(exc)
    message, ts = parse_error_file(json.loads(path.read_text()))
    assert message == "RuntimeError: Connection closed by peer"
    assert ts is not None and abs(ts - group_mod.wall_clock()) < 5


# -- describing real exits: error files and exit times -----------------------------------------------
def _worker(
    files: logdir.RankFiles, local_rank: int, code: int | None, loop: asyncio.AbstractEventLoop
) -> Worker:
    fut: asyncio.Future[int] = loop.create_future()
    launch = Launch(local_rank, files.rank, ("python",), {}, "/", -1, files.log_path, files.error_path)
    worker = Worker(launch, 1000 + files.rank, fut)
    if code is not None:
        fut.set_result(code)
    return worker


class FakeGroup:
    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

    @property
    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.running]

    async def stop(self, grace_s: float) -> list[int]:
        return []


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, list[logdir.RankFiles]]:
    logs = tmp_path / "logs"
    files = logdir.create_attempt(logs, JOB, 0, [4, 5, 6], logdir.Owner.of(os.geteuid(), os.getegid()), "n1")
    outputs = ["rank 4 says hi\n", "[rank5]: Traceback\n[rank5]: RuntimeError: boom\n", ""]
    for f, text in zip(files, outputs, strict=True):
        os.write(f.log_fd, text.encode())
        os.close(f.log_fd)
    return logs, files


def _error_file(path: Path, message: str, ts: float) -> None:
    data = {"message": {"message": message, "extraInfo": {"py_callstack": "...", "timestamp": str(int(ts))}}}
    path.write_text(json.dumps(data))


def test_describe_names_the_first_failure_and_lists_the_others(
    tree: tuple[Path, list[logdir.RankFiles]],
) -> None:
    _, files = tree
    loop = asyncio.new_event_loop()
    try:
        rank4, rank5 = (_worker(f, i, 1, loop) for i, f in enumerate(files[:2]))
        rank4._exited_at, rank5._exited_at = T0 + 2.1, T0 + 2.4
        _error_file(files[1].error_path, "RuntimeError: boom", T0)  # rank 5 failed first
        _error_file(files[0].error_path, "RuntimeError: Connection closed by peer", T0 + 2)
        failure = describe_failure("n1", 0, [rank4, rank5])
    finally:
        loop.close()
    assert (failure.rank, failure.local_rank, failure.exit_code) == (5, 1, 1)
    assert failure.message == "RuntimeError: boom" and failure.failed_at == T0
    assert "RuntimeError: boom" in failure.output_tail
    assert failure.also_failed == (
        FailedRank(4, 0, 1, None, "RuntimeError: Connection closed by peer", T0 + 2),
    )
    assert failure.summary() == (
        "rank 5 (local 1 on n1) failed with exit code 1: RuntimeError: boom; also failed: rank 4"
    )


def test_without_error_files_the_exit_times_decide(tree: tuple[Path, list[logdir.RankFiles]]) -> None:
    _, files = tree
    loop = asyncio.new_event_loop()
    try:
        codes = [1, -9, 2]
        workers = [_worker(f, i, code, loop) for i, (f, code) in enumerate(zip(files, codes, strict=True))]
        for w, t in zip(workers, [T0 + 0.9, T0 + 0.2, T0 + 0.5], strict=True):
            w._exited_at = t
        failure = describe_failure("n1", 3, workers)
    finally:
        loop.close()
    assert (failure.rank, failure.signal, failure.exit_code, failure.failed_at) == (
        5,
        "SIGKILL",
        None,
        T0 + 0.2,
    )
    assert [(f.rank, f.exit_code, f.message) for f in failure.also_failed] == [
        (6, 2, "exit code 2"),
        (4, 1, "exit code 1"),
    ]


def test_an_exit_is_stamped_when_it_is_seen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    now = [T0]
    monkeypatch.setattr(group_mod, "wall_clock", lambda: now[0])

    async def run() -> Worker:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        launch = Launch(0, 0, ("x",), {}, "/", -1, tmp_path / "a" / "b" / "c", tmp_path / "e")
        worker = Worker(launch, 1, fut)
        assert worker.exited_at is None
        now[0] = T0 + 7
        fut.set_result(1)
        now[0] = T0 + 8
        await asyncio.sleep(0)  # the exit's callback runs
        now[0] = T0 + 9
        return worker

    assert asyncio.run(run()).exited_at == T0 + 8


def test_wall_clock_follows_the_monotonic_clock() -> None:
    a = group_mod.wall_clock()
    b = group_mod.wall_clock()
    assert a <= b and abs(a - time.time()) < 5


# -- observing: a failure waits briefly for its siblings ---------------------------------------------
def test_a_failure_is_reported_once_siblings_exited_or_settled(
    tree: tuple[Path, list[logdir.RankFiles]], monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, files = tree
    now = [T0 + 10.0]
    monkeypatch.setattr(launch_mod, "wall_clock", lambda: now[0])
    rt: Any = type("Rt", (), {"node_id": "n1", "log_dir": logs})()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        w4, w5, w6 = (_worker(f, i, None, loop) for i, f in enumerate(files))
        group: Any = FakeGroup([w4, w5, w6])
        workers = ProcessWorkers(group, rt, 0)
        assert workers.observe(describe=True) == Group(GroupOutcome.RUNNING)
        w5._exited_at = now[0]
        w5.exited.set_result(1)  # rank 5 crashes; 4 and 6 still run
        settling = workers.observe(describe=True)  # not reported, but known if the round moves
        assert settling.outcome is GroupOutcome.RUNNING and settling.failure is not None
        assert settling.failure.rank == 5
        assert workers.observe(describe=False) == Group(GroupOutcome.RUNNING)
        assert len(workers.exits()) == 3  # rank 4's, rank 6's, and the end of the settling time
        now[0] += 0.5
        w4._exited_at = now[0]
        w4.exited.set_result(1)  # the broken collective takes rank 4 down too
        assert workers.observe(describe=True).outcome is GroupOutcome.RUNNING  # rank 6 still runs
        now[0] += SETTLE_S  # rank 6 hangs: report without it
        seen = workers.observe(describe=True)
        assert seen.outcome is GroupOutcome.FAILED and seen.failure is not None
        assert seen.failure.rank == 5 and [f.rank for f in seen.failure.also_failed] == [4]
        assert workers.observe(describe=False) == Group(GroupOutcome.FAILED)

    asyncio.run(run())


def test_a_failure_with_no_sibling_running_is_reported_at_once(
    tree: tuple[Path, list[logdir.RankFiles]],
) -> None:
    logs, files = tree
    rt: Any = type("Rt", (), {"node_id": "n1", "log_dir": logs})()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        group: Any = FakeGroup([_worker(files[0], 0, 3, loop)])
        seen = ProcessWorkers(group, rt, 0).observe(describe=True)
        assert seen.failure is not None and seen.failure.rank == 4 and seen.failure.also_failed == ()

    asyncio.run(run())


def test_workers_that_all_exited_stop_the_ledger_as_of_the_last_exit(
    tree: tuple[Path, list[logdir.RankFiles]],
) -> None:
    """The outcome is reported (and the job may end) before the workers are stopped: the time from
    the last step to a clean exit is a stop's (waiting), not a step in flight's (productive)."""
    logs, files = tree
    rt: Any = type("Rt", (), {"node_id": "n1", "log_dir": logs})()
    now = [T0]
    accounts = Accounts(T0, lambda: now[0])
    accounts.launched(0)
    accounts.reported(StepReport(None), 0, T0 + 5)
    accounts.reported(StepReport(None), 1, T0 + 10)
    now[0] = T0 + 20

    async def run() -> None:
        loop = asyncio.get_running_loop()
        worker = _worker(files[0], 0, None, loop)
        group: Any = FakeGroup([worker])
        workers = ProcessWorkers(group, rt, 0, accounts=accounts)
        workers.observe(describe=False)
        assert accounts.ledger.mode is Mode.STEPPING  # still running: nothing told
        worker._exited_at = T0 + 12
        worker.exited.set_result(0)
        assert workers.observe(describe=False) == Group(GroupOutcome.SUCCEEDED)
        assert accounts.tally() == Tally(startup_s=5, productive_s=5, waiting_s=10)  # 2 s to exit, 8 since
        await workers.stop(1.0)  # told once: the stop does not move it
        assert accounts.tally() == Tally(startup_s=5, productive_s=5, waiting_s=10)

    asyncio.run(run())


# -- the record: bounded, stored, decoded (also when an older daemon wrote it) -----------------------
def _failure(n_others: int = 1) -> WorkerFailure:
    others = tuple(
        FailedRank.from_exit(rank=i, local_rank=i, returncode=1, message=f"E{i}: x\n  y", failed_at=T0 + i)
        for i in range(n_others)
    )
    return WorkerFailure.from_exit(
        node="n1", attempt=0, rank=9, local_rank=1, returncode=1, message="", tail="t", failed_at=T0,
        also_failed=others,
    )  # fmt: skip


def test_also_failed_is_bounded_and_counted() -> None:
    f = _failure(MAX_ALSO_FAILED + 3)
    assert len(f.also_failed) == MAX_ALSO_FAILED and f.also_failed_more == 3
    assert f.summary().endswith(", 3 more")
    assert f.also_failed[0].message == "E0: x y"  # one line


def test_the_record_round_trips_and_older_records_still_decode() -> None:
    f = _failure(2)
    stored = json.loads(json.dumps(f.to_json()))
    check_failure(stored)
    assert decode(WorkerFailure, stored) == f
    older = {
        k: v for k, v in stored.items() if k not in ("oom", "failed_at", "also_failed", "also_failed_more")
    }
    old = decode(WorkerFailure, older)
    assert old.also_failed == () and old.failed_at is None and old.also_failed_more == 0
    assert decode(FailureView, stored)["also_failed"][1]["rank"] == 1  # the wire schema fits too


# -- saying each fact once ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "sig", "message", "text"),
    [
        (1, None, "exit code 1", "exit code 1"),
        (1, None, "", "exit code 1"),
        (1, None, "RuntimeError: x", "exit code 1: RuntimeError: x"),
        (None, "SIGKILL", "killed by SIGKILL", "signal SIGKILL"),
        (None, "200", "killed by signal 200", "signal 200"),
        (None, "SIGKILL", "killed by the OOM killer", "signal SIGKILL: killed by the OOM killer"),
    ],
)
def test_exit_text_says_the_exit_once(code: int | None, sig: str | None, message: str, text: str) -> None:
    assert exit_text(code, sig, message) == text


def _job(failure: WorkerFailure) -> JobView:
    view: Any = {"id": "j", "state": "FAILED", "reason": failure.summary(), "error": failure.summary()}
    view["failure"] = json.loads(json.dumps(failure.to_json()))
    return view  # type: ignore[no-any-return]


def test_render_names_the_root_cause_once_and_the_others_once() -> None:
    other = FailedRank.from_exit(rank=0, local_rank=0, returncode=1, message="RuntimeError: closed")
    f = WorkerFailure.from_exit(
        node="n1", attempt=2, rank=1, local_rank=1, returncode=1, message="", tail="[rank1]: Traceback",
        also_failed=(other,),
    )  # fmt: skip
    text = render.failure(_job(f))
    assert text.splitlines()[:2] == [
        "first failure: rank 1 (local rank 1 on n1), attempt 2, exit code 1",
        "  also failed: rank 0 (local rank 0), exit code 1: RuntimeError: closed",
    ]
    assert "exit code 1: exit code 1" not in text and "[rank1]: [rank1]:" not in text
    detail = render.job_detail(_job(f))
    assert detail.count(f.summary()) == 1  # reason and error are the same text: shown once
    assert "first failure: rank 1" in detail and "also failed: rank 0" in detail


def test_render_reads_failures_of_older_daemons() -> None:
    job: Any = _job(_failure(0))  # an older daemon's reply: short of keys that JobView requires
    for key in ("failed_at", "also_failed", "also_failed_more"):
        del job["failure"][key]
    assert "also failed" not in render.failure(job)


@pytest.mark.parametrize(
    ("rank", "text", "shown"),
    [
        (1, "hello\n", "[rank1]: hello\n"),
        (1, "[rank1]: Traceback (most recent call last):\n", "[rank1]: Traceback (most recent call last):\n"),
        (1, "[rank0]: not mine\n", "[rank1]: [rank0]: not mine\n"),
        (1, "[rank10]: other\n", "[rank1]: [rank10]: other\n"),
        (1, "a\n\nb", "[rank1]: a\n[rank1]: \n[rank1]: b\n"),
    ],
)
def test_rank_prefix_is_added_once(rank: int, text: str, shown: str) -> None:
    assert rank_prefixed(rank, text) == shown

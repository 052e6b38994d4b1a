"""elasticd.wire: one schema for elasticctl and the daemon (arguments, defaults, replies, states)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NotRequired, TypedDict

import pytest

from elasticctl import cli, exits, follow, render
from elasticctl.client import Client
from elasticctl.commands import submit as submit_command
from elasticctl.parser import build_parser
from elasticd import wire
from elasticd.control.commands import REGISTRY, logs, nodes, ping
from elasticd.control.params import parse_args
from elasticd.decode import DecodeError, Unknown, decode
from elasticd.etcd.space import Space, SpaceLevel, SpaceLimits
from elasticd.etcd.types import EtcdStatus
from elasticd.gpu.devices import Gpu
from elasticd.jobs.logs import Chunk, Read
from elasticd.jobs.logscope import round_view
from elasticd.jobs.view import job_row, job_view
from elasticd.manager.access import Caller
from elasticd.manager.facts import NodeFacts
from elasticd.manager.jobcommands import LogsRead
from elasticd.node.registry import InventoryRecord, NodeRecord
from elasticd.rendezvous.decider import build_result
from elasticd.rendezvous.jobread import InvalidKey, RostersRead
from elasticd.rendezvous.model import FinalRecord, Join, NodeStatus, RoundInfo
from elasticd.terms.spec import NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason, WorkerFailure
from elasticd.wire import (
    COMMANDS,
    DrainArgs,
    JobView,
    LogsArgs,
    StatusArgs,
    SubmitArgs,
    UndrainArgs,
    WaitsFor,
    default,
    request,
)
from tests import fakes

JOB = fakes.JOB
ELASTICCTL = Path(cli.__file__).parent


def as_json(value: Any) -> Any:
    """What the other end of the socket gets."""
    return json.loads(json.dumps(value))


# -- reads of a job --------------------------------------------------------------------------------------
def job_read(
    round_no: int = 0,
    *,
    nnodes: NodeRange | None = None,
    joins: tuple[str, ...] = (),
    members: tuple[str, ...] = (),
    **fields: Any,
) -> RostersRead:
    read = RostersRead(JOB, head=fakes.make_head(nnodes=nnodes or NodeRange(2, 3)), **fields)
    read = replace(read, round=RoundInfo(round_no, RoundReason.START, 0.0))
    read = replace(
        read,
        joins={
            **read.joins,
            round_no: tuple(Join(n, f"h-{n}", 29500, 2, i + 1) for i, n in enumerate(joins)),
        },
    )
    if members:
        ordered = [Join(n, f"10.0.0.{i + 1}", 29400 + i, 2, 0) for i, n in enumerate(members)]
        read = replace(read, results={**read.results, round_no: build_result(round_no, ordered, 1.0)})
    return read


FAILURE = WorkerFailure.from_exit(
    node="n2", attempt=1, rank=3, local_rank=1, returncode=-9, message="", tail="x\n"
).to_json()
NOTE = "n2 is waiting for 2 free GPUs (0 of 8 free now)"


def _invalid() -> RostersRead:
    read = job_read(0, members=("n1",))
    read = replace(read, invalid=(InvalidKey(f"jobs/{JOB}/rdzv/0/join/n1", "port: must be int", 5),))
    return read


def _no_spec() -> RostersRead:
    read = job_read(0, joins=("n1",))
    read = replace(read, head=None)
    return read


READS = {
    "pending for capacity": lambda: job_read(0, joins=("n1",), pending={"n2": NOTE}),
    "pending for nodes": lambda: job_read(0, joins=("n1",)),
    "round about to close": lambda: job_read(0, joins=("n1", "n2")),
    "running": lambda: job_read(
        1, members=("n1", "n2"), node_status={"n1": NodeStatus("RUNNING", 1, "0,1", (5, 6), 1.0)}
    ),
    "restarting for capacity": lambda: job_read(2, joins=("n1",), pending={"n3": NOTE}, restarts=1),
    "failed": lambda: job_read(
        1,
        members=("n1",),
        final=FinalRecord(JobState.FAILED, "no restarts left", EndReason.WORKER_FAILED, FAILURE, 9.0),
    ),
    "killed while pending": lambda: job_read(
        0, pending={"n2": NOTE}, final=FinalRecord(JobState.KILLED, "killed by u", EndReason.KILLED)
    ),
    "invalid record": _invalid,
    "unreadable spec": _no_spec,
}


# -- the registry and the schema -------------------------------------------------------------------
# The wire schema: the elasticd.wire package, and the modules it takes a command's schema from.
SCHEMA_MODULES = ("elasticd.wire.args", "elasticd.wire.replies", "elasticd.history.schema")


def test_every_command_takes_its_arguments_from_the_wire_schema() -> None:
    assert set(REGISTRY) == set(COMMANDS)
    for name, command in REGISTRY.items():
        args = COMMANDS[name].args
        assert command.args is args, name
        assert args.__module__ in SCHEMA_MODULES, name
        assert dataclasses.is_dataclass(args) and args.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_every_reply_type_is_a_typeddict_of_the_wire() -> None:
    for name, schema in COMMANDS.items():
        assert schema.reply.__module__ in SCHEMA_MODULES, name
        assert schema.reply.__required_keys__ | schema.reply.__optional_keys__, name


def test_reply_types_know_their_optional_keys() -> None:
    """wire/replies.py must not use stringified annotations (Python 3.11 then marks every key required)."""
    assert "waits_for" in JobView.__required_keys__
    assert {"name", "error", "failure", "stale"} <= JobView.__optional_keys__


def test_the_wire_imports_nothing_heavy() -> None:
    code = (
        "import sys, elasticd.wire; "
        "print(sorted(m for m in ('zmq', 'elasticd.etcd.client', 'psutil', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# -- job states -------------------------------------------------------------------------------------
def test_terminal_states_come_from_job_state() -> None:
    assert {s for s in JobState if s.terminal} == wire.TERMINAL_STATES
    assert {s for s in JobState if wire.is_terminal(s.value)} == wire.TERMINAL_STATES
    assert not wire.is_terminal(None) and not wire.is_terminal("JOINING")
    assert not hasattr(follow, "TERMINAL")


def _elasticctl_sources() -> dict[str, ast.Module]:
    paths = sorted(ELASTICCTL.rglob("*.py"))
    return {str(p.relative_to(ELASTICCTL)): ast.parse(p.read_text()) for p in paths}


def test_elasticctl_spells_no_job_state_and_matches_no_text() -> None:
    """States come from ``JobState``; decisions from codes and fields, never from a message's text."""
    states = {s.value for s in JobState}
    for name, tree in _elasticctl_sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in states, f"{name}:{node.lineno}: {node.value!r}"
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
                ops = [type(op) for op in node.ops]
                assert ast.In not in ops and ast.NotIn not in ops, f"{name}:{node.lineno}: text search"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in ("startswith", "endswith", "find", "index", "count"), (
                    f"{name}:{node.lineno}: .{node.func.attr}() on text"
                )


# -- arguments: defaults and requests ------------------------------------------------------------
SUBMIT_OPTIONS = {
    "nnodes": "nnodes",
    "nproc_per_node": "nproc_per_node",
    "max_restarts": "max_restarts",
    "last_call": "last_call_s",
    "join_timeout": "join_timeout_s",
    "stop_grace": "stop_grace_s",
    "name": "name",
    "cpu_limit": "cpu_limit",
    "nofile": "nofile",
}


def test_submit_option_defaults_are_the_wire_defaults() -> None:
    ns = build_parser().parse_args(["submit", "train.py"])
    for dest, field in SUBMIT_OPTIONS.items():
        assert getattr(ns, dest) == default(SubmitArgs, field), dest
    assert (ns.nnodes, ns.nproc_per_node, ns.max_restarts) == ("1", 1, 3)  # the documented ones


@pytest.mark.parametrize(
    ("argv", "args", "options"),
    [
        (["drain", "n1"], DrainArgs, {"job": "job", "grace": "grace_s", "force": "force"}),
        (["undrain", "n1"], UndrainArgs, {"job": "job"}),
        (["logs", "j"], LogsArgs, {"rank": "rank", "attempt": "attempt", "tail": "tail", "since": "since"}),
        (["status"], StatusArgs, {"job": "job", "states": "states", "user": "user"}),
    ],
)
def test_other_option_defaults_are_the_wire_defaults(
    argv: list[str], args: type[Any], options: dict[str, str]
) -> None:
    ns = build_parser().parse_args(argv)
    for dest, field in options.items():
        assert getattr(ns, dest) == default(args, field), dest


def test_submit_help_shows_the_wire_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {default(SubmitArgs, 'join_timeout_s'):g})" in text
    assert f"restart budget (default {default(SubmitArgs, 'max_restarts')})" in text


def test_default_of_a_required_or_unknown_argument() -> None:
    with pytest.raises(ValueError, match="required"):
        default(SubmitArgs, "entry")
    with pytest.raises(ValueError, match="no argument"):
        default(SubmitArgs, "entrypoint")
    fresh = default(SubmitArgs, "args")
    assert fresh == [] and fresh is not default(SubmitArgs, "args")


def test_request_leaves_out_defaults_and_keeps_required_ones() -> None:
    assert request(wire.NoArgs()) == {}
    assert request(StatusArgs()) == {}
    assert request(LogsArgs("j")) == {"job": "j"}
    assert request(DrainArgs("n", force=True, grace_s=0.0)) == {"node": "n", "grace_s": 0.0, "force": True}
    with pytest.raises(TypeError):
        request({"job": "j"})
    with pytest.raises(TypeError):
        request(StatusArgs)


def test_submit_with_no_options_sends_no_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    args = submit_command.submit_args(build_parser().parse_args(["submit", "--env-clear", "train.py"]))
    for field in SUBMIT_OPTIONS.values():
        assert getattr(args, field) == default(SubmitArgs, field)
    assert set(request(args)) == {"entry_kind", "entry", "cwd", "python"}


def test_client_refuses_arguments_of_another_command() -> None:
    client = Client(Path("/nonexistent/ctl.sock"))
    with pytest.raises(TypeError, match="StatusArgs"):
        client.request("status", LogsArgs("j"))
    with pytest.raises(TypeError, match="no such command"):
        client.request("launch", wire.NoArgs())


# -- the CLI against canned replies ----------------------------------------------------------------
def _replies() -> dict[str, Any]:
    pending = job_view(READS["pending for capacity"](), "n1")
    ended = job_view(READS["failed"](), "n1")
    record = NodeRecord("n1", 2, "h", "0.1.0", "10.0.0.1", InventoryRecord("gpu", 2, (Gpu(0, "u", "A", 1),)))
    replies: dict[str, Any] = as_json(
        {
            "submit": pending,
            "status": {"job": ended},
            "status all": {"jobs": [pending, ended]},
            "status rows": {"rows": [job_row(pending), job_row(ended)]},
            "kill": {"job": ended},
            "logs": {"chunks": [], "cursor": {}, "state": "FAILED", "node": None},
            "nodes": {"nodes": [record.to_json()], "etcd": {"level": "high", "db_size": 1 << 30,
                      "db_size_in_use": 1 << 29, "quota_bytes": 1 << 31, "high_water_bytes": 1 << 30,
                      "alarms": [], "read_at": 1.0}},
            "drain": {"node": "n1", "job": None, "jobs": [], "forced": False},
            "undrain": {"node": "n1", "job": None},
            "ping": {"node": "n1", "version": "0", "pid": 1, "uptime_s": 1.0, "etcd": [],
                     "embedded_etcd": True, "you": {"uid": 0, "gid": 0, "user": "root"}},
        }
    )  # fmt: skip
    return replies


class RecordingClient(Client):
    """The real client up to the socket: requests are recorded as JSON and answered from ``replies``."""

    sent: list[tuple[str, dict[str, Any]]]
    replies: dict[str, Any]

    def call(self, cmd: str, timeout_s: float | None = None, **args: Any) -> Any:
        self.sent.append((cmd, as_json(args)))
        if cmd == "status" and "job" not in args:
            return self.replies["status rows" if args.get("rows") else "status all"]
        return self.replies[cmd]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, dict[str, Any]]]:
    log: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(RecordingClient, "sent", log, raising=False)
    monkeypatch.setattr(RecordingClient, "replies", _replies(), raising=False)
    monkeypatch.setattr(cli, "Client", RecordingClient)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    return log


CLI_CALLS = [
    ["submit", "train.py"],
    ["submit", "--nnodes", "1:3", "--nproc-per-node", "4", "--max-restarts", "0", "--nodes", "a, b,",
     "--last-call", "0", "--join-timeout", "5", "--memory-limit", "1G", "--cpu-limit", "0.5",
     "--nofile", "64", "--stop-grace", "1", "--name", "x", "--env", "K=V", "--hang-timeout", "30",
     "train.py", "--", "--lr", "1"],
    ["submit", "-m", "pkg.mod"],
    ["submit", "--no-python", "/bin/true"],
    ["status"],
    ["status", "j1"],
    ["status", "--state", "running,Failed", "--user", "u", "-q"],
    ["status", "j1", "--json"],
    ["kill", "j1"],
    ["logs", "j1", "--rank", "2"],
    ["logs", "j1", "--rank", "0", "--attempt", "1", "--tail", "5", "--since", "10m", "-t"],
    ["nodes"],
    ["drain", "n1"],
    ["drain", "n1", "--job", "j1", "--grace", "5", "--force"],
    ["undrain", "n1", "--job", "j1"],
    ["ping", "--json"],
]  # fmt: skip


@pytest.mark.parametrize("argv", CLI_CALLS, ids=" ".join)
def test_requests_the_cli_builds_decode_into_the_wire_types(
    argv: list[str], sent: list[tuple[str, dict[str, Any]]]
) -> None:
    assert cli.main(["--socket", "/nonexistent", *argv]) == 0
    assert sent and sent[0][0] == argv[0]
    for cmd, raw in sent:
        parsed = parse_args(COMMANDS[cmd].args, raw)
        assert type(parsed) is REGISTRY[cmd].args
        assert request(parsed) == raw  # nothing lost or added on the way


def test_submit_request_carries_every_option(sent: list[tuple[str, dict[str, Any]]]) -> None:
    assert cli.main(["--socket", "/s", *CLI_CALLS[1]]) == 0
    args = parse_args(SubmitArgs, sent[0][1])
    assert (args.nnodes, args.nproc_per_node, args.max_restarts, args.nodes) == ("1:3", 4, 0, ["a", "b"])
    assert (args.last_call_s, args.join_timeout_s, args.stop_grace_s, args.name) == (0.0, 5.0, 1.0, "x")
    assert (args.memory_limit_bytes, args.cpu_limit, args.nofile) == (1 << 30, 0.5, 64)
    assert args.hang_timeout == "30"
    assert args.args == ["--lr", "1"] and args.env["K"] == "V" and args.entry_kind == "script"


def test_submit_warns_on_the_waits_for_field_not_on_the_reason(
    sent: list[tuple[str, dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    replies = RecordingClient.replies
    assert replies["submit"]["waits_for"] == "capacity"
    assert cli.main(["--socket", "/s", "submit", "train.py"]) == 0
    assert f"is PENDING: {NOTE}" in capsys.readouterr().err

    replies["submit"] = as_json(job_view(READS["pending for nodes"](), "n1"))
    replies["submit"]["reason"] = "waiting for nodes, waiting for Godot"
    assert cli.main(["--socket", "/s", "submit", "train.py"]) == 0
    assert "PENDING" not in capsys.readouterr().err


def test_follow_stops_at_a_terminal_state(
    sent: list[tuple[str, dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--socket", "/s", "submit", "--follow", "train.py"]) == exits.EXIT_JOB_FAILED
    assert [cmd for cmd, _ in sent] == ["submit", "logs", "status"]
    assert "FAILED after 0 restart(s)" in capsys.readouterr().err


def test_render_reads_only_declared_keys() -> None:
    assert set(render.DETAIL_KEYS) <= JobView.__required_keys__ | JobView.__optional_keys__
    view: JobView = as_json(job_view(READS["failed"](), "n1"))
    assert "first failure: rank 3" in render.job_detail(view) and view["id"] in render.jobs_table([view])


# -- replies: what the daemon builds is what the schema declares --------------------------------------
@pytest.mark.parametrize("name", list(READS))
def test_job_view_is_a_wire_job_view(name: str) -> None:
    view = as_json(job_view(READS[name](), "n1"))
    assert JobView.__required_keys__ <= set(view) <= JobView.__required_keys__ | JobView.__optional_keys__
    decode(JobView, view, unknown=Unknown.REJECT)  # and every value has its declared type


@pytest.mark.parametrize(
    ("name", "waits_for", "short"),
    [
        ("pending for capacity", WaitsFor.CAPACITY, ["n2"]),
        ("pending for nodes", WaitsFor.NODES, []),
        ("round about to close", None, []),
        ("running", None, []),
        ("restarting for capacity", WaitsFor.CAPACITY, ["n3"]),
        ("failed", None, []),
        ("killed while pending", None, []),
        ("invalid record", None, []),
    ],
)
def test_waits_for_comes_from_the_read(name: str, waits_for: WaitsFor | None, short: list[str]) -> None:
    view = job_view(READS[name](), "n1")
    assert (view["waits_for"], view["short_of_capacity"]) == (waits_for, short)


def test_waits_for_ignores_the_text_of_notes() -> None:
    view = job_view(job_read(0, joins=("n1",), pending={"n2": "no free slots, nothing like that"}), "n1")
    assert view["waits_for"] is WaitsFor.CAPACITY
    single = job_view(job_read(0, nnodes=NodeRange(1, 1)), "n1")
    assert single["waits_for"] is WaitsFor.NODES and "waiting for" not in single["reason"]


def _service(tmp_path: Path) -> Any:
    """A stand-in for ``CommandService`` with what these handlers use."""

    async def logs(args: LogsArgs) -> LogsRead:
        read = READS["running"]()
        got = Read([Chunk(1, 0, "x\n")], args.cursor | {"attempt_1/rank_0.log": 2}, False)
        return LogsRead(job_view(read, "n1"), round_view(read), got, {1: 5.0})

    async def records() -> list[NodeRecord]:
        return [record]

    record = NodeRecord("n1", 2, "h", "0.1.0", "10.0.0.1", InventoryRecord("gpu", 2, (Gpu(0, "u", "A", 1),)))
    facts = NodeFacts("n1", 0.0, ("127.0.0.1:2379",), False, False, 30.0, tmp_path)
    space = Space(
        SpaceLevel.FULL, EtcdStatus(3 << 30, 1 << 30, 9, ("NOSPACE",)), SpaceLimits(2 << 30, 0.8), 5.0
    )
    jobs = SimpleNamespace(logs=logs)
    return SimpleNamespace(
        facts=facts, jobs=jobs, nodes=SimpleNamespace(records=records, etcd_space=lambda: space)
    )


@pytest.mark.parametrize(
    ("handler", "args", "reply"),
    [
        (ping.ping, wire.NoArgs(), wire.PingReply),
        (nodes.nodes, wire.NoArgs(), wire.NodesReply),
        (logs.logs, LogsArgs(JOB), wire.LogsReply),
    ],
)
def test_handler_replies_are_their_wire_reply(tmp_path: Path, handler: Any, args: Any, reply: Any) -> None:
    result = asyncio.run(handler(_service(tmp_path), args, Caller(0, 0, 1)))
    decode(reply, as_json(result), unknown=Unknown.REJECT)


def test_error_replies_are_wire_error_replies() -> None:
    from elasticd.errors import InsufficientCapacity, to_wire

    decode(wire.ErrorReply, to_wire(InsufficientCapacity("no", requested=2)), unknown=Unknown.REJECT)
    decode(wire.ErrorReply, to_wire(RuntimeError("x")), unknown=Unknown.REJECT)


# -- decode: TypedDicts ---------------------------------------------------------------------------
class Inner(TypedDict):
    n: int


class Outer(TypedDict):  # stringified annotations (this module): decode reads them itself
    name: str
    inner: list[Inner]
    note: NotRequired[str | None]


def test_decode_typeddict() -> None:
    value = {"name": "x", "inner": [{"n": 1}]}
    assert decode(Outer, value) == value
    assert decode(Outer, value | {"note": None}) == value | {"note": None}
    assert decode(Outer, value | {"extra": 1}) == value  # ignored: only declared keys come back


@pytest.mark.parametrize(
    ("value", "path", "kind"),
    [
        ({"inner": []}, "name", "missing"),
        ({"name": "x", "inner": [{"n": "1"}]}, "inner[0].n", "type"),
        ({"name": "x", "inner": [], "note": 3}, "note", "type"),
        ([], "", "type"),
        ({"name": "x", "inner": [], "extra": 1}, "", "unknown"),
    ],
)
def test_decode_typeddict_errors(value: Any, path: str, kind: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(Outer, value, unknown=Unknown.REJECT)
    assert (info.value.path, info.value.kind) == (path, kind)

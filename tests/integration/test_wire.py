"""A real daemon answers every command with the reply type ``elasticd.wire`` declares for it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from elasticd.decode import Unknown, decode
from elasticd.wire import (
    COMMANDS,
    DrainArgs,
    JobView,
    KillArgs,
    LogsArgs,
    NoArgs,
    StatusArgs,
    SubmitArgs,
    UndrainArgs,
    WaitsFor,
)
from tests.support import REPO, DaemonProc, wait_for

SLEEPER = REPO / "tests" / "scripts" / "sleeper.py"


def ask(d: DaemonProc, cmd: str, args: object) -> Any:
    """One request built from the schema; its reply must decode as the schema's reply type."""
    client = d.client()
    try:
        result = client.request(cmd, args)
    finally:
        client.close()
    decode(COMMANDS[cmd].reply, result, unknown=Unknown.REJECT)
    return result


def sleeper(nproc: int, tmp_path: Path) -> SubmitArgs:
    return SubmitArgs(
        entry_kind="script",
        entry=str(SLEEPER),
        cwd=str(tmp_path),
        python=sys.executable,
        env=dict(os.environ),
        nproc_per_node=nproc,
    )


def test_every_reply_is_its_wire_type(daemon: DaemonProc, tmp_path: Path) -> None:
    assert ask(daemon, "ping", NoArgs())["node"] == daemon.node_id
    assert [n["node"] for n in ask(daemon, "nodes", NoArgs())["nodes"]] == [daemon.node_id]
    assert ask(daemon, "drain", DrainArgs(daemon.node_id))["jobs"] == []
    ask(daemon, "undrain", UndrainArgs(daemon.node_id))

    big: JobView = ask(daemon, "submit", sleeper(4, tmp_path))  # takes the daemon's 4 slots
    wait_for(lambda: ask(daemon, "status", StatusArgs(big["id"]))["job"]["state"] == "RUNNING", 30)
    small: JobView = ask(daemon, "submit", sleeper(1, tmp_path))
    assert (small["state"], small["waits_for"]) == ("PENDING", WaitsFor.CAPACITY)
    assert small["short_of_capacity"] == [daemon.node_id]

    wait_for(lambda: ask(daemon, "logs", LogsArgs(big["id"]))["chunks"], 30, what="the sleepers' output")
    jobs = ask(daemon, "status", StatusArgs())["jobs"]
    assert {j["id"] for j in jobs} == {big["id"], small["id"]}
    assert ask(daemon, "kill", KillArgs(small["id"]))["job"]["state"] == "KILLED"
    assert ask(daemon, "kill", KillArgs(big["id"]))["job"]["state"] == "KILLED"


def test_cli_says_a_job_waits_for_capacity(daemon: DaemonProc, tmp_path: Path) -> None:
    big = ask(daemon, "submit", sleeper(4, tmp_path))
    wait_for(lambda: daemon.job(big["id"])["state"] == "RUNNING", 30)
    res = daemon.ctl("submit", str(SLEEPER), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job = res.stdout.splitlines()[0]
    assert f"elasticctl: {job} is PENDING: " in res.stderr and "waiting for 1 free" in res.stderr
    detail = daemon.ctl("status", job).stdout
    assert "waits_for:" in detail and "capacity" in detail
    for job_id in (job, big["id"]):
        daemon.ctl("kill", job_id)

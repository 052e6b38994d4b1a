"""The job's store host (``jobs.agentstore``): the ranks are clients of a ``TCPStore`` forked from
the job's zygote, as torchrun's workers are of their agent's; it outlives a worker's SIGKILL and
the restart, and dies with the job and with its zygote."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonFactory
from tests.support import DaemonProc, alive_pid, log_events, start_cluster, submit_job, wait_for, wait_log

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(120), pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "agent_store.py"


def record(out: Path, rnd: int, rank: int) -> dict[str, Any]:
    return dict(json.loads((out / f"s.{rnd}.{rank}.json").read_text()))


def test_the_store_host_outlives_a_workers_sigkill_and_serves_the_restart(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    job = submit_job(daemon, tmp_path, "--nproc-per-node", "2", "--max-restarts", "1", str(SCRIPT))
    assert daemon.wait_state(job, ("SUCCEEDED", "FAILED"), 90)["state"] == "SUCCEEDED", daemon.log_text()[
        -3000:
    ]
    hosts = log_events(daemon, "store.listening", job=job)
    assert len(hosts) == 1, f"one store host for both rounds, got {hosts}"
    pid, port = hosts[0]["pid"], hosts[0]["port"]
    cleared = log_events(daemon, "store.cleared", job=job)  # at the join: a new one has no keys
    assert [(e["attempt"], e["pid"]) for e in cleared] == [(1, pid)], cleared
    for rnd in (0, 1):
        for rank in (0, 1):
            r = record(tmp_path, rnd, rank)
            assert (r["use_agent_store"], r["master_port"], r["sum"]) == ("True", port, 3.0), (rnd, rank, r)
            assert r["restart_count"] == rnd
    assert [
        e["returncode"] for e in log_events(daemon, "worker.exited", pid=record(tmp_path, 0, 1)["pid"])
    ] == [-9]
    stopped = wait_log(daemon, "store.stopped", job=job)  # with the job
    assert stopped["pid"] == pid and not alive_pid(pid)


def test_the_store_host_dies_with_its_zygote(daemon: DaemonProc, tmp_path: Path) -> None:
    job = submit_job(
        daemon, tmp_path, "--nproc-per-node", "2", "--max-restarts", "0", str(SCRIPT), env={"HOLD": "1"}
    )
    host = wait_log(daemon, "store.listening", 60, job=job)
    zygote = wait_log(daemon, "zygote.ready", 60, job=job)
    wait_for(lambda: len(list(tmp_path.glob("s.0.*.json"))) == 2, 60, what="round 0's workers")
    assert alive_pid(host["pid"])
    os.kill(zygote["pid"], signal.SIGKILL)
    wait_for(lambda: not alive_pid(host["pid"]), 10, what="the store host's end")
    assert daemon.wait_state(job, ("SUCCEEDED", "FAILED"), 60)["state"] == "FAILED"


def test_the_ranks_of_two_nodes_share_the_leaders_store_host_after_a_restart(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """Every node of a round follows its leader's join; by the restart every zygote is ready. A
    store host that served a round of two nodes is never offered again: the next round's ranks get
    a new host on a new port, so a rank of the old round still running elsewhere cannot write into
    their keys."""
    a, b = start_cluster(daemon_factory, 2)
    job = submit_job(
        a,
        tmp_path,
        *("--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "2", str(SCRIPT)),
        env={"CRASH_ROUNDS": "0,1"},
    )
    assert a.wait_state(job, ("SUCCEEDED", "FAILED"), 90)["state"] == "SUCCEEDED", a.log_text()[-3000:]
    round_0 = {record(tmp_path, 0, rank)["use_agent_store"] for rank in (0, 1)}
    assert len(round_0) == 1, "the nodes disagree in round 0"
    ports = []
    for rnd in (1, 2):
        r0, r1 = record(tmp_path, rnd, 0), record(tmp_path, rnd, 1)
        assert r0["use_agent_store"] == r1["use_agent_store"] == "True" and r0["sum"] == r1["sum"] == 3.0
        chosen = [e for d in (a, b) for e in log_events(d, "store.chosen", job=job, round=rnd)]
        assert [e["agent_store"] for e in chosen] == [True, True], chosen
        assert any(r0["master_port"] in [e["port"] for e in log_events(d, "store.listening", job=job)]
                   for d in (a, b)), "no store host of the job listened on MASTER_PORT"  # fmt: skip
        ports.append(r0["master_port"])
    assert ports[0] != ports[1], "a store host served two rounds of two nodes"
    assert a.job(job)["master"].endswith(f":{ports[1]}")
    stopped = [e["port"] for d in (a, b) for e in log_events(d, "store.stopped", job=job)]
    assert ports[0] in stopped, "round 1's store host was not stopped"
    for d in (a, b):  # emptied before the node joined, never once a rank of the round could connect
        events = log_events(d)
        for i, e in enumerate(events):
            if e["event"] == "store.cleared" and e.get("job") == job:
                started = [x for x in events[:i] if x["event"] == "agent.state" and x.get("job") == job
                           and x["state"] == "RUNNING" and x["round"] == e["attempt"]]  # fmt: skip
                assert not started, f"round {e['attempt']}'s store host was emptied after the round began"


def test_a_leader_whose_store_host_died_after_its_join_starts_another_on_the_same_port(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """The leader offers its store host in its join; the host dies before the round starts (held
    open here by the other node, drained until then). That node's ranks were told the port, so
    the leader starts a new host on it at the start, and the round runs on it."""
    a, b = start_cluster(daemon_factory, 2)
    assert a.ctl("drain", b.node_id).returncode == 0
    job = submit_job(a, tmp_path, "--nnodes", "2", "--nproc-per-node", "1", str(SCRIPT), env={"HOLD": "1"})
    wait_log(a, "job.joining", 30, job=job)  # a joins first: it leads round 0, and so round 1
    assert b.ctl("undrain", b.node_id).returncode == 0
    wait_for(lambda: len(list(tmp_path.glob("s.0.*.json"))) == 2, 60, what="round 0's workers")
    offers = len(log_events(a, "store.offer", job=job))
    assert a.ctl("drain", b.node_id, "--force", "--grace", "2").returncode == 0
    offer = wait_for(lambda: log_events(a, "store.offer", job=job)[offers:], 60, what="a's join to round 1")[
        0
    ]
    assert offer["agent_store"] is True, offer  # its zygote is ready by now
    host = log_events(a, "store.listening", job=job)[-1]  # started for that join
    os.kill(host["pid"], signal.SIGKILL)
    wait_for(lambda: not alive_pid(host["pid"]), 10, what="the store host's end")
    assert b.ctl("undrain", b.node_id).returncode == 0
    wait_for(lambda: len(list(tmp_path.glob("s.1.*.json"))) == 2, 60, what="round 1's workers")
    for rank in (0, 1):
        r = record(tmp_path, 1, rank)
        assert (r["use_agent_store"], r["master_port"], r["sum"]) == ("True", host["port"], 3.0), (rank, r)
    again = log_events(a, "store.listening", job=job)[-1]
    assert again["port"] == host["port"] and again["pid"] != host["pid"], again
    (tmp_path / "finish").touch()
    assert a.wait_state(job, ("SUCCEEDED", "FAILED"), 60)["state"] == "SUCCEEDED"

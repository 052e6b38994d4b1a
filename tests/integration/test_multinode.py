"""Several daemons ("hosts") on one machine against one etcd: elastic rendezvous end to end."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from tests.conftest import DaemonFactory
from tests.etcd_clients import ClientPolicy
from tests.support import (
    REPO,
    DaemonProc,
    EtcdServer,
    alive_pid,
    log_events,
    start_cluster,
    submit_job,
    unique,
    wait_for,
    wait_job,
    wait_log,
    wait_round,
    worker_records,
)

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"
TTL = 3.0


def assert_agreement(records: list[dict[str, Any]]) -> None:
    world = int(records[0]["WORLD_SIZE"])
    assert sorted(int(r["RANK"]) for r in records) == list(range(world))
    assert {r["WORLD_SIZE"] for r in records} == {str(world)}
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in records}) == 1
    assert len({r["TORCHELASTIC_RESTART_COUNT"] for r in records}) == 1


def node_order(records: list[dict[str, Any]]) -> list[str]:
    """Nodes in group-rank order."""
    by_group = {int(r["GROUP_RANK"]): r["ELASTICD_OWNER"] for r in records}
    return [by_group[g] for g in sorted(by_group)]


@pytest.mark.torch
@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_agreement_and_real_allreduce_across_daemons(
    daemon_factory: DaemonFactory, tmp_path: Path, n: int
) -> None:
    pytest.importorskip("torch")
    ds = start_cluster(daemon_factory, n)
    job = submit_job(ds[0], tmp_path, "--nnodes", f"1:{n}", "--nproc-per-node", "1", "--last-call", "30",
                 str(SCRIPTS / "allreduce.py"))  # fmt: skip
    results = wait_for(
        lambda: len(list(tmp_path.glob("ar.*.json"))) == n, 120, 0.2, "every rank's all_reduce"
    )
    assert results
    got = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("ar.*.json"))]
    assert sorted(g["rank"] for g in got) == list(range(n))
    assert all(g["world"] == n and g["sum"] == n * (n + 1) / 2 for g in got)
    assert len({g["master"] for g in got}) == 1
    assert {g["node"] for g in got} == {d.node_id for d in ds}
    final = ds[-1].wait_state(job, ("SUCCEEDED", "FAILED"), 60)
    assert final["state"] == "SUCCEEDED"
    # Every daemon shows the same cluster-wide picture.
    views = [d.job(job) for d in ds]
    assert {(v["state"], v["round"], v["restarts"]) for v in views} == {("SUCCEEDED", 0, 0)}
    listed = {d.node_id: {n["node"] for n in d.call("nodes")["nodes"]} for d in ds}
    assert all(nodes >= {x.node_id for x in ds} for nodes in listed.values())


def test_last_call_closes_with_min_and_join_timeout_fails(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    a, b = start_cluster(daemon_factory, 2)
    t0 = time.monotonic()
    job = submit_job(a, tmp_path, "--nnodes", "1:3", "--last-call", "1.5", str(SCRIPTS / "member.py"))
    records = wait_round(tmp_path, 0, 2)
    took = time.monotonic() - t0
    assert_agreement(records)
    # Closed at the last call with 2 of at most 3 (without it, the round would wait for a third
    # node until the join timeout, 600 s); the slack is the workers' start on loaded cores.
    assert 1.5 <= took < 1.5 + 15, took
    view = b.job(job)
    assert view["state"] == "RUNNING" and sorted(view["nodes"]) == sorted([a.node_id, b.node_id])
    (tmp_path / "finish").touch()
    assert a.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"

    out2 = tmp_path / "fixed"
    out2.mkdir()
    job2 = submit_job(b, out2, "--nnodes", "3", "--join-timeout", "3", str(SCRIPTS / "member.py"))
    failed = a.wait_state(job2, ("FAILED",), 20)
    assert "only 2 of the 3 nodes needed joined within 3s" in failed["reason"]
    assert not worker_records(out2, 0)


def test_node_loss_elastic_job_shrinks_and_completes(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    ds = start_cluster(daemon_factory, 3)
    job = submit_job(ds[0], tmp_path, "--nnodes", "1:3", "--last-call", "1", str(SCRIPTS / "member.py"))
    first = wait_round(tmp_path, 0, 3)
    assert_agreement(first)
    order = node_order(first)
    victim = next(d for d in ds if d.node_id == order[1])  # a middle rank: survivors keep their order
    survivors = [n for n in order if n != victim.node_id]
    victim_pids = [r["pid"] for r in first if r["ELASTICD_OWNER"] == victim.node_id]
    t0 = time.monotonic()
    victim.kill9()
    for pid in victim_pids:
        if alive_pid(pid):
            os.kill(pid, signal.SIGKILL)
    second = wait_round(tmp_path, 1, 2, timeout_s=TTL + 1 + 10)
    took = time.monotonic() - t0
    assert took <= TTL + 1.0 + 1.0 + 1.5, took  # TTL + last call + a second (+ python start-up)
    assert_agreement(second)
    assert node_order(second) == survivors
    assert all(not alive_pid(r["pid"]) for r in first)  # the old round is gone everywhere
    alive = next(d for d in ds if d is not victim)
    view = alive.job(job)
    assert view["restarts"] == 1 and view["world_size"] == 2 and view["round"] == 1
    (tmp_path / "finish").touch()
    assert alive.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def test_fixed_size_job_waits_for_a_replacement(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    ds = start_cluster(daemon_factory, 3)
    job = submit_job(ds[0], tmp_path, "--nnodes", "3", "--join-timeout", "60", str(SCRIPTS / "member.py"))
    wait_round(tmp_path, 0, 3)
    ds[2].kill9()
    wait_for(lambda: ds[0].job(job)["state"] == "RESTARTING", TTL + 5, 0.1, "the loss to be noticed")
    # Both survivors have joined round 1 (or it closed, which the asserts below then reject).
    joined = "2 of 3 node(s) joined round 1"
    view = wait_job(ds[0], job, lambda v: v["state"] != "RESTARTING" or joined in v["reason"],
                    "both survivors to join round 1", timeout_s=20)  # fmt: skip
    assert view["state"] == "RESTARTING" and view["round"] == 1, view
    assert not worker_records(tmp_path, 1)  # 2 of 3: the round stays open
    replacement = daemon_factory(unique("spare"), "--lease-ttl", str(TTL), "--slots", "2")
    second = wait_round(tmp_path, 1, 3, timeout_s=20)
    assert_agreement(second)
    # A round's result is written once: round 1 closing with the replacement proves that it did not
    # close with the 2 survivors before the replacement came.
    assert replacement.node_id in node_order(second)
    (tmp_path / "finish").touch()
    assert ds[0].wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def test_scale_up_joins_at_the_next_round(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    ds = start_cluster(daemon_factory, 3)
    job = submit_job(ds[1], tmp_path, "--nnodes", "1:4", "--last-call", "1", str(SCRIPTS / "member.py"))
    first = wait_round(tmp_path, 0, 3)
    newcomer = daemon_factory(unique("late"), "--lease-ttl", str(TTL), "--slots", "2")
    second = wait_round(tmp_path, 1, 4, timeout_s=20)
    assert_agreement(second)
    assert node_order(second)[:3] == node_order(first) and node_order(second)[3] == newcomer.node_id
    view = newcomer.job(job)
    assert view["restarts"] == 0 and view["world_size"] == 4  # growing is not a failure
    (tmp_path / "finish").touch()
    assert newcomer.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def test_concurrent_failures_bump_once_and_spend_once(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    ds = start_cluster(daemon_factory, 3)
    job = submit_job(ds[0], tmp_path, "--nnodes", "3", "--max-restarts", "5", str(SCRIPTS / "member.py"),
                 env={"FAIL_ON_ROUND": "0", "FAIL_AFTER": "0.5"})  # fmt: skip
    wait_round(tmp_path, 0, 3)
    second = wait_round(tmp_path, 1, 3, timeout_s=20)
    assert_agreement(second)
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in second} == {"1"}
    # A node acts on its round-0 failure (it bumps and logs it, or finds the round moved on) before
    # it starts its part of round 1: once every node has, all three failures have been acted on.
    for d in ds:
        wait_log(d, "attempt.started", job=job, round=1)
    view = ds[2].job(job)
    assert (view["round"], view["restarts"], view["state"]) == (1, 1, "RUNNING")
    assert not worker_records(tmp_path, 2)
    bumps = [e for d in ds for e in log_events(d, "round.bumped", job=job)]
    assert len(bumps) == 1, bumps
    (tmp_path / "finish").touch()
    final = ds[0].wait_state(job, ("SUCCEEDED", "FAILED"))
    assert final["state"] == "SUCCEEDED"
    assert (final["round"], final["restarts"]) == (1, 1), final  # and none later, until the end


def test_frozen_daemon_is_fenced_and_rejoins(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    ds = start_cluster(daemon_factory, 3)
    job = submit_job(ds[0], tmp_path, "--nnodes", "1:3", "--last-call", "1", str(SCRIPTS / "member.py"))
    first = wait_round(tmp_path, 0, 3)
    frozen = ds[2]
    frozen_pids = [r["pid"] for r in first if r["ELASTICD_OWNER"] == frozen.node_id]

    overlaps: list[str] = []
    stop = threading.Event()

    def watch_rounds() -> None:  # no two rounds of the job may have live workers at once
        while not stop.is_set():
            live: dict[str, list[int]] = {}
            for path in tmp_path.glob("w.*.json"):
                try:
                    rec = json.loads(path.read_text())
                except ValueError:
                    continue
                if alive_pid(rec["pid"]):
                    live.setdefault(rec["ELASTICD_ROUND"], []).append(rec["pid"])
            if len(live) > 1:
                overlaps.append(repr(live))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_rounds, daemon=True)
    watcher.start()
    try:
        assert frozen.proc is not None
        t0 = time.monotonic()
        frozen.proc.send_signal(signal.SIGSTOP)
        # The reaper fences the frozen node's workers before its lease can expire.
        wait_for(lambda: not any(alive_pid(p) for p in frozen_pids), TTL + 2, 0.05, "fenced workers to die")
        assert time.monotonic() - t0 < TTL
        wait_round(tmp_path, 1, 2, timeout_s=TTL + 10)
        # Still frozen, it has been let go: its lease expired (its node record is gone) and round 1
        # runs without it.
        wait_for(lambda: frozen.node_id not in {n["node"] for n in ds[0].call("nodes")["nodes"]},
                 TTL + 10, 0.1, "the frozen node's lease to expire")  # fmt: skip
        view = ds[0].job(job)
        assert (view["state"], view["round"]) == ("RUNNING", 1) and frozen.node_id not in view["nodes"], view
        frozen.proc.send_signal(signal.SIGCONT)
        # Back, it stops what is stale and comes back as a newcomer: the job grows again.
        third = wait_round(tmp_path, 2, 3, timeout_s=20)
        assert_agreement(third)
        assert node_order(third)[-1] == frozen.node_id
        assert frozen.events("lease.lost")
    finally:
        stop.set()
        watcher.join(5)
    assert not overlaps, overlaps[:3]
    (tmp_path / "finish").touch()
    assert ds[0].wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def test_nodes_restricts_who_takes_part(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    ds = start_cluster(daemon_factory, 3)
    allowed = f"{ds[0].node_id},{ds[2].node_id}"
    job = submit_job(ds[1], tmp_path, "--nnodes", "1:3", "--last-call", "1", "--nodes", allowed,
                     str(SCRIPTS / "member.py"))  # fmt: skip
    records = wait_round(tmp_path, 0, 2)
    assert {r["ELASTICD_OWNER"] for r in records} == {ds[0].node_id, ds[2].node_id}
    # Round 0 runs with a seat free. A submit replies only after its daemon has looked at every job
    # it is not part of (a scan): once this one returns, ds[1] has decided about the running job,
    # and it logs job.joining before replying if it takes part.
    probe_out = tmp_path / "probe"
    probe_out.mkdir()
    (probe_out / "finish").touch()
    probe = submit_job(ds[1], probe_out, str(SCRIPTS / "member.py"))  # single-node: runs on ds[1]
    assert not log_events(ds[1], "job.joining", job=job)
    assert ds[1].job(job)["allowed_nodes"] == allowed.split(",") and not worker_records(tmp_path, 1)
    assert ds[1].wait_state(probe, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
    (tmp_path / "finish").touch()
    assert ds[1].wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def test_a_mixed_cluster_runs_both_clients_each_leading_the_other(
    daemon_factory: DaemonFactory, etcd_clients: ClientPolicy, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """The suite's mixed clusters (tests/etcd_clients.py) are what they claim: the 1st daemon talks
    to etcd over the gateway, the 2nd over grpc, and a round led by either closes with the other
    as a member (the leader is the node whose join is oldest, so each joins first in turn).
    Budget: about 10 s."""
    if etcd_clients.mode != "mixed":
        pytest.skip(etcd_clients.header())
    tag = unique("mx")
    a = daemon_factory(f"{tag}-0", "--lease-ttl", str(TTL), "--slots", "2")
    b = daemon_factory(f"{tag}-1", "--lease-ttl", str(TTL), "--slots", "2", start=False)
    assert (a.etcd_client, b.etcd_client) == ("gateway", "grpc")
    keys, etcd = Keys(a.etcd_prefix), EtcdClient([etcd_server.endpoint], timeout_s=5)

    def led(leader: DaemonProc, member: DaemonProc, out: Path) -> None:
        """``leader`` joins a 2-node job alone; ``member`` (started now) makes the round close."""
        out.mkdir()
        job = submit_job(leader, out, "--nnodes", "2", str(SCRIPTS / "member.py"))
        wait_for(lambda: etcd.get(keys.join(job, 0, leader.node_id)), 15, 0.05, f"{leader.node_id} to join")
        member.start()
        assert {r["ELASTICD_OWNER"] for r in wait_round(out, 0, 2)} == {leader.node_id, member.node_id}
        closed = wait_log(leader, "round.complete", job=job, round=0)
        assert sorted(closed["members"]) == sorted([leader.node_id, member.node_id]), closed
        assert not log_events(member, "round.complete", job=job)
        (out / "finish").touch()
        assert member.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"

    try:
        led(a, b, tmp_path / "gateway-leads")
        a.stop()
        led(b, a, tmp_path / "grpc-leads")
    finally:
        etcd.close()
    assert {e["client"] for e in a.events("etcd.connected")} == {"gateway"}
    assert {e["client"] for e in b.events("etcd.connected")} == {"grpc"}

"""elasticd's side: one round of N nodes against the bench's etcd, from the start signal to every
node holding its assignment, and what it cost (requests, bytes, events, CPU)."""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.paths import REPO

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from elasticd.rendezvous.store import InlineJobStore, run_inline
from rdzvscale.etcdrates import cpu_s
from rdzvscale.node import spec_for
from rdzvscale.participants import collect, spawn, start
from rdzvscale.report import Outcome, median_max
from rdzvscale.scan import ScanProbe, scan_meter


@dataclass(frozen=True)
class Side:
    """Whose participants play a round: this checkout's (``elasticd``), or another commit's."""

    name: str = "elasticd"
    code: Path = REPO


def measure_round(
    endpoint: str,
    etcd_pid: int | None,
    n: int,
    procs: int,
    timeout_s: float,
    watch: str,
    publish: bool,
    side: Side = Side(),
) -> Outcome:
    """``run_elasticd``, with the load before it and the CPU etcd and the participants' processes
    spent over it (etcd's: over the whole run, and over the round alone)."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    etcd_cpu, children = cpu_s(etcd_pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    outcome = run_elasticd(endpoint, etcd_pid, n, procs, timeout_s, watch, publish, side)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    outcome.etcd_cpu_s = cpu_s(etcd_pid) - etcd_cpu
    outcome.load = load
    outcome.harness_cpu_s = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    return outcome


def run_elasticd(
    endpoint: str,
    etcd_pid: int | None,
    n: int,
    procs: int,
    timeout_s: float,
    watch: str,
    publish: bool,
    side: Side,
) -> Outcome:
    prefix = f"/bench/{n}-{time.time_ns()}"
    job_id = f"scale-{n}"
    setup = EtcdClient([endpoint], timeout_s=30)
    assert run_inline(InlineJobStore(setup, Keys(prefix), job_id).create(spec_for(n, job_id)))
    setup.close()
    scan = ScanProbe(endpoint, Keys(prefix), job_id, scan_meter())
    try:  # (an interrupted bench stops its probe before it stops etcd)
        children = spawn(endpoint, prefix, job_id, n, procs, timeout_s, watch, publish, side.code)
        scan.start(timeout_s)
        t0, round_cpu = time.time(), cpu_s(etcd_pid)  # (each node's lease and watches: before)
        start(children)
        reports, errors = collect(children, t0 + timeout_s + 90)
        round_cpu = cpu_s(etcd_pid) - round_cpu
    finally:
        scan.stop()
    errors += [r["error"] for r in reports if r["error"]]
    errors += [
        f"{r['node']} found no assignment of its own" for r in reports if r["done_at"] and not r["holds"]
    ]
    finished = [r for r in reports if r["done_at"] is not None and r["holds"]]
    requests = sorted(r["requests"] for r in reports if not r["leader"]) or [0]
    outcome = Outcome(side.name, n, len(finished), None, statistics.median(requests), procs=len(children))
    outcome.etcd_round_cpu_s = round_cpu
    outcome.requests_max = requests[-1]
    _count(outcome, reports)
    outcome.scan_read_bytes, outcome.scan_rounds_bytes = scan.read_bytes, scan.rounds_bytes
    outcome.scan_watch_bytes = scan.watch_bytes
    if len(finished) == n:
        _time_the_round(outcome, reports, t0)
    outcome.note = f"{len(errors)} errors, first: {errors[0]}" if errors else f"+1 watch stream per {watch}"
    outcome.note += "" if publish else ", no status publish"
    return outcome


def _count(outcome: Outcome, reports: list[dict[str, Any]]) -> None:
    """The nodes' requests, events and bytes: the leader's apart from the members'."""
    outcome.leader_requests = max((r["requests"] for r in reports if r["leader"]), default=0)
    outcome.events = sum(r["events"] for r in reports)
    outcome.join_events = sum(r["join_events"] for r in reports)
    members = [r for r in reports if not r["leader"]] or reports
    outcome.read_bytes_per_participant = median_max([r["read_bytes"] for r in members])
    outcome.written_bytes_per_participant = median_max([r["written_bytes"] for r in members])
    outcome.watch_bytes_per_participant = median_max([r["watch_bytes"] for r in members])
    outcome.leader_read_bytes = max((r["read_bytes"] for r in reports if r["leader"]), default=0)
    outcome.leader_written_bytes = max((r["written_bytes"] for r in reports if r["leader"]), default=0)


def _time_the_round(outcome: Outcome, reports: list[dict[str, Any]], t0: float) -> None:
    """A round every node finished: how long it took, and its close and result after the last join."""
    last_join = max(r["joined_at"] for r in reports)
    closed = max(r["done_at"] for r in reports)
    outcome.seconds = closed - t0
    outcome.after_last_join = closed - last_join
    outcome.last_join = last_join - t0
    leader = max((r["closed_at"] for r in reports if r["closed_at"] is not None), default=None)
    outcome.closed = leader - last_join if leader is not None else None
    told = [r for r in reports if r["result_at"] is not None]
    if leader is not None and told:
        outcome.result_event = median_max([r["result_at"] - leader for r in told])
        outcome.result_read = median_max([r["done_at"] - r["result_at"] for r in told])
        outcome.result_read_cpu = median_max([r["last_step_cpu_s"] for r in told])

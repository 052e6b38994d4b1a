"""The rank the others wait for is named with no change to the script: a real 2-rank DDP job on gloo
under real daemons, one rank slowed from outside (stopped half of every 200 ms; one node's workers
held to a fifth of a core by a cgroup quota); and the drain policy acting on it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from elasticd.netaddr import free_port
from tests.conftest import DaemonFactory
from tests.integration.test_observe import scrape
from tests.slowdowns import cpu_hogs, cpu_quota
from tests.support import REPO, DaemonProc, start_cluster, submit_job, wait_for, wait_job

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"
# Each step of a job slowed by stops also waits this long, as for a data loader: a slow rank is
# named the same way (a sleep is time outside the collectives), with a third of the CPU a
# flat-out job would take from the tests beside it.
PACED = {"STEP_SLEEP_S": "0.02"}


def _ranks(job: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["rank"]: p for m in job.get("members", []) for p in m.get("progress", [])}


def _scored(job: dict[str, Any], world: int = 2) -> bool:
    ranks = _ranks(job)
    return len(ranks) == world and all(r.get("score") is not None for r in ranks.values())


class DutyCycle:
    """SIGSTOP ``pid`` for ``stopped_s`` of every ``period_s``, from a thread, until ``stop``."""

    def __init__(self, pid: int, period_s: float = 0.2, stopped_s: float = 0.1) -> None:
        self.pid, self.period_s, self.stopped_s = pid, period_s, stopped_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DutyCycle:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                os.kill(self.pid, signal.SIGSTOP)
                self._done.wait(self.stopped_s)
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                return
            self._done.wait(self.period_s - self.stopped_s)


def _straggler_events(daemon: DaemonProc, job_id: str) -> list[dict[str, Any]]:
    res = daemon.ctl("events", job_id, "--json")
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    return [e for e in events if e.get("kind") == "straggler"]


@pytest.mark.timeout(300)
def test_a_rank_stopped_half_the_time_is_named_alone_and_cleared(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    port = free_port()
    daemon = daemon_factory(None, "--slots", "4", "--metrics-address", str(port))
    env = dict(os.environ, OUT=str(tmp_path), **PACED)
    res = daemon.ctl("submit", "--nproc-per-node", "2", str(SCRIPTS / "ddp_steady.py"), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.splitlines()[0]
    pid = int(wait_for(lambda: _read(tmp_path / "pid.1"), 120, what="rank 1 to train"))

    healthy = wait_job(daemon, job_id, _scored, "both ranks to be scored", 60)
    assert not any(r["straggler"] for r in _ranks(healthy).values()), _ranks(healthy)

    with DutyCycle(pid):
        named = wait_job(daemon, job_id, lambda j: _ranks(j).get(1, {}).get("straggler"), "rank 1 named", 60)
        slow, fast = _ranks(named)[1], _ranks(named)[0]
        assert not fast["straggler"] and fast["score"] == 1.0
        assert slow["score"] < 0.8 and slow["computing_s"] > fast["computing_s"]
        assert fast["waiting_s"] > slow["waiting_s"]
        found = wait_for(lambda: _straggler_events(daemon, job_id), 30, what="the straggler event")
        assert [(e["fields"]["rank"], e["fields"]["straggler"]) for e in found] == [(1, True)]
        text = daemon.ctl("status", job_id).stdout
        row = next(line.split() for line in text.splitlines() if line.strip().startswith("1 "))
        assert row[-1] == "straggler" and float(row[-3]) < 0.8, text
        m = scrape(port)
        assert m[f'elasticd_rank_slowness_score{{job="{job_id}",rank="1"}}'] < 0.8
        assert m[f'elasticd_rank_slowness_score{{job="{job_id}",rank="0"}}'] == 1.0
        assert m[f'elasticd_rank_waiting_seconds{{job="{job_id}",rank="0"}}'] > 0
        assert m["elasticd_stragglers_total"] == 1

    wait_job(daemon, job_id, lambda j: not _ranks(j).get(1, {}).get("straggler"), "rank 1 cleared", 90)
    said = wait_for(
        lambda: e if len(e := _straggler_events(daemon, job_id)) == 2 else None, 30, what="cleared"
    )
    assert [(e["fields"]["rank"], e["fields"]["straggler"]) for e in said] == [(1, True), (1, False)]

    (tmp_path / "stop").touch()
    wait_job(daemon, job_id, lambda j: j["state"] == "SUCCEEDED", "the job to end", 60)


@pytest.mark.timeout(300)
def test_a_node_whose_workers_are_held_to_a_cpu_quota_holds_the_straggler(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    a, b = start_cluster(daemon_factory, 2)
    # Flat out: a paced rank's sleep would be most of both nodes' computing, the quota's share small.
    job = submit_job(a, tmp_path, "--nnodes", "2", str(SCRIPTS / "ddp_steady.py"))
    view = wait_job(a, job, _scored, "both ranks to be scored", 120)
    assert not any(r["straggler"] for r in _ranks(view).values()), _ranks(view)
    slow_node = next(m for m in view["members"] if m["node"] == b.node_id)
    slow = set(slow_node["ranks"])
    pids = [_pid(tmp_path, r) for r in sorted(slow)]

    def named(j: dict[str, Any]) -> bool:
        return {r for r, p in _ranks(j).items() if p["straggler"]} == slow

    with cpu_quota(pids, 0.2) as group:
        found = wait_job(a, job, named, f"{b.node_id}'s ranks {sorted(slow)} named, alone", 60)
        ranks = _ranks(found)
        fast = [p for r, p in ranks.items() if r not in slow]
        assert all(p["score"] == 1.0 for p in fast) and all(ranks[r]["score"] < 0.8 for r in slow), ranks
        said = wait_for(lambda: _straggler_events(a, job), 30, what="the straggler event")
        assert {(e["fields"]["rank"], e["fields"]["straggler"]) for e in said} == {(r, True) for r in slow}
    assert not group.exists()
    (tmp_path / "stop").touch()
    assert a.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


# The judge's evaluations waited for under load: a full window (4) and a verdict's sustain (3),
# and one more. Minutes of it are bench/bench_stragglers.py's (--kinds loaded --healthy 240).
REPORTS_UNDER_LOAD = 8


@pytest.mark.timeout(300)
def test_a_host_loaded_by_other_processes_names_no_rank_of_a_healthy_job(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """Three CPU hogs on the host's cores (two here) while a healthy 2-rank job runs: both ranks
    wait for a CPU, unequally over a window, and the one that waited more must not be named."""
    daemon = daemon_factory(None, "--slots", "4")
    job = submit_job(daemon, tmp_path, "--nproc-per-node", "2", str(SCRIPTS / "ddp_steady.py"))
    wait_job(daemon, job, _scored, "both ranks to be scored", 120)
    seen: list[dict[int, dict[str, Any]]] = []

    def another_report(j: dict[str, Any]) -> bool:
        ranks = _ranks(j)
        assert not any(p["straggler"] for p in ranks.values()), ranks
        if _scored(j) and (not seen or _evidence(seen[-1]) != _evidence(ranks)):
            seen.append(ranks)  # the judge evaluates as each report is published
        return len(seen) >= REPORTS_UNDER_LOAD

    with cpu_hogs(3):
        wait_job(daemon, job, another_report, f"{REPORTS_UNDER_LOAD} reports under load", 150)
    last = seen[-1]
    assert all(p["queued_s"] > 0.1 * (p["computing_s"] + p["waiting_s"]) for p in last.values()), last
    assert _straggler_events(daemon, job) == []
    (tmp_path / "stop").touch()
    assert daemon.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def _evidence(ranks: dict[int, dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r, p["computing_s"], p["waiting_s"]) for r, p in sorted(ranks.items())]


def _pid(out: Path, rank: int) -> int:
    return int(wait_for(lambda: _read(out / f"pid.{rank}"), 30, what=f"rank {rank}'s pid"))


def _read(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except FileNotFoundError:
        return None


@pytest.mark.timeout(300)
def test_the_drain_policy_moves_a_straggler_s_node_out_of_an_elastic_job(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    a, b = start_cluster(daemon_factory, 2, "--straggler-grace", "3")
    job = submit_job(
        a,
        tmp_path,
        "--nnodes",
        "1:2",
        "--last-call",
        "1",
        "--stragglers",
        "drain",
        str(SCRIPTS / "ddp_steady.py"),
        env=PACED,
    )
    view = wait_job(a, job, _scored, "both ranks to be scored", 120)
    holder = next(m["node"] for m in view["members"] if m["ranks"][0] <= 1 <= m["ranks"][-1])
    other = ({a.node_id, b.node_id} - {holder}).pop()
    pid = int(wait_for(lambda: _read(tmp_path / "pid.1"), 30, what="rank 1's pid"))

    def without_it(j: dict[str, Any]) -> bool:
        return j["state"] == "RUNNING" and j["round"] >= 1 and [m["node"] for m in j["members"]] == [other]

    with DutyCycle(pid):
        after = wait_job(a, job, without_it, "the job to go on without the straggler's node", 150)
    assert after["restarts"] == 0  # a drain is no failure: no restart spent
    res = a.ctl("events", job, "--json")
    drains = [e for e in map(json.loads, res.stdout.splitlines()) if e.get("kind") == "drain"]
    assert [(e["node"], e["fields"]["by"]) for e in drains] == [(holder, "elasticd (stragglers)")], drains
    found = [e for e in map(json.loads, res.stdout.splitlines()) if e.get("kind") == "straggler"]
    assert (found[0]["fields"]["rank"], found[0]["fields"]["straggler"]) == (1, True)

    # A passing check of the node (its slowdown is over) lets it take part again.
    checked = a.ctl("check", holder, "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["returned"] == [{"node": holder, "job": job}]
    both = wait_job(
        a, job, lambda j: j["state"] == "RUNNING" and len(j["members"]) == 2, "both nodes again", 120
    )
    assert both["restarts"] == 0
    (tmp_path / "stop").touch()
    assert a.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"

"""The chaos soak (bench/soak.py), short: every fault kind at least once, then its end checks hold.

The soak starts its own etcd and daemons (through tests/support.py) and cleans them up itself;
this test bounds it, and on a timeout stops it (SIGTERM: its clean-up runs), then kills whatever
carries its temp dir on the command line.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import PYTHON, REPO, etcd_available

BENCH = REPO / "bench"
sys.path.append(str(BENCH))  # bench/ is scripts, not a package

from bench_single import sweep  # noqa: E402
from soak_check import allowed_key, check_crash_loss  # noqa: E402
from soak_cluster import Step  # noqa: E402
from soak_plan import ALL_KINDS, FaultKind, make_plan, parse_kinds  # noqa: E402

from elasticd.etcd.keys import Keys  # noqa: E402

SEED = 20240610
DURATION_S = 90
BOUND_S = 240  # the soak's own budget: 90 s of faults, set-up, the finish and the checks


def test_plan_is_seeded_and_covers_every_kind_first() -> None:
    plan = make_plan(SEED, 90, ALL_KINDS, nodes=3, gap_s=8)
    assert plan == make_plan(SEED, 90, ALL_KINDS, nodes=3, gap_s=8)
    assert plan != make_plan(SEED + 1, 90, ALL_KINDS, nodes=3, gap_s=8)
    assert {f.kind for f in plan[: len(ALL_KINDS)]} == set(ALL_KINDS)
    assert all(0 <= f.target < 3 for f in plan)
    assert [f.at_s for f in plan] == sorted(f.at_s for f in plan)
    assert all(b.at_s - a.at_s >= 8 - 8 / 3 for a, b in itertools.pairwise(plan))
    assert parse_kinds("drain, worker_kill,drain") == (FaultKind.DRAIN, FaultKind.WORKER_KILL)
    with pytest.raises(ValueError, match="unknown fault kind"):
        parse_kinds("meteor")


def test_crash_loss_bound_and_allowed_keys() -> None:
    def log(*steps: int) -> list[Step]:
        return [Step(s, 3, 0, float(i)) for i, s in enumerate(steps)]

    assert check_crash_loss(log(0, 1, 2, 3, 4), every=2).ok
    assert check_crash_loss(log(0, 1, 2, 3, 2, 3, 4), every=2).ok  # 2 redone: within the bound
    assert not check_crash_loss(log(0, 1, 2, 3, 1, 2), every=2).ok  # 3 redone
    assert not check_crash_loss(log(0, 1, 3), every=2).ok  # a step never run
    k, job, live = Keys("/p"), "job-1", {"n1"}
    ok = [k.job_spec(job), k.job_body(job), k.job_final(job), k.result(job, 7), k.done(job, 7, "n2"),
          k.left(job, 6, "n2"), k.node("n1"), k.janitor(), k.node_status(job, "n1")]  # fmt: skip
    leaked = [k.result(job, 5), k.waiting(job, "n1"), k.drain("n2"), k.node("n2"), k.job_drain(job, "n1"),
              k.pending_note(job, "n1"), k.job_spec("other"), k.job_body("other"), "/p/junk",
              k.node_status(job, "n2"), k.node_status("other", "n1"), k.join(job, 5, "n1"),
              f"/p/jobs/{job}/nodes/n1", f"/p/jobs/{job}/pending/n1"]  # fmt: skip
    assert all(allowed_key(k, key, job, 7, live) for key in ok)
    assert not any(allowed_key(k, key, job, 7, live) for key in leaked)


@pytest.mark.torch
@pytest.mark.timeout(BOUND_S + 60)
@pytest.mark.skipif(not etcd_available(), reason="no etcd binary")
def test_soak_survives_every_fault_kind(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    report = tmp_path / "soak.json"
    log = tmp_path / "soak.log"
    argv = [PYTHON, str(BENCH / "soak.py"), "--duration", str(DURATION_S), "--seed", str(SEED),
            "--faults", "all", "--gap", "8", "--recover-timeout", "60", "--json", str(report)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        proc.wait(BOUND_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    finally:
        text = log.read_text(errors="replace")
        if m := re.search(r"dir=(\S+)", text):  # the soak's temp dir: anything still carrying it goes
            sweep([m.group(1)])
    assert proc.returncode == 0, text[-6000:]
    result = json.loads(report.read_text())
    assert result["ok"] and result["state"] == "SUCCEEDED", text[-6000:]
    failed = [c for c in result["checks"] if not c["ok"]]
    assert not failed, failed
    injected = {row["kind"] for row in result["table"] if row["injected"] > 0}
    assert injected == set(result["kinds"]), result["table"]
    assert all(row["survived"] == row["injected"] for row in result["table"]), result["table"]

"""The benches run, at CI size: they print their tables and exit 0. (Their figures are measured by
running them, never asserted here: a loaded 2-core CI machine says nothing about them.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, etcd_available

pytestmark = [pytest.mark.skipif(not etcd_available(), reason="needs the etcd binary"), pytest.mark.slow]


def _bench(name: str, *args: str, timeout_s: float = 240) -> str:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    res = subprocess.run(
        [sys.executable, str(REPO / "bench" / name), *args],
        capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def test_bench_footprint_prints_its_table(tmp_path: Path) -> None:
    out = _bench(
        "bench_footprint.py", "--idle-seconds", "1", "--settle", "0.5", "--clients", "3", "--requests", "5",
        "--json", str(tmp_path / "fp.json"),
    )  # fmt: skip
    for line in (
        "idle CPU (% of one core)",
        "idle, no job",
        "one running job",
        "memory (MB)",
        "control RPC:",
    ):
        assert line in out, out
    assert (tmp_path / "fp.json").read_text().startswith("{")


def test_bench_rdzv_scale_prints_its_table(tmp_path: Path) -> None:
    out = _bench("bench_rdzv_scale.py", "--sizes", "4,8", "--procs", "2", "--timeout", "60", "--no-rates",
                 "--json", str(tmp_path / "rdzv.json"))  # fmt: skip
    assert "closed after last join (s)" in out, out
    rows = [
        line.split()
        for line in out.splitlines()
        if line.split()[:2] in (["4", "elasticd"], ["8", "elasticd"])
    ]
    assert len(rows) == 2 and all("DNF" not in r for r in rows), out
    assert "bytes per participant read" in out, out


def test_bench_rdzv_scale_sets_two_commits_side_by_side_and_breaks_etcds_cpu_down(tmp_path: Path) -> None:
    out = _bench("bench_rdzv_scale.py", "--sizes", "4", "--procs", "1", "--timeout", "60", "--no-rates",
                 "--versus", "HEAD", "--breakdown", "8", "--json", str(tmp_path / "rdzv.json"))  # fmt: skip
    assert "elasticd@HEAD" in out and "etcd CPU/participant (ms)" in out, out
    assert "etcd CPU per operation" in out and "glance_closed" in out, out
    data = json.loads((tmp_path / "rdzv.json").read_text())
    assert {b["client"] for b in data["breakdown"]} == {"gateway", "grpc"}
    assert {o["side"] for o in data["outcomes"]} == {"elasticd", "elasticd@HEAD"}


def test_bench_queue_load_prints_its_table(tmp_path: Path) -> None:
    out = _bench(
        "bench_queue_load.py", "--jobs", "20", "--users", "3", "--spec-bytes", "4096", "--idle-seconds", "1",
        "--settle", "0.2", "--requests", "3", "--think-ms", "0", "--json", str(tmp_path / "q.json"),
    )  # fmt: skip
    for line in (
        "empty cluster",
        "20 pending jobs",
        "status (table)",
        "status --json",
        "status <job>",
        "submit",
    ):
        assert line in out, out
    assert (tmp_path / "q.json").read_text().startswith("[")


@pytest.mark.torch
def test_bench_snapshot_dcp_prints_its_medians() -> None:
    pytest.importorskip("torch")
    out = _bench("bench_snapshot_dcp.py", "--mib", "4", "--rounds", "1", timeout_s=120)
    assert '"behind_over_torch"' in out and '"mib_per_rank": 4' in out, out

"""The shipped Grafana dashboard and Prometheus alerting rules (``packaging/monitoring/``) name
only metrics the daemon declares, and the rules fire on recorded series (``promtool``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests import monitoring as mon


def test_every_metric_a_panel_or_a_rule_names_is_declared_by_the_daemon() -> None:
    asked = mon.referenced(mon.dashboard_exprs()) | mon.referenced(mon.rule_exprs())
    missing = asked - mon.declared()
    assert not missing, (
        f"named by the dashboard or the rules, declared nowhere in elasticd/metrics: {missing}"
    )


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    asked = mon.referenced(mon.dashboard_exprs())
    for name in ("elasticd_jobs", "elasticd_restarts_total", "elasticd_recovery_duration_seconds_bucket",
                 "elasticd_steps_per_second", "elasticd_rank_step_seconds", "elasticd_gpu_healthy",
                 "elasticd_etcd_db_size_bytes", "elasticd_etcd_quota_bytes"):  # fmt: skip
        assert name in asked, name


def test_the_dashboard_is_well_formed() -> None:
    d = mon.dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in d["panels"]:
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool (Debian's prometheus package ships it)")
def test_the_rules_check_and_fire_on_recorded_series() -> None:
    assert PROMTOOL is not None
    for argv in (["check", "rules", "elasticd-alerts.yml"], ["test", "rules", "elasticd-alerts.test.yml"],
                 ["check", "config", "prometheus.yml"]):  # fmt: skip
        res = subprocess.run(
            [PROMTOOL, *argv], cwd=mon.MONITORING, capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 0, res.stdout + res.stderr

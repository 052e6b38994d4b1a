"""What the shipped dashboard and alerting rules (``packaging/monitoring/``) ask of the daemon's
metrics, and what the daemon declares and serves, by the names a scrape shows."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "packaging" / "monitoring"
DASHBOARD = MONITORING / "elasticd-dashboard.json"
RULES = MONITORING / "elasticd-alerts.yml"
METRICS = ROOT / "elasticd" / "metrics"
NAME = re.compile(r"\belasticd_[a-z0-9_]+\b")
# The samples each kind of family shows in a scrape (prometheus_client's exposition).
SAMPLES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
KINDS = {
    "Counter": "counter", "CounterMetricFamily": "counter", "Histogram": "histogram",
    "Gauge": "gauge", "GaugeMetricFamily": "gauge", "_gauge": "gauge", "_by": "gauge",
}  # fmt: skip
# Per-GPU metrics exist only on a node with GPUs: served by a daemon on a fake NVML
# (tests/integration/test_gpu_health.py), left out of the scrape of a GPU-less one.
GPU_ONLY = frozenset(
    {
        "elasticd_gpu_healthy",
        "elasticd_gpu_memory_used_bytes",
        "elasticd_gpu_utilization_percent",
        "elasticd_gpu_job",
        "elasticd_gpu_unhealthy_total",
    }
)


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_exprs() -> list[str]:
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    return exprs


def rule_exprs() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def referenced(exprs: list[str]) -> set[str]:
    return {name for e in exprs for name in NAME.findall(e)}


def samples(family: str, kind: str) -> set[str]:
    return {family + suffix for suffix in SAMPLES[kind]}


def declared() -> set[str]:
    """Every sample name the sources of ``elasticd/metrics`` declare (a family's name is its first
    argument, a literal, in a call to one of ``KINDS``)."""
    found: set[str] = set()
    for path in METRICS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            name = node.args[0].value
            if func in KINDS and isinstance(name, str) and name.startswith("elasticd_"):
                found |= samples(name, KINDS[func])
    return found


def served(exposition: str) -> set[str]:
    """The sample names a scrape's text shows, by its ``# TYPE`` lines (a labelled family with no
    child yet, a counter by reason before any restart, shows its type alone)."""
    found: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            if kind == "counter":  # the text format names a counter's family with its _total
                family = family.removesuffix("_total")
            found |= samples(family, kind) if kind in SAMPLES else {family}
    return found

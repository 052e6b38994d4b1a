"""Metrics: the address setting, the counters fed by events, the gauges rendered from one look at
the daemon, and the endpoint itself (a real HTTP server on loopback, with a fake look)."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from typing import cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from elasticd.errors import ConfigError
from elasticd.etcd.space import Space, SpaceLevel, SpaceLimits
from elasticd.etcd.types import EtcdStatus
from elasticd.happenings.records import (
    JobFailed,
    JobLeft,
    JobOrphaned,
    RoundBumped,
    RoundComplete,
    WorkerFailed,
)
from elasticd.metrics.address import HostPort
from elasticd.metrics.counters import EventMetrics
from elasticd.metrics.server import MetricsServer
from elasticd.metrics.state import NodeState, StateCollector
from elasticd.netaddr import free_port
from elasticd.progress.slowness import Evidence
from elasticd.terms.state import EndReason, FailureKind, Fault, RoundReason


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [("9464", "127.0.0.1", 9464), (":9464", "127.0.0.1", 9464), ("0.0.0.0:1", "0.0.0.0", 1),
     ("[::1]:9464", "::1", 9464), ("metrics.example:80", "metrics.example", 80)],
)  # fmt: skip
def test_metrics_address(text: str, host: str, port: int) -> None:
    assert HostPort.parse(text) == HostPort(host, port)


@pytest.mark.parametrize("text", ["", "0", "65536", "host:", "a b:1", "::1:9464", "[x]:1", "h:9x", "1.2.3.4"])
def test_bad_metrics_address_is_a_clear_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"metrics_address .*HOST:PORT"):
        HostPort.parse(text)


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_counters_and_histograms_follow_the_events() -> None:
    registry = CollectorRegistry()
    m = EventMetrics(registry)
    m.observe(RoundBumped("j", 1, RoundReason.WORKER_FAILED, True, 1, ""))
    m.observe(RoundBumped("j", 2, RoundReason.WORKER_FAILED, False, 1, ""))
    m.observe(RoundBumped("j", 3, cast(RoundReason, "made_up"), False, 1, ""))  # a label stays bounded
    m.observe(JobOrphaned("j", 3))
    m.observe(RoundComplete("j", 0, 1, ("n1",), "", RoundReason.START, 0.4))
    m.observe(RoundComplete("j", 1, 1, ("n1",), "", RoundReason.WORKER_FAILED, 2.0))
    m.observe(RoundComplete("j", 2, 1, ("n1",), "", RoundReason.START, cast(float, "soon")))  # ignored
    m.observe(JobFailed("j", EndReason.WORKER_FAILED))
    m.observe(WorkerFailed("j", "n1", 1, FailureKind.OOM, "rank 0 was killed"))
    m.observe(JobLeft("j", "n1"))  # not counted
    assert _value(registry, "elasticd_restarts_total", reason="worker_failed") == 2
    assert _value(registry, "elasticd_restarts_total", reason="other") == 1
    assert _value(registry, "elasticd_restarts_total", reason="member_lost") == 1
    assert _value(registry, "elasticd_rendezvous_duration_seconds_count") == 2
    assert _value(registry, "elasticd_rendezvous_duration_seconds_sum") == pytest.approx(2.4)
    assert _value(registry, "elasticd_recovery_duration_seconds_count") == 1
    assert _value(registry, "elasticd_jobs_ended_total", state="FAILED") == 1
    assert _value(registry, "elasticd_worker_failures_total", cause="oom") == 1


def test_gauges_render_the_last_look() -> None:
    registry = CollectorRegistry()
    collector = StateCollector()
    registry.register(collector)
    assert generate_latest(registry) == b""  # no look yet
    collector.update(
        NodeState("n1", jobs={"RUNNING": 2, "FAILED": 1}, nodes=3, groups={"RUNNING": 2}, workers={"j": 4},
                  steps_per_s={"j": 12.5}, step_times={("j", 0): 0.08, ("j", 1): 0.3}, slots=8, free_slots=4,
                  lease_renewals=7, lease_held=True, evidence={("j", 1): Evidence(2.0, 1.0, 0.5)},
                  scores={("j", 1): 0.4})
    )  # fmt: skip
    assert _value(registry, "elasticd_rank_computing_seconds", job="j", rank="1") == 2.0
    assert _value(registry, "elasticd_rank_waiting_seconds", job="j", rank="1") == 1.0
    assert _value(registry, "elasticd_rank_cpu_queued_seconds", job="j", rank="1") == 0.5
    assert _value(registry, "elasticd_rank_slowness_score", job="j", rank="1") == 0.4
    assert _value(registry, "elasticd_jobs", state="RUNNING") == 2
    assert _value(registry, "elasticd_nodes") == 3
    assert _value(registry, "elasticd_worker_groups", state="RUNNING") == 2
    assert _value(registry, "elasticd_worker_processes", job="j") == 4
    assert _value(registry, "elasticd_steps_per_second", job="j") == 12.5
    assert _value(registry, "elasticd_rank_step_seconds", job="j", rank="1") == 0.3
    assert _value(registry, "elasticd_lease_renewals_total") == 7
    collector.update(NodeState("n1", etcd_up=False))
    assert _value(registry, "elasticd_etcd_up") == 0 and _value(registry, "elasticd_nodes") is None


def test_gauges_show_how_full_etcd_is() -> None:
    registry = CollectorRegistry()
    collector = StateCollector()
    registry.register(collector)
    limits = SpaceLimits(100 << 20, 0.8)
    status = EtcdStatus(101 << 20, 90 << 20, 7, ("NOSPACE",))
    collector.update(NodeState("n1", etcd_space=Space(SpaceLevel.FULL, status, limits, 1.0)))
    assert _value(registry, "elasticd_etcd_db_size_bytes") == 101 << 20
    assert _value(registry, "elasticd_etcd_db_size_in_use_bytes") == 90 << 20
    assert _value(registry, "elasticd_etcd_quota_bytes") == 100 << 20
    assert _value(registry, "elasticd_etcd_high_water_bytes") == 80 << 20
    assert _value(registry, "elasticd_etcd_space_level", level="full") == 1
    assert _value(registry, "elasticd_etcd_space_level", level="ok") == 0
    assert _value(registry, "elasticd_etcd_alarm", alarm="NOSPACE") == 1
    collector.update(NodeState("n1", etcd_space=Space(SpaceLevel.UNKNOWN, None, limits)))
    assert _value(registry, "elasticd_etcd_space_level", level="unknown") == 1
    assert _value(registry, "elasticd_etcd_db_size_bytes") is None  # etcd did not say


def test_the_endpoint_serves_metrics_after_a_fresh_look_and_nothing_else() -> None:
    registry = CollectorRegistry()
    collector = StateCollector()
    registry.register(collector)
    looks = []

    async def refresh() -> None:
        looks.append(1)
        collector.update(NodeState("n1", nodes=len(looks)))

    def get(url: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""

    async def run() -> list[tuple[int, str]]:
        server = MetricsServer(HostPort("127.0.0.1", free_port()), registry, refresh)
        await server.start()
        try:
            base = f"http://127.0.0.1:{server.port}"
            return [await asyncio.to_thread(get, base + path) for path in ("/metrics", "/metrics?x", "/")]
        finally:
            await server.close()

    (ok, body), (again, body2), (missing, _) = asyncio.run(run())
    assert (ok, again, missing) == (200, 200, 404)
    assert "elasticd_nodes 1.0" in body and "elasticd_nodes 2.0" in body2  # a look per scrape


def test_an_address_in_use_is_a_config_error() -> None:
    async def run() -> None:
        port = free_port()
        first = MetricsServer(HostPort("127.0.0.1", port), CollectorRegistry(), lambda: asyncio.sleep(0))
        await first.start()
        try:
            with pytest.raises(ConfigError, match="cannot listen"):
                await MetricsServer(
                    HostPort("127.0.0.1", port), CollectorRegistry(), lambda: asyncio.sleep(0)
                ).start()
        finally:
            await first.close()

    asyncio.run(run())


def test_gpu_unhealthy_is_counted_by_a_bounded_fault() -> None:
    from prometheus_client import CollectorRegistry

    from elasticd.happenings.records import GpuUnhealthy
    from elasticd.metrics.counters import EventMetrics

    reg = CollectorRegistry()
    m = EventMetrics(reg)
    m.observe(GpuUnhealthy("n1", "GPU-1", Fault.ECC, "x", None))
    m.observe(GpuUnhealthy("n1", "GPU-2", "made-up", "x", None))  # type: ignore[arg-type]
    assert reg.get_sample_value("elasticd_gpu_unhealthy_total", {"fault": "ecc"}) == 1
    assert reg.get_sample_value("elasticd_gpu_unhealthy_total", {"fault": "other"}) == 1


def test_per_gpu_gauges() -> None:
    registry = CollectorRegistry()
    collector = StateCollector()
    registry.register(collector)
    gpus = (
        {"uuid": "GPU-a", "state": "healthy", "reason": "", "memory_used_mib": 3, "utilization_pct": 40,
         "job": "j", "rank": 5},
        {"uuid": "GPU-b", "state": "unhealthy", "reason": "Xid 79", "memory_used_mib": None,
         "utilization_pct": None, "job": None, "rank": None},
    )  # fmt: skip
    collector.update(NodeState("n1", gpus=gpus))
    assert _value(registry, "elasticd_gpu_healthy", gpu="0", uuid="GPU-a") == 1
    assert _value(registry, "elasticd_gpu_healthy", gpu="1", uuid="GPU-b") == 0
    assert _value(registry, "elasticd_gpu_memory_used_bytes", gpu="0", uuid="GPU-a") == 3 * 1024 * 1024
    assert _value(registry, "elasticd_gpu_utilization_percent", gpu="0", uuid="GPU-a") == 40
    assert _value(registry, "elasticd_gpu_job", gpu="0", uuid="GPU-a", job="j", rank="5") == 1
    assert _value(registry, "elasticd_gpu_memory_used_bytes", gpu="1", uuid="GPU-b") is None

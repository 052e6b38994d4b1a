"""etcd's own view of the load: its /metrics counters, and a process's CPU time."""

from __future__ import annotations

import re
import urllib.request

import psutil


def scrape(metrics_url: str) -> dict[str, float]:
    """The etcd counters this bench reads, summed over their labels (per method for requests)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^(\w+)(\{[^}]*\})?\s+(\S+)$", line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "grpc_server_handled_total":
            method = re.search(r'grpc_method="(\w+)"', labels)
            key = f"req:{method.group(1) if method else '?'}"
            out[key] = out.get(key, 0.0) + value
        elif name in (
            "etcd_network_client_grpc_received_bytes_total",
            "etcd_network_client_grpc_sent_bytes_total",
            "process_cpu_seconds_total",
        ):
            out[name] = out.get(name, 0.0) + value
    return out


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)

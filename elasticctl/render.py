"""Human-readable output for status, nodes and failures."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from elasticd.jobs.state import exit_text
from elasticd.wire import FailureView, JobView, NodeView


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    secs = max(0, int(time.time() - ts))
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    return f"{secs // 3600}h"


def table(rows: list[list[str]]) -> str:
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def jobs_table(jobs: list[JobView]) -> str:
    rows = [["JOB", "STATE", "USER", "NODES", "WORLD", "RESTARTS", "AGE", "REASON"]]
    for j in jobs:
        rows.append(
            [
                j.get("id", "?"),
                j.get("state", "?"),
                j.get("user", "?"),
                ",".join(j.get("nodes") or []) or "-",
                str(j.get("world_size", 0)),
                f"{j.get('restarts', 0)}/{j.get('max_restarts', 0)}",
                _age(j.get("submitted_at")),
                (j.get("error") or j.get("reason") or "")[:60],
            ]
        )
    return table(rows)


def failure(job: JobView) -> str:
    """The root cause (the first worker to fail), the node's other failed ranks, and the root
    cause's last output. Each fact once: an exit is not repeated as its own message."""
    f: FailureView | None = job.get("failure")
    if not f:
        return ""
    what = exit_text(f.get("exit_code"), f.get("signal"), f.get("message", ""))
    lines = [
        f"first failure: rank {f['rank']} (local rank {f['local_rank']} on {f['node']}), "
        f"attempt {f['attempt']}, {what}"
    ]
    also = f.get("also_failed") or []
    for other in also:
        text = exit_text(other.get("exit_code"), other.get("signal"), other.get("message", ""))
        lines.append(f"  also failed: rank {other['rank']} (local rank {other['local_rank']}), {text}")
    if f.get("also_failed_more"):
        lines.append(f"  also failed: {f['also_failed_more']} more rank(s)")
    if f.get("output_tail"):
        lines.append(f"  last output of rank {f['rank']}:")
        lines.extend(f"    | {line}" for line in f["output_tail"].splitlines())
    return "\n".join(lines)


DETAIL_KEYS = [
    "id",
    "state",
    "reason",
    "waits_for",
    "user",
    "submitted_on",
    "nnodes",
    "nproc_per_node",
    "world_size",
    "round",
    "restarts",
    "max_restarts",
    "master",
    "devices",
    "pids",
    "waiting_nodes",
]


def job_detail(job: JobView) -> str:
    fields: Mapping[str, Any] = job
    lines = [f"{k + ':':16}{fields.get(k)}" for k in DETAIL_KEYS if fields.get(k) not in (None, "", [])]
    lines.append(f"{'command:':16}{' '.join(job.get('argv') or [])}")
    if job.get("error") and job["error"] != job.get("reason"):
        lines.append(f"{'error:':16}{job['error']}")
    if job.get("members"):
        rows = [["NODE", "GROUP_RANK", "RANKS", "STATE", "DEVICES"]]
        for m in job["members"]:
            lo, hi = m["ranks"]
            ranks = f"{lo}-{hi}" if hi > lo else str(lo)
            rows.append([m["node"], str(m["group_rank"]), ranks, m["state"], m.get("devices") or "-"])
        lines.append("members:")
        lines.extend("  " + line for line in table(rows).splitlines())
    detail = failure(job)
    if detail:
        lines.append(detail)
    return "\n".join(lines)


def nodes_table(nodes: list[NodeView]) -> str:
    rows = [["NODE", "HOST", "ADDRESS", "DEVICES", "SLOTS", "FREE", "STATE", "VERSION"]]
    for n in nodes:
        inv = n.get("inventory", {})
        rows.append(
            [
                n.get("node", "?"),
                n.get("host", "?"),
                n.get("address", "?"),
                inv.get("kind", "?"),
                str(n.get("slots", inv.get("slots", "?"))),
                str(n.get("free_slots", "?")),
                "draining" if n.get("draining") else "ready",
                n.get("version", "?"),
            ]
        )
    return table(rows)

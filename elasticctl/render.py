"""Human-readable output for status, nodes and failures; times for people (local) and programs (ISO)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from elasticd.terms.state import exit_text
from elasticd.wire import (
    ROW_REASON_CHARS,
    TIME_FIELDS,
    CheckReply,
    EtcdSpaceView,
    FailureView,
    JobRow,
    JobView,
    NodeView,
)


def iso_times(value: Any) -> Any:
    """``value`` (a reply, as JSON) with every time (a number in one of the wire's ``TIME_FIELDS``)
    in ISO 8601, UTC with its offset and milliseconds: ``2026-11-23T16:40:00.123+00:00``. The wire
    keeps epoch seconds: programs talking to the socket compute with them."""
    if isinstance(value, list):
        return [iso_times(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        is_time = key in TIME_FIELDS and isinstance(item, int | float) and not isinstance(item, bool)
        out[key] = iso(item) if is_time else iso_times(item)
    return out


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def short_time(ts: float | None, now: float) -> str:
    """A local time for a table: the time of day today, the day and minute this year, else the date."""
    if not ts:
        return "-"
    at, today = datetime.fromtimestamp(ts), datetime.fromtimestamp(now)
    if at.date() == today.date():
        return at.strftime("%H:%M:%S")
    return at.strftime("%b %d %H:%M" if at.year == today.year else "%Y-%m-%d")


def long_time(ts: float | None) -> str:
    """A local time in full, with its zone: ``2026-11-23 17:40:00 CET``."""
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z") if ts else "-"


def duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``1h02m``, ``2d03h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def run_time(job: JobRow | JobView, now: float) -> float | None:
    """How long the job ran: until it ended, or until ``now`` while it runs; None if it never ran."""
    started = job.get("started_at")
    if not started:
        return None
    return (job.get("ended_at") or now) - started


def table(rows: list[list[str]]) -> str:
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def jobs_table(jobs: Sequence[JobRow] | Sequence[JobView], now: float | None = None) -> str:
    now = time.time() if now is None else now
    rows = [["JOB", "STATE", "USER", "NODES", "WORLD", "RESTARTS", "STARTED", "ENDED", "DURATION", "QUEUE",
             "REASON"]]  # fmt: skip
    for j in jobs:
        rows.append(
            [
                j.get("id", "?"),
                j.get("state", "?"),
                j.get("user", "?"),
                ",".join(j.get("nodes") or []) or str(j.get("size") or "-"),
                str(j.get("world_size", 0)),
                f"{j.get('restarts', 0)}/{j.get('max_restarts', 0)}",
                short_time(j.get("started_at"), now),
                short_time(j.get("ended_at"), now),
                duration(run_time(j, now)),
                queue_place(j),
                _reason(j),
            ]
        )
    return table(rows)


def _reason(job: Mapping[str, object]) -> str:
    """What the table shows of the job's error, else its reason (a ``JobRow``'s ``reason``)."""
    return str(job.get("error") or job.get("reason") or "")[:ROW_REASON_CHARS]


def queue_place(job: JobRow | JobView) -> str:
    """A waiting job's place in the fair queue, ``3/12``; ``-`` for others."""
    q = job.get("queue")
    return f"{q['place']}/{q['of']}" if q else "-"


def failure(job: JobView) -> str:
    """The root cause (the first worker to fail), the node's other failed ranks, and the root
    cause's last output. Each fact once: an exit is not repeated as its own message."""
    f: FailureView | None = job.get("failure")
    if not f:
        return ""
    what = exit_text(f.get("exit_code"), f.get("signal"), f.get("message", ""))
    exception = f.get("exception")
    if exception and exception not in what:
        what = f"{what} ({exception})"
    lines = [
        f"first failure: rank {f['rank']} (local rank {f['local_rank']} on {f['node']}), "
        f"attempt {f['attempt']}, {what}"
    ]
    if f.get("frame"):
        lines.append(
            f"  hung in: {f['frame']} (every local rank's stacks: rank_<k>.stacks.txt in its log dir)"
        )
    also = f.get("also_failed") or []
    for other in also:
        text = exit_text(other.get("exit_code"), other.get("signal"), other.get("message", ""))
        where = f"on {other['node']}" if other.get("node") else f"local rank {other['local_rank']}"
        lines.append(f"  also failed: rank {other['rank']} ({where}), {text}")
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
    "cause",
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
TIME_KEYS = ["submitted_at", "started_at", "ended_at", "updated_at"]


def job_detail(job: JobView, now: float | None = None) -> str:
    now = time.time() if now is None else now
    fields: Mapping[str, Any] = job
    lines = [f"{k + ':':16}{fields.get(k)}" for k in DETAIL_KEYS if fields.get(k) not in (None, "", [])]
    if q := job.get("queue"):
        lines.append(f"{'queue:':16}{q['place']} of {q['of']} waiting ({q['why']})")
    for key in TIME_KEYS:
        if fields.get(key):
            lines.append(f"{key.removesuffix('_at') + ':':16}{long_time(fields[key])}")
    if job.get("started_at"):
        lines.append(f"{'duration:':16}{duration(run_time(job, now))}")
    lines.append(f"{'command:':16}{' '.join(job.get('argv') or [])}")
    if goodput := goodput_line(job):
        lines.append(f"{'goodput:':16}{goodput}")
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
    steps = progress_table(job, now)
    if steps:
        lines.append("progress:")
        lines.extend("  " + line for line in steps.splitlines())
    detail = failure(job)
    if detail:
        lines.append(detail)
    return "\n".join(lines)


def goodput_line(job: JobView) -> str:
    """``0.82 of 1h02m; lost: restart 5m01s, hung 3m00s, checkpoint 40s``: the three largest losses."""
    g = job.get("goodput")
    if not g or g["ratio"] is None:
        return ""
    losses = sorted((s, c) for c, s in g["by_cause_s"].items() if c != "productive" and s >= 0.5)
    lost = ", ".join(f"{c} {duration(s)}" for s, c in losses[::-1][:3])
    return f"{g['ratio']:.2f} of {duration(g['wall_s'])}" + (f"; lost: {lost}" if lost else "")


def progress_table(job: JobView, now: float) -> str:
    """Each rank's last step, steps/s, time since its last step, and its slowness (score, seconds
    computing and waiting over the last 20 s), stragglers flagged; empty when no rank has reported a
    step and none has been scored yet."""
    rows = [["RANK", "NODE", "STEP", "STEPS/S", "LAST STEP", "PHASE", "SCORE", "COMPUTE/WAIT", ""]]
    for m in job.get("members") or []:
        for p in m.get("progress") or []:
            rate, at, score = p.get("steps_per_s"), p.get("last_step_at"), p.get("score")
            busy, idle = p.get("computing_s"), p.get("waiting_s")
            rows.append(
                [
                    str(p["rank"]),
                    m["node"],
                    "-" if p.get("step") is None else str(p["step"]),
                    "-" if rate is None else f"{rate:.3g}",
                    "-" if at is None else f"{duration(now - at)} ago",
                    p.get("phase", ""),
                    "-" if score is None else f"{score:.2f}",
                    "-" if busy is None or idle is None else f"{busy:.1f}s/{idle:.1f}s",
                    "straggler" if p.get("straggler") else "",
                ]
            )
    if all(r[2] == "-" and r[7] == "-" for r in rows[1:]):
        return ""
    return table([rows[0], *sorted(rows[1:], key=lambda r: int(r[0]))])


def etcd_line(view: EtcdSpaceView) -> str:
    """How full etcd is, on one line: ``etcd: 1.2 GiB of 2.0 GiB (60%, 0.9 GiB in use), level ok``."""
    quota = view["quota_bytes"]
    size, in_use = view.get("db_size"), view.get("db_size_in_use")
    if size is None:
        text = f"etcd: size unknown, quota {_bytes(quota)}"
    else:
        text = f"etcd: {_bytes(size)} of {_bytes(quota)} ({100 * size / quota:.0f}%"
        text += f", {_bytes(in_use)} in use)" if in_use else ")"
    text += f", level {view['level']} (new jobs refused above {_bytes(view['high_water_bytes'])})"
    alarms = view.get("alarms") or []
    return text + (f", ALARM {','.join(alarms)}" if alarms else "")


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def gpus_table(nodes: list[NodeView]) -> str | None:
    """Each GPU of each node: its state and why, its use, and the job and rank on it (None: no
    node has GPUs)."""
    rows = [["NODE", "GPU", "UUID", "STATE", "MEMORY", "UTIL", "JOB", "RANK", "REASON"]]
    for n in nodes:
        gpus = {g.get("uuid"): g for g in n.get("inventory", {}).get("gpus", [])}
        for st in n.get("gpu_states", []):
            gpu: dict[str, Any] = dict(gpus.get(st.get("uuid"), {}))
            used, total = st.get("memory_used_mib"), gpu.get("memory_mib")
            util, rank = st.get("utilization_pct"), st.get("rank")
            rows.append(
                [
                    n.get("node", "?"),
                    str(gpu.get("index", "?")) + (f" (MIG x{len(gpu['mig'])})" if gpu.get("mig") else ""),
                    str(st.get("uuid", "?")),
                    str(st.get("state", "?")),
                    f"{used}/{total} MiB" if used is not None else "-",
                    f"{util}%" if util is not None else "-",
                    st.get("job") or "-",
                    str(rank) if rank is not None else "-",
                    st.get("reason") or "",
                ]
            )
    return table(rows) if len(rows) > 1 else None


def snapshots_cell(n: NodeView) -> str:
    """A node's bound on each job's memory snapshots and where it came from: ``12.0 GiB (derived)``,
    ``off (set)``; ``-`` from a daemon that does not say."""
    source = n.get("snapshot_source") or ""
    if not source:
        return "-"
    bound = n.get("snapshot_bytes", 0)
    return f"{_bytes(bound) if bound > 0 else 'off'} ({source})"


def check_table(reply: CheckReply) -> str:
    """Each checked node's figures against the cluster's medians, and its verdict."""
    rows = [["NODE", "COMPUTE", "RTT", "BANDWIDTH", "VERDICT"]]
    med = reply["cluster"]
    for r in reply["nodes"]:
        rows.append([r["node"], *_check_cells(r["compute"], r["rtt_s"], r["bytes_per_s"]), r["verdict"]])
    rows.append(["(median)", *_check_cells(med["compute"], med["rtt_s"], med["bytes_per_s"]), ""])
    back = "".join(f"\n{r['node']} passed: it takes part in job {r['job']} again" for r in reply["returned"])
    return table(rows) + f"\nlinks measured from {reply['measured_from']}" + back


def _check_cells(compute: float | None, rtt: float | None, rate: float | None) -> list[str]:
    return [
        "-" if compute is None else f"{compute / 1e6:.2f}M/s",
        "-" if rtt is None else f"{rtt * 1e3:.2f}ms",
        "-" if rate is None else f"{rate / 1e6:.0f}MB/s",
    ]


def nodes_table(nodes: list[NodeView]) -> str:
    rows = [["NODE", "HOST", "ADDRESS", "DEVICES", "SLOTS", "FREE", "STATE", "SNAPSHOTS", "PORTS", "VERSION"]]
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
                snapshots_cell(n),
                ports_cell(n),
                n.get("version", "?"),
            ]
        )
    offs = "".join(
        f"\n{n.get('node', '?')}: port filter off: {n.get('port_filter_detail', '')}"
        for n in nodes
        if n.get("port_filter") == "off"
    )
    return table(rows) + offs


def ports_cell(n: NodeView) -> str:
    """Whether a node keeps its jobs' ports to the jobs: ``on (uid)``, ``off`` (why, under the
    table), ``-`` from a daemon that does not say."""
    mode = n.get("port_filter") or ""
    return "-" if not mode else f"on ({n.get('port_filter_detail', '')})" if mode == "on" else "off"

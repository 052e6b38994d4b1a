"""bench_node_churn's records (a phase, the cluster at rest, one size's outcome) and its tables."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Phase:
    name: str
    changes: int
    seconds: float
    member_events: tuple[float, float]  # per observer per node change: median, max
    other_events: tuple[float, float]
    # go: from the revoke's request to a member observer's event (median, max)
    heard_s: tuple[float, float] | None = None


@dataclass
class Rest:
    seconds: float
    requests_s: float
    by_method: dict[str, float]
    received_bytes_s: float
    sent_bytes_s: float
    etcd_cpu_pct: float
    expected_keepalives_s: float
    harness_cpu_pct: float
    parts: str


@dataclass
class Outcome:
    n: int
    layout: str
    load: str
    phases: list[Phase] = field(default_factory=list)
    rest: Rest | None = None
    # An agent's read of its live nodes (``JobLease.alive``: the job's presences; before, every
    # node's record): seconds and bytes etcd sent, median of 5
    alive_read_s: float = 0.0
    alive_read_bytes: float = 0.0


def report(outcomes: list[Outcome]) -> None:
    print()
    print(
        f"{'N':>6} {'layout':<6} {'phase':<6} {'changes':>7} {'s':>6}  events/daemon/change:"
        " member med/max   other med/max   loss heard (s) med/max"
    )
    for o in outcomes:
        for p in o.phases:
            heard = f"{p.heard_s[0]:.3f}/{p.heard_s[1]:.3f}" if p.heard_s else "-"
            print(
                f"{o.n:>6} {o.layout:<6} {p.name:<6} {p.changes:>7} {p.seconds:>6.2f}"
                f"  {p.member_events[0]:>22.2f}/{p.member_events[1]:<6.2f}"
                f" {p.other_events[0]:>8.2f}/{p.other_events[1]:<6.2f} {heard:>16}"
            )
    print()
    for o in outcomes:
        print(
            f"{o.n:>6} {o.layout:<6} an agent's read of its live nodes: {o.alive_read_s * 1000:.1f} ms,"
            f" {o.alive_read_bytes / 1024:.1f} KiB sent by etcd"
        )
    print()
    print(
        f"{'N':>6} {'layout':<6} {'rest parts':<20} {'req/s':>8} {'keepalive exp.':>14} {'recv B/s':>10}"
        f" {'sent B/s':>10} {'etcd CPU %':>10} {'harness %':>9}  by method"
    )
    for o in outcomes:
        r = o.rest
        if r is None:
            continue
        methods = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.by_method.items(), key=lambda kv: -kv[1]))
        print(
            f"{o.n:>6} {o.layout:<6} {r.parts:<20} {r.requests_s:>8.1f} {r.expected_keepalives_s:>14.1f}"
            f" {r.received_bytes_s:>10.0f} {r.sent_bytes_s:>10.0f} {r.etcd_cpu_pct:>10.1f}"
            f" {r.harness_cpu_pct:>9.1f}  {methods}"
        )

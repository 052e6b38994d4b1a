"""bench_footprint's table: each figure beside its target."""

from __future__ import annotations

from footprint.measure import CpuSample, MemSample
from footprint.rpc import RpcResult

CPU_TARGET_PCT = 0.2
RSS_TARGET_MB = 60.0
P99_TARGET_MS = 5.0


def _mark(ok: bool) -> str:
    return "ok" if ok else "OVER"


def report(cpu: list[CpuSample], mem: list[MemSample], rpc: RpcResult | None) -> None:
    print()
    print(
        f"{'idle CPU (% of one core)':<26} {'window':>7} {'daemon':>8} {'reaper':>8} {'threads':>8}  target"
    )
    for c in cpu:
        ok = c.daemon_pct <= CPU_TARGET_PCT
        print(
            f"{c.phase:<26} {c.seconds:>6.0f}s {c.daemon_pct:>7.3f}% {c.reaper_pct:>7.3f}%"
            f" {c.daemon_threads:>8}"
            f"  <= {CPU_TARGET_PCT}% {_mark(ok)}"
        )
    for c in cpu:
        busiest = sorted(c.wakeups.items(), key=lambda kv: -kv[1])
        print(f"  wake-ups/s, {c.phase}: {sum(c.wakeups.values()):.1f} in all; "
              + ", ".join(f"{name} {rate:.2f}" for name, rate in busiest))  # fmt: skip
    print()
    print(f"{'memory (MB)':<26} {'RSS d+r':>8} {'d RSS':>7} {'d USS':>7} {'d PSS':>7}"
          f" {'r RSS':>7} {'r USS':>7} {'r PSS':>7}  target")  # fmt: skip
    for m in mem:
        d, r = m.daemon, m.reaper
        print(
            f"{m.phase:<26} {m.total_rss_mb:>8.1f} {d['rss_mb']:>7.1f} {d['uss_mb']:>7.1f}"
            f" {d['pss_mb']:>7.1f}"
            f" {r['rss_mb']:>7.1f} {r['uss_mb']:>7.1f} {r['pss_mb']:>7.1f}"
            f"  <= {RSS_TARGET_MB:.0f} {_mark(m.total_rss_mb <= RSS_TARGET_MB)}"
        )
    if rpc is not None:
        print()
        n = rpc.clients * rpc.requests
        print(
            f"control RPC: {rpc.clients} clients x {rpc.requests} requests ({rpc.commands},"
            f" think {rpc.think_ms:g} ms):"
            f" p50 {rpc.p50_ms:.2f} ms, p99 {rpc.p99_ms:.2f} ms, max {rpc.max_ms:.2f} ms,"
            f" {n / rpc.wall_s:.0f} req/s  p99 < {P99_TARGET_MS:g} ms {_mark(rpc.p99_ms < P99_TARGET_MS)}"
        )
        for e in rpc.errors[:5]:
            print(f"  client error: {e}")

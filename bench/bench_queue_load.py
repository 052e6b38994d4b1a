"""The daemon's cost with a full queue: 1,000 pending jobs of the largest allowed spec in etcd.

It starts a real etcd and one daemon (``footprint.setup.Setup``), measures the daemon on the
empty cluster, then writes ``--jobs`` pending jobs from ``--users`` users straight into etcd
(through ``JobStore.create``, as a daemon's submit does), each with an environment that brings
its stored spec up to ``--spec-bytes`` (the default ``max_spec_bytes``, 64 KiB) and ``nodes``
naming a node that does not exist (so they stay pending), and measures again:

- **RSS** of the daemon (and of its reaper), after the load settled;
- **idle CPU** of the daemon over ``--idle-seconds`` (CPU time / wall time, every thread);
- **status** latency: ``status`` of every job as ``elasticctl status`` asks for its table (rows),
  right after a submit, then as ``status --json`` asks (every job's whole view), and
  ``status <job>`` of one job, sequential requests from one client (``elasticctl``'s
  ``Client``), ``--think-ms`` apart; the first status of each kind after the fill apart (it
  encodes every job's view once);
- **submit** latency: sequential submits (as root, which the bench's daemon allows: the
  ``--allow-root-jobs`` of ``Setup``) of a small job that names the absent node too.

    .venv/bin/python bench/bench_queue_load.py [--jobs 1000] [--users 20] [--idle-seconds 30]

Targets (with the load): daemon RSS <= 150 MB, idle CPU <= 0.5 % of a core, status and submit
p99 <= 50 ms. Printed beside the figures; the exit code says only whether the measurement worked.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from footprint.measure import measure_cpu, measure_mem
from footprint.setup import Setup
from harness.paths import REPO

RSS_TARGET_MB = 150.0
CPU_TARGET_PCT = 0.5
P99_TARGET_MS = 50.0
ABSENT_NODE = "no-such-node"


@dataclass
class Latency:
    what: str
    n: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass
class Phase:
    name: str
    rss_mb: float
    reaper_rss_mb: float
    cpu_pct: float
    window_s: float
    latencies: list[Latency]


def _latency(what: str, samples: list[float]) -> Latency:
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
    return Latency(what, len(samples), statistics.median(samples), p99, samples[-1])


def _submit_args(i: int) -> dict[str, Any]:
    return {
        "entry_kind": "script",
        "entry": str(REPO / "tests" / "scripts" / "sleeper.py"),
        "cwd": "/tmp",
        "python": sys.executable,
        "nodes": [ABSENT_NODE],
        "name": f"probe{i}",
        "join_timeout_s": 86400.0,
    }


def measure_rpc(socket: Path, n: int, think_ms: float, tag: str) -> list[Latency]:
    from elasticctl.client import Client

    client = Client(socket, timeout_s=60.0)
    # The first status after the fill encodes every job's view and row (kept per job revision
    # after that): a cost paid once when a thousand jobs appear at once, not by each request, so
    # it is reported on its own line ("first"), out of the percentiles.
    first: dict[str, float] = {}
    for what, args in (("status (table)", {"rows": True}), ("status --json", {})):
        t0 = time.perf_counter()
        client.call("status", **args)
        first[f"{what} first"] = (time.perf_counter() - t0) * 1000
    one = client.call("submit", **_submit_args(0) | {"name": f"{tag}-first"})["id"]
    out: dict[str, list[float]] = {
        "status (table)": [],
        "status --json": [],
        "status <job>": [],
        "submit": [],
    }
    for i in range(n):
        for what, cmd, args in (
            ("status (table)", "status", {"rows": True}),
            ("status --json", "status", {}),
            ("status <job>", "status", {"job": one}),
            ("submit", "submit", _submit_args(i) | {"name": f"{tag}-{i}"}),
        ):
            t0 = time.perf_counter()
            client.call(cmd, **args)
            out[what].append((time.perf_counter() - t0) * 1000)
            time.sleep(think_ms / 1000)
    client.close()
    return [_latency(what, samples) for what, samples in out.items()] + [
        _latency(what, [ms]) for what, ms in first.items()
    ]


def fill(endpoint: str, jobs: int, users: int, spec_bytes: int) -> float:
    """Write ``jobs`` pending jobs of ``spec_bytes`` each (as stored), ``users`` distinct uids."""
    from elasticd.etcd.client import EtcdClient
    from elasticd.etcd.keys import Keys
    from elasticd.rendezvous.store import InlineJobStore, run_inline
    from elasticd.terms.options import EntryKind
    from elasticd.terms.spec import JobSpec, NodeRange

    client = EtcdClient([endpoint], timeout_s=10.0)
    keys = Keys()
    t0 = time.monotonic()
    for i in range(jobs):
        user = i % users
        base = JobSpec(
            id=f"load-{i:05d}",
            name=f"load{i}",
            entry_kind=EntryKind.SCRIPT,
            entry="/opt/train/train.py",
            args=("--epochs", "10", "--data", f"/data/shard{i}"),
            python="/usr/bin/python3",
            cwd="/tmp",
            env={},
            uid=20000 + user,
            gid=20000 + user,
            user=f"user{user:02d}",
            nnodes=NodeRange(1, 1),
            submitted_at=time.time(),
            nodes=(ABSENT_NODE,),
            join_timeout_s=86400.0,
            submitted_on="bench",
        )
        room = spec_bytes - len(json.dumps(base.to_json()).encode())
        env = {f"VAR_{n:04d}": "x" * 200 for n in range(max(0, room) // 216)}
        spec = JobSpec(**{**base.__dict__, "env": env})
        if not run_inline(InlineJobStore(client, keys, spec.id).create(spec)):
            raise RuntimeError(f"job {spec.id} exists already")
    client.close()
    return time.monotonic() - t0


def phase(name: str, setup: Setup, args: argparse.Namespace) -> Phase:
    import psutil

    daemon, reaper = psutil.Process(setup.proc.pid), setup.reaper()
    time.sleep(args.settle)
    cpu = measure_cpu(name, daemon, reaper, args.idle_seconds)
    latencies = measure_rpc(setup.socket, args.requests, args.think_ms, name.split()[0])
    mem = measure_mem(name, daemon, reaper)
    return Phase(name, mem.daemon["rss_mb"], mem.reaper["rss_mb"], cpu.daemon_pct, cpu.seconds, latencies)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--users", type=int, default=20)
    p.add_argument("--spec-bytes", type=int, default=64 * 1024 - 256, help="each stored spec's size")
    p.add_argument("--idle-seconds", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--requests", type=int, default=100, help="of each kind, per phase (default 100)")
    p.add_argument("--think-ms", type=float, default=20.0)
    p.add_argument("--json", type=Path)
    p.add_argument("--daemon-arg", action="append", default=[])
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="elasticd-bench-queue-"))
    setup = Setup(tmp, args.daemon_arg)
    phases: list[Phase] = []
    try:
        setup.wait_ready()
        phases.append(phase("empty cluster", setup, args))
        print(phases[-1], flush=True)
        took = fill(setup.etcd.endpoint, args.jobs, args.users, args.spec_bytes)
        print(f"wrote {args.jobs} jobs of {args.spec_bytes} bytes in {took:.1f} s", flush=True)
        setup.job_state("load-00000")  # the daemon answers
        phases.append(phase(f"{args.jobs} pending jobs", setup, args))
        print(phases[-1], flush=True)
    finally:
        setup.close()
    report(phases)
    if args.json:
        args.json.write_text(json.dumps([asdict(ph) for ph in phases], indent=2))
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(phases: list[Phase]) -> None:
    print()
    print(f"{'phase':<20} {'RSS MB':>7} {'reaper':>7} {'idle CPU':>9}  targets <= {RSS_TARGET_MB:.0f} MB, "
          f"<= {CPU_TARGET_PCT}%")  # fmt: skip
    for ph in phases:
        print(f"{ph.name:<20} {ph.rss_mb:>7.1f} {ph.reaper_rss_mb:>7.1f} {ph.cpu_pct:>8.3f}%")
    print()
    print(f"{'phase':<20} {'request':<22} {'n':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  "
          f"target p99 <= {P99_TARGET_MS:g} ms")  # fmt: skip
    for ph in phases:
        for lat in ph.latencies:
            ok = "(once)" if lat.n == 1 else "ok" if lat.p99_ms <= P99_TARGET_MS else "OVER"
            print(f"{ph.name:<20} {lat.what:<22} {lat.n:>4} {lat.p50_ms:>8.2f} {lat.p99_ms:>8.2f}"
                  f" {lat.max_ms:>8.2f}  {ok}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

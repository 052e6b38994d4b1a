"""The daemon's idle footprint: CPU time, memory, and control RPC latency under many clients.

It starts a real etcd (``EmbeddedEtcd``, UNIX sockets in a private temp dir) and a real daemon
(``python -m elasticd`` against that etcd, as in ``tests/support.py``), waits ``--settle``
seconds after the daemon answers, and measures:

- **idle CPU** of the daemon process and of its reaper sidecar, with no jobs and then with one
  running job (one rank of ``tests/scripts/sleeper.py``): the delta of ``psutil`` ``cpu_times``
  (user + system, every thread) over ``--idle-seconds``, divided by the wall time. CPU *time*
  is what the process itself consumed, so it does not depend on what else runs on the machine
  (load only stretches it a little through cache and scheduler effects);
- **wake-ups** of each daemon thread over the same windows: voluntary context switches per
  second from ``/proc/<pid>/task/*/status``, named by ``py-spy dump`` (Python thread names; the
  etcd watch thread is ``etcd-watch`` and should stay at 0 when nothing changes);
- **memory** of daemon + reaper: RSS, USS (pages only this process holds) and PSS (shared pages
  split among their users), from ``memory_full_info``;
- **control RPC latency**: ``--clients`` separate client processes (each one ZeroMQ DEALER on the
  real socket, like ``elasticctl``), started together, each sending ``--requests`` requests
  (``--commands``, round-robin), waiting ``--think-ms`` (default 200) between a reply and its
  next request, the first one at a random point of its first think time (independent users, not
  one synchronised burst); latency is per request, send to reply, in the client. p50 / p99 / max
  over all of them.

    .venv/bin/python bench/bench_footprint.py [--idle-seconds 60] [--clients 50] [--json PATH]
    .venv/bin/python bench/bench_footprint.py --etcd-client gateway,grpc   # both clients, one run

Targets: idle CPU <= 0.2 % of a core in both phases; daemon + reaper <= 60 MB RSS;
RPC p99 < 5 ms with 50 concurrent clients. The bench prints them next to the figures; it does
not fail on them (the exit code says only whether the measurement itself worked).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from footprint.measure import CpuSample, MemSample, measure_cpu, measure_mem
from footprint.report import CPU_TARGET_PCT, P99_TARGET_MS, RSS_TARGET_MB, report
from footprint.rpc import RpcResult, measure_rpc
from footprint.setup import Setup, start_job


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--idle-seconds", type=float, default=60.0, help="each idle CPU window (default 60)")
    p.add_argument(
        "--settle", type=float, default=5.0, help="seconds after start / job start before measuring"
    )
    p.add_argument("--clients", type=int, default=50, help="concurrent RPC client processes (default 50)")
    p.add_argument("--requests", type=int, default=100, help="requests per client (default 100)")
    p.add_argument(
        "--think-ms",
        type=float,
        default=200.0,
        help="pause after a reply (default 200)",
    )
    p.add_argument(
        "--commands", default="ping,status", help="round-robin, comma-separated (default ping,status)"
    )
    p.add_argument("--no-job", action="store_true", help="skip the phase with one running job")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (daemon log, job logs)")
    p.add_argument("--daemon-arg", action="append", default=[], help="extra elasticd flag (repeatable)")
    p.add_argument(
        "--etcd-client",
        default="gateway",
        help="etcd_client of the daemon; several, comma-separated, are measured one after the other "
        "(gateway,grpc: both footprints in one run; grpc needs the grpc extra)",
    )
    return p.parse_args(argv)


@dataclass
class Figures:
    """One run's figures: one daemon, talking to etcd through one client (``etcd_client``)."""

    client: str
    cpu: list[CpuSample]
    mem: list[MemSample]
    rpc: RpcResult | None


def measure(args: argparse.Namespace, client: str) -> Figures:
    """Start etcd and a daemon with ``--etcd-client client``, measure, stop them."""
    import psutil

    tmp = Path(tempfile.mkdtemp(prefix="elasticd-bench-fp-"))
    setup = Setup(tmp, [*args.daemon_arg, "--etcd-client", client])
    got = Figures(client, [], [], None)
    job = ""
    try:
        setup.wait_ready()
        daemon, reaper = psutil.Process(setup.proc.pid), setup.reaper()
        print(f"[{client}] elasticd pid {daemon.pid}, reaper pid {reaper.pid}, etcd {setup.etcd.endpoint}",
              flush=True)  # fmt: skip
        time.sleep(args.settle)
        got.mem.append(measure_mem("idle, no job", daemon, reaper))
        got.cpu.append(measure_cpu("idle, no job", daemon, reaper, args.idle_seconds))
        print(got.cpu[-1], flush=True)
        if not args.no_job:
            job = start_job(setup)
            time.sleep(args.settle)
            got.mem.append(measure_mem("one running job", daemon, reaper))
            got.cpu.append(measure_cpu("one running job", daemon, reaper, args.idle_seconds))
            print(got.cpu[-1], flush=True)
        if args.clients > 0:
            got.rpc = measure_rpc(setup.socket, args.clients, args.requests, args.think_ms, args.commands)
            print(got.rpc, flush=True)
            got.mem.append(measure_mem("after the RPC load", daemon, reaper))
        if job:
            setup.ctl("kill", job)
    finally:
        setup.close()
    if args.keep:
        print(f"kept {tmp} (daemon log: {setup.log})")
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return got


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = [measure(args, client) for client in args.etcd_client.split(",")]
    for run in runs:
        print(f"\n== etcd_client = {run.client}")
        report(run.cpu, run.mem, run.rpc)
    if args.json:
        out = {
            run.client: {
                "cpu": [asdict(c) for c in run.cpu],
                "mem": [asdict(m) | {"total_rss_mb": m.total_rss_mb} for m in run.mem],
                "rpc": asdict(run.rpc) if run.rpc else None,
            }
            for run in runs
        } | {"targets": {"cpu_pct": CPU_TARGET_PCT, "rss_mb": RSS_TARGET_MB, "p99_ms": P99_TARGET_MS}}
        args.json.write_text(json.dumps(out, indent=2))
    return 0 if all(run.rpc is None or not run.rpc.errors for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

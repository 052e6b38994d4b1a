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
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SLEEPER = REPO / "tests" / "scripts" / "sleeper.py"
CPU_TARGET_PCT = 0.2
RSS_TARGET_MB = 60.0
P99_TARGET_MS = 5.0
MB = 1024 * 1024


def _client_main(argv: list[str]) -> int:
    """One RPC client process: ``_client SOCKET REQUESTS THINK_MS CMD[,CMD...]``.

    Imports only what ``elasticctl`` imports to talk to the daemon, connects, says ``ready`` on
    stdout and starts when a line arrives on stdin (after all of them have started up), at a
    random point within its first think time (so that the clients' requests interleave as
    independent users' would, instead of arriving as one burst of ``--clients`` requests at each
    step); prints its latencies (ms) as one JSON line.
    """
    from elasticctl.client import Client

    socket, requests, think_ms, commands = argv
    client = Client(Path(socket), timeout_s=30.0)
    cmds = commands.split(",")
    client.call("ping")  # connected before the clock starts
    print("ready", flush=True)
    sys.stdin.readline()
    time.sleep(random.uniform(0.0, float(think_ms) / 1000))
    latencies = []
    for i in range(int(requests)):
        cmd = cmds[i % len(cmds)]
        t0 = time.perf_counter()
        client.call(cmd)
        latencies.append((time.perf_counter() - t0) * 1000)
        if float(think_ms):
            time.sleep(float(think_ms) / 1000)
    client.close()
    print(json.dumps(latencies))
    return 0


@dataclass
class CpuSample:
    phase: str
    seconds: float
    daemon_pct: float
    reaper_pct: float
    daemon_threads: int
    wakeups: dict[str, float] = field(default_factory=dict)  # thread name -> voluntary switches/s


@dataclass
class MemSample:
    phase: str
    daemon: dict[str, float]
    reaper: dict[str, float]

    @property
    def total_rss_mb(self) -> float:
        return self.daemon["rss_mb"] + self.reaper["rss_mb"]


@dataclass
class RpcResult:
    clients: int
    requests: int
    think_ms: float
    commands: str
    p50_ms: float
    p99_ms: float
    max_ms: float
    wall_s: float
    errors: list[str] = field(default_factory=list)


def _cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _switches(pid: int) -> dict[str, tuple[str, int]]:
    """tid -> (kernel thread name, voluntary context switches so far)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # the thread ended
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        out[task.name] = (fields["Name"].strip(), int(fields["voluntary_ctxt_switches"]))
    return out


def _python_thread_names(pid: int) -> dict[str, str]:
    """tid -> Python thread name, from ``py-spy dump`` (empty if py-spy cannot attach)."""
    py_spy = Path(sys.executable).parent / "py-spy"
    try:
        out = subprocess.run([str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {}
    for line in out.splitlines():
        words = line.split('"')
        if line.startswith("Thread ") and len(words) >= 2:
            names[line.split()[1]] = words[1]
    return names


def measure_cpu(phase: str, daemon: Any, reaper: Any, seconds: float) -> CpuSample:
    d0, r0, t0, s0 = _cpu_s(daemon), _cpu_s(reaper), time.monotonic(), _switches(daemon.pid)
    time.sleep(seconds)
    d1, r1, t1, s1 = _cpu_s(daemon), _cpu_s(reaper), time.monotonic(), _switches(daemon.pid)
    wall = t1 - t0
    names = _python_thread_names(daemon.pid)
    wakeups = {
        f"{names.get(tid, comm)}[{tid}]": (n - s0.get(tid, (comm, 0))[1]) / wall
        for tid, (comm, n) in s1.items()
    }
    return CpuSample(
        phase, wall, 100 * (d1 - d0) / wall, 100 * (r1 - r0) / wall, daemon.num_threads(), wakeups
    )


def _mem(proc: Any) -> dict[str, float]:
    m = proc.memory_full_info()
    return {"rss_mb": m.rss / MB, "uss_mb": m.uss / MB, "pss_mb": m.pss / MB}


def measure_mem(phase: str, daemon: Any, reaper: Any) -> MemSample:
    return MemSample(phase, _mem(daemon), _mem(reaper))


def measure_rpc(socket: Path, clients: int, requests: int, think_ms: float, commands: str) -> RpcResult:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "_client", str(socket), str(requests), str(think_ms), commands],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(clients)
    ]
    for p in procs:
        assert p.stdout is not None
        p.stdout.readline()  # "ready" (or EOF: the error shows below)
    start_at = time.time()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    latencies: list[float] = []
    errors: list[str] = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
            continue
        latencies.extend(json.loads(out.strip().splitlines()[-1]))
    wall = time.time() - start_at
    if not latencies:
        return RpcResult(clients, requests, think_ms, commands, 0.0, 0.0, 0.0, wall, errors)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return RpcResult(
        clients, requests, think_ms, commands, statistics.median(latencies), p99, latencies[-1], wall, errors
    )


class Setup:
    """etcd + one daemon in a temp dir; ``close`` stops both (and the job, if any)."""

    def __init__(self, tmp: Path, extra: list[str]) -> None:
        from elasticd.etcd.embedded import EmbeddedEtcd

        self.tmp = tmp
        self.socket = tmp / "ctl.sock"
        self.etcd = EmbeddedEtcd(tmp / "etcd")
        self.etcd.start()
        self.env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        argv = [
            sys.executable, "-m", "elasticd",
            "--socket", str(self.socket),
            "--state-dir", str(tmp / "state"),
            "--log-dir", str(tmp / "logs"),
            "--node-id", "bench-footprint",
            "--etcd-endpoints", self.etcd.endpoint,
            "--log-format", "json",
            "--allow-root-jobs",
            "--slots", "2",
            *extra,
        ]  # fmt: skip
        self.log = tmp / "daemon.log"
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=err, stderr=err, env=self.env, cwd=tmp)

    def ctl(self, *argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        env = self.env | {"ELASTICD_SOCKET": str(self.socket)}
        return subprocess.run(
            [sys.executable, "-m", "elasticctl", *argv],
            capture_output=True, text=True, timeout=timeout_s, env=env, cwd=self.tmp,
        )  # fmt: skip

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        from elasticctl.client import Client

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"elasticd exited with {self.proc.returncode}:\n{self.tail()}")
            client = Client(self.socket, timeout_s=0.5)
            try:
                client.call("ping")
                return
            except Exception:
                time.sleep(0.1)
            finally:
                client.close()
        raise RuntimeError(f"elasticd did not answer within {timeout_s} s:\n{self.tail()}")

    def reaper(self) -> Any:
        import psutil

        for child in psutil.Process(self.proc.pid).children():
            if "elasticd.workers.proctree.reaper" in " ".join(child.cmdline()) or "reaper" in child.name():
                return child
        raise RuntimeError("the daemon has no reaper child")

    def job_state(self, job: str) -> str:
        from elasticctl.client import Client

        client = Client(self.socket, timeout_s=10)
        try:
            return str(client.call("status", job=job)["job"]["state"])
        finally:
            client.close()

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.etcd.stop()


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


def start_job(setup: Setup) -> str:
    """Submit the sleeper; its job id once it runs."""
    res = setup.ctl("submit", "--nproc-per-node", "1", str(SLEEPER))
    if res.returncode != 0:
        raise RuntimeError(f"submit failed: {res.stderr}")
    job = res.stdout.split()[0]
    deadline = time.monotonic() + 60
    while (state := setup.job_state(job)) != "RUNNING":
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job} is {state}, not RUNNING, after 60 s:\n{setup.tail()}")
        time.sleep(0.2)
    return job


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


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        sys.exit(_client_main(sys.argv[2:]))
    sys.exit(main())

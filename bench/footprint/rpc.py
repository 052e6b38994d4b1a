"""The control RPC load: ``--clients`` client processes (this file, run as a script), each one
ZeroMQ DEALER on the daemon's socket like ``elasticctl``, and their latencies.

Run as a script it is one client, and imports nothing of the bench (its directory, not bench/,
is then on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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


def client_main(argv: list[str]) -> int:
    """One RPC client process: ``rpc.py SOCKET REQUESTS THINK_MS CMD[,CMD...]``.

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


def measure_rpc(socket: Path, clients: int, requests: int, think_ms: float, commands: str) -> RpcResult:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(socket), str(requests), str(think_ms), commands],
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


if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1:]))

"""How soon ``elasticctl submit`` sends its request: process start to the submit RPC's arrival.

A job's first start begins with ``elasticctl submit``; everything the CLI does before
its request leaves (interpreter start, imports, argument parsing, building the request) is on
that path. This bench runs the same command line as ``bench_single.py`` (``elasticctl submit
--nproc-per-node 2 --max-restarts 3 --python ... --env OMP_NUM_THREADS=1 --follow worker.py --
...``) against a stand-in daemon: a ZeroMQ ROUTER on a temporary socket that timestamps each
request as it arrives and answers it with an error, so the CLI exits at once (no job, no etcd).

- **send**: ``time.perf_counter()`` just before the CLI is spawned to the request's arrival at the
  ROUTER (both in this process), median / min / max over ``--trials``;
- **imports** (``--importtime``): the CLI run under ``python -X importtime`` and stopped when its
  request arrives; the sum of the top-level imports' cumulative times, less those that
  ``python -c pass`` imports too (the interpreter's own start-up), median over the trials, and the
  ten costliest top-level imports of the last run.

    .venv/bin/python bench/bench_ctl_submit.py [--trials 25] [--importtime]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "bench" / "worker.py"
BIN = Path(sys.executable).parent
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def _argv(out: Path) -> list[str]:
    return [
        str(BIN / "elasticctl"), "submit",
        "--nproc-per-node", "2",
        "--max-restarts", "3",
        "--python", sys.executable,
        "--env", "OMP_NUM_THREADS=1",
        "--follow",
        str(WORKER), "--", "--mode", "start", "--tag", str(out), "--out", str(out),
    ]  # fmt: skip


def _top_level(stderr: str) -> dict[str, int]:
    """Top-level imports (those not under another) and their cumulative microseconds."""
    out: dict[str, int] = {}
    for line in stderr.splitlines():
        m = _LINE.match(line)
        if m and len(m.group(3)) == 1:
            out[m.group(4)] = out.get(m.group(4), 0) + int(m.group(2))
    return out


def _baseline() -> set[str]:
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True)
    return set(_top_level(run.stderr))


def _answer(router: zmq.Socket[bytes], timeout_s: float) -> float | None:
    """Wait for one request; answer it with an error reply; its arrival time."""
    if not router.poll(int(timeout_s * 1000)):
        return None
    ident, raw = router.recv_multipart()
    at = time.perf_counter()
    rid = json.loads(raw)["id"]
    reply = {"v": 1, "id": rid, "ok": False, "error": {"code": "internal", "message": "bench: no daemon"}}
    router.send_multipart([ident, json.dumps(reply).encode()])
    return at


def _bytecode() -> str:
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return "not written (PYTHONDONTWRITEBYTECODE): modules without a .pyc are compiled at each run"
    return f"cached ({os.environ.get('PYTHONPYCACHEPREFIX') or '__pycache__'})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--trials", type=int, default=25)
    p.add_argument("--importtime", action="store_true", help="also run the CLI under -X importtime")
    ns = p.parse_args(argv)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    with tempfile.TemporaryDirectory(prefix="bench-ctl-") as tmp:
        sock = Path(tmp) / "control.sock"
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(f"ipc://{sock}")
        env = os.environ | {"ELASTICD_SOCKET": str(sock)}
        sends: list[float] = []
        for _ in range(ns.trials + 1):  # the first one (not counted) writes bytecode if it may
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                _argv(Path(tmp)), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            at = _answer(router, 30)
            _, err = proc.communicate(timeout=30)
            if at is None or proc.returncode != 3:
                print(f"trial failed: rc={proc.returncode} {err.decode(errors='replace')}", file=sys.stderr)
                return 1
            sends.append(at - t0)
        ms = [s * 1000 for s in sends[1:]]
        print(f"bytecode: {_bytecode()}")
        median = statistics.median(ms)
        print(f"send: median {median:.1f} ms, min {min(ms):.1f}, max {max(ms):.1f} ({ns.trials} trials)")
        if ns.importtime:
            base = _baseline()
            totals: list[float] = []
            top: dict[str, int] = {}
            for _ in range(ns.trials):
                cmd = [sys.executable, "-X", "importtime", *_argv(Path(tmp))]
                traced = subprocess.Popen(
                    cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                )
                at = _answer(router, 30)
                traced.kill()  # stopped at its request: what it imported so far is on stderr
                _, trace = traced.communicate(timeout=30)
                if at is None:
                    print(f"trial failed: {trace}", file=sys.stderr)
                    return 1
                top = {k: v for k, v in _top_level(trace).items() if k not in base}
                totals.append(sum(top.values()) / 1000)
            print(f"imports before the request: median {statistics.median(totals):.1f} ms (-X importtime)")
            for name, us in sorted(top.items(), key=lambda kv: -kv[1])[:10]:
                print(f"  {us / 1000:6.1f} ms  {name}")
        router.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

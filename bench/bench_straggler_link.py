"""A slow link: what the slowness score and the node check say of a node whose link is held to a
low rate, in network namespaces (root).

A plain 3-node DDP job on gloo (``tests/scripts/ddp_steady.py``, one rank a node, each node a
network namespace of ``tests/netns.py``, each under its own torchrun) runs with the daemon's own
sampler and judge against its ranks, every rank seen as a node of its own (as the judge sees a
job of one rank a node). Then node 2's veth is held to ``--mbit`` on both ends (a ``tbf`` qdisc:
no netem in this kernel, ``tests/slowdowns.py`` says why) for ``--slow`` seconds:

- the job's steps per second, healthy and slowed;
- ranks named during each (the score is not meant to name a slow link: every rank waits alike);
- the node check (``workers/check_program.py``, as ``elasticctl check`` runs it: node 0 measures
  its link to nodes 1 and 2), healthy and slowed: round trip and bulk rate, and node 2's rate
  against node 1's (under 0.5: far below its peers).

    python bench/bench_straggler_link.py --healthy 40 --slow 60 --mbit 50
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_stragglers import steps, wait_pids  # noqa: E402

from elasticd.netaddr import free_port  # noqa: E402
from elasticd.progress.slowness import Verdicts, aligned_end, judge, scores  # noqa: E402
from elasticd.progress.threadstate import ActivitySampler  # noqa: E402
from tests.netns import IFNAME, Topology  # noqa: E402
from tests.slowdowns import link_rate  # noqa: E402

SCRIPT = REPO / "tests" / "scripts" / "ddp_steady.py"
CHECK = REPO / "elasticd" / "workers" / "check_program.py"
NODES = 3
EVALUATE_S = 5.0


def start_job(topo: Topology, out: Path, sleep_s: float) -> list[subprocess.Popen[bytes]]:
    torchrun = Path(sys.executable).parent / "torchrun"
    master, port = topo.hosts[0].address, free_port()
    env = dict(os.environ, OUT=str(out), STEPS_FILE="1", GLOO_SOCKET_IFNAME=IFNAME, STEP_SLEEP_S=str(sleep_s))
    jobs = []
    for host in topo.hosts:
        argv = [
            "ip", "netns", "exec", host.netns, str(torchrun), "--nnodes", str(NODES), "--node-rank",
            str(host.index), "--nproc-per-node", "1", "--master-addr", master, "--master-port", str(port),
            str(SCRIPT),
        ]  # fmt: skip
        out_err = subprocess.DEVNULL
        jobs.append(subprocess.Popen(argv, env=env, stdout=out_err, stderr=out_err, start_new_session=True))
    return jobs


def watch(
    pids: list[int], out: Path, seconds: float
) -> tuple[float, dict[int, float], list[dict[int, float]]]:
    """Sample and judge for ``seconds``: steps a second, when each named rank was named (seconds
    in), and every evaluation's scores."""
    sampler = ActivitySampler(list(enumerate(pids)))
    sampler.start()
    v, start, s0 = Verdicts(), time.monotonic(), steps(out)
    named: dict[int, float] = {}
    said: list[dict[int, float]] = []
    try:
        while (now := time.monotonic()) - start < seconds:
            time.sleep(EVALUATE_S)
            until = aligned_end(time.time())
            evidence = {r: e for r in range(NODES) if (e := sampler.evidence(r)) is not None}
            current = scores(evidence)
            said.append(current)
            v, changes = judge(v, current, until)
            named |= {c.rank: round(now - start) for c in changes if c.straggler and c.rank not in named}
    finally:
        sampler.close()
    return (steps(out) - s0) / (time.monotonic() - start), named, said


def _in(host_ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", host_ns, sys.executable, "-I", str(CHECK), *argv]


def check(topo: Topology) -> dict[str, dict[str, float]]:
    """Node 0's check of its links to nodes 1 and 2, as ``elasticctl check`` runs it."""
    servers: list[subprocess.Popen[bytes]] = []
    targets: list[str] = []
    try:
        for host in topo.hosts[1:]:
            proc = subprocess.Popen(_in(host.netns, "serve", host.address, "20"), stdout=subprocess.PIPE)
            servers.append(proc)
            assert proc.stdout is not None
            targets.append(f"{host.address}:{json.loads(proc.stdout.readline())['port']}")
        probe = _in(topo.hosts[0].netns, "probe", "10", *targets)
        res = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        peers: dict[str, dict[str, float]] = json.loads(res.stdout)["peers"]
        return {f"node {i + 1}": peers[t] for i, t in enumerate(targets)}
    finally:
        for proc in servers:
            proc.kill()
            proc.wait()


def describe(found: dict[str, dict[str, float]]) -> str:
    parts = [
        f"{node}: rtt {f['rtt_s'] * 1e3:.2f} ms, {f['bytes_per_s'] / 1e6:.1f} MB/s"
        for node, f in found.items()
    ]
    ratio = found["node 2"]["bytes_per_s"] / found["node 1"]["bytes_per_s"]
    return "; ".join(parts) + f"; node 2 / node 1 rate {ratio:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--healthy", type=float, default=40.0, help="seconds of the healthy job watched")
    ap.add_argument("--slow", type=float, default=60.0, help="seconds watched with node 2's link slow")
    ap.add_argument("--mbit", type=float, default=50.0, help="node 2's link rate, Mbit/s")
    ap.add_argument("--step-sleep", type=float, default=0.005, help="each step's sleep (its data loader)")
    ns = ap.parse_args()
    topo = Topology(n_hosts=NODES)
    with tempfile.TemporaryDirectory() as tmp:
        out, jobs = Path(tmp), []
        try:
            topo.create()
            jobs = start_job(topo, out, ns.step_sleep)
            pids = wait_pids(out, 180, NODES)
            time.sleep(3)
            print(f"check, healthy: {describe(check(topo))}", flush=True)
            rate, named, said = watch(pids, out, ns.healthy)
            print(f"healthy: {rate:.1f} steps/s; {ns.healthy:.0f} s watched, ranks named: {named or 'none'}")
            host = topo.hosts[2]
            with link_rate([(host.netns, IFNAME), (None, host.veth)], ns.mbit):
                print(f"check, node 2 at {ns.mbit:g} Mbit/s: {describe(check(topo))}", flush=True)
                rate, named, said = watch(pids, out, ns.slow)
            said_named = named or "none"
            print(f"slow link: {rate:.1f} steps/s; {ns.slow:.0f} s watched, ranks named (s in): {said_named}")
            print(f"  last scores: {said[-3:]}")
        finally:
            (out / "stop").touch()
            for job in jobs:
                try:
                    job.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(job.pid, signal.SIGKILL)
                    job.wait()
            topo.destroy()


if __name__ == "__main__":
    main()

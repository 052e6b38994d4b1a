"""The pre-flight node check's cost at a round: a job of N nodes started with and without
``--node-check``, interleaved, on N daemons ("nodes", one host) sharing the bench's etcd.

Per trial: ``submit --nnodes N`` of a job whose every worker writes a file when it starts
(``tests/scripts/member.py``), and two figures: ``rendezvous`` (the round's own figure, in its
event: first join to the round closed, which is where the check runs) and ``to_start`` (from the
submit until every worker has started). Medians per N and variant, and the check's cost (on
minus off). The check must cost a healthy round at most 5 s.

    python bench/bench_node_check.py --nodes 2,3 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.paths import default_bin
from harness.procs import sweep
from multi.daemon import Daemon, running

from elasticd.etcd.embedded import EmbeddedEtcd

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "scripts" / "member.py"


def trial(daemons: list[Daemon], out: Path, check: bool) -> tuple[float, float]:
    """One job on every daemon: (rendezvous_s, to_start_s)."""
    n = len(daemons)
    argv = [
        "submit",
        "--nnodes",
        str(n),
        "--last-call",
        "0",
        "--env",
        f"OUT={out}",
        "--python",
        sys.executable,
    ]
    argv += ["--node-check"] if check else ["--no-node-check"]
    t0 = time.monotonic()
    res = daemons[0].ctl(*argv, str(SCRIPT), timeout_s=60)
    if res.returncode != 0:
        raise RuntimeError(f"submit: {res.stdout} {res.stderr}")
    job = res.stdout.splitlines()[0].strip()
    while len(list(out.glob("w.0.*.json"))) < n:
        if time.monotonic() - t0 > 120:
            raise TimeoutError("the workers did not start")
        time.sleep(0.02)
    to_start = time.monotonic() - t0
    (out / "finish").touch()
    events = daemons[0].ctl("events", job, "--json").stdout.splitlines()
    rounds = [e for e in map(json.loads, events) if e.get("kind") == "round"]
    while daemons[0].status(job).get("state") not in ("SUCCEEDED", "FAILED", "KILLED"):
        time.sleep(0.1)
    return float(rounds[0]["fields"]["rendezvous_s"]), to_start


def run(n: int, repeats: int, etcd: str, tmp: Path, binary: Path) -> dict[str, list[tuple[float, float]]]:
    env = {"PATH": f"{binary}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    found: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    nodes = [Daemon(binary, env, etcd, tmp / f"n{n}-{i}", f"nc{n}-{i}", f"/bench/nc{n}") for i in range(n)]
    with running(nodes) as daemons:
        for i in range(repeats):
            for variant in ("off", "on"):
                out = tmp / f"n{n}-{variant}-{i}"
                out.mkdir()
                found[variant].append(trial(daemons, out, variant == "on"))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="2,3", help="round sizes, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bin", default=str(default_bin()))
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="elasticd-bench-check-"))
    etcd = EmbeddedEtcd(tmp / "etcd")
    etcd.start()
    try:
        print(f"{'nodes':>5} {'variant':>7} {'rendezvous':>11} {'to_start':>9}   (medians, s)")
        for n in (int(x) for x in ns.nodes.split(",")):
            found = run(n, ns.repeats, etcd.endpoint, tmp, Path(ns.bin))
            med = {v: [statistics.median(x[k] for x in found[v]) for k in (0, 1)] for v in found}
            for v in ("off", "on"):
                print(f"{n:>5} {v:>7} {med[v][0]:>11.3f} {med[v][1]:>9.3f}")
            cost = [med["on"][k] - med["off"][k] for k in (0, 1)]
            print(f"{n:>5} {'cost':>7} {cost[0]:>11.3f} {cost[1]:>9.3f}")
    finally:
        etcd.stop()
        sweep([str(tmp)])


if __name__ == "__main__":
    main()

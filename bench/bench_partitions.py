"""Time to recover from each network partition, on 3 daemons in network namespaces (needs root).

    /work/main/.venv/bin/python bench/bench_partitions.py [--runs 3] [--ttl 3] [--kinds K,..] [--json PATH]

Each run is one chaos soak (``bench/soak.py --duration 0``: a fresh etcd, 3 daemons and the soak's
DDP job, every fault kind once, in a seeded order, against a seeded node) with the partition
kinds (etcd_cut, peer_cut, one_way_loss, etcd_slow; ``soak_faults.py`` says what each does and
when it is healed) and worker_kill as a baseline on the same cluster. Per kind, over all runs:

- ``resumed_s``: the fault -> the first step of a newer round at any world size (the job going on
  without the node, while it is still cut);
- ``recover_s``: the fault -> the first step at full strength after the heal (for etcd_slow, the
  worker kill -> the first full step of the next round, while every etcd request is 200 ms late);
- ``fenced_s``: the fault -> the death of the last of the target node's workers (for the kinds
  that take the node off etcd, the fence, bound: TTL + 1 s).

Prints one JSON object (also written to ``--json``); exit status 0 only if every run's checks held.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
KINDS = ("etcd_cut", "peer_cut", "one_way_loss", "etcd_slow", "worker_kill")


def run_once(seed: int, ttl: float, kinds: tuple[str, ...], timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        report = Path(tmp) / "soak.json"
        argv = [sys.executable, str(BENCH / "soak.py"), "--duration", "0", "--seed", str(seed),
                "--faults", ",".join(kinds), "--gap", "3", "--ttl", str(ttl), "--recover-timeout", "90",
                "--json", str(report)]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
        if not report.exists():
            tail = (res.stdout + res.stderr)[-3000:]
            raise RuntimeError(f"soak wrote no report ({res.returncode}): {tail}")
        return dict(json.loads(report.read_text()))


def summarize(reports: list[dict[str, Any]], kinds: tuple[str, ...]) -> dict[str, Any]:
    def med(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 2) if xs else None

    out: dict[str, Any] = {}
    for kind in kinds:
        faults = [f for r in reports for f in r["faults"] if f["fault"]["kind"] == kind]
        recover = [f["recover_s"] for f in faults if f["recover_s"] is not None]
        resumed = [f["resumed_s"] for f in faults if f["resumed_s"] is not None]
        fenced = [f["fenced_s"] for f in faults if f["fenced_s"] is not None]
        bounds = [f["fence_bound_s"] for f in faults if f["fence_bound_s"] is not None]
        out[kind] = {
            "injected": len(faults),
            "survived": sum(bool(f["survived"]) for f in faults),
            "recover_s": recover,
            "recover_median_s": med(recover),
            "recover_max_s": max(recover, default=None),
            "resumed_median_s": med(resumed),
            "fenced_s": fenced,
            "fenced_max_s": max(fenced, default=None),
            "fence_bound_s": bounds[0] if bounds else None,
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="soaks, each injecting every kind once (default 3)")
    p.add_argument("--ttl", type=float, default=3, help="the daemons' --lease-ttl (default 3)")
    p.add_argument("--seed", type=int, default=1, help="first run's seed; the next runs count up")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"fault kinds (default {','.join(KINDS)})")
    p.add_argument("--json", type=Path, help="also write the result here")
    ns = p.parse_args()
    kinds = tuple(k for k in ns.kinds.split(",") if k)
    if not kinds or set(kinds) - set(KINDS):
        p.error(f"--kinds takes some of {','.join(KINDS)}")
    reports = []
    t0 = time.time()
    for i in range(ns.runs):
        reports.append(run_once(ns.seed + i, ns.ttl, kinds, timeout_s=900))
    failed = [
        {"seed": r["seed"], "check": c["name"], "detail": c["detail"]}
        for r in reports
        for c in r["checks"]
        if not c["ok"]
    ]
    result = {
        "runs": ns.runs,
        "ttl_s": ns.ttl,
        "netns": all(r.get("netns") for r in reports),
        "wall_s": round(time.time() - t0, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "kinds": summarize(reports, kinds),
        "failed_checks": failed,
        "ok": all(r["ok"] for r in reports),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if ns.json:
        ns.json.write_text(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Chaos soak: an elastic DDP job on 3 daemons and one etcd, under a seeded plan of random faults.

    /work/main/.venv/bin/python bench/soak.py [--duration 600] [--seed N] [--faults all|k1,k2,...]
                                             [--gap 15] [--etcd-client gateway|grpc|mixed]
                                             [--json PATH] [--keep]

What runs: a real etcd (loopback, temp data dir) and 3 daemons on it, started with the test
suite's support code, each talking to etcd through ``--etcd-client`` (its JSON gateway, or grpc;
mixed: the daemons alternate, the first on the gateway);
the job ``bench/soak_job.py`` (gloo on CPU, ``--nnodes 2:3``, one worker per node,
``elasticd.worker.GracefulStop`` and a memory snapshot after every step, the daemons started with
``--snapshot-bytes``; ``--no-snapshots``: a disk checkpoint every 25 steps; a ledger committed
with each; its crash-loss contract is at the top of that file).

Faults (``soak_plan.FaultKind``; one at a time, each after the previous one recovered; see
``soak_faults.py`` for what recovery means): worker_kill, daemon_kill (then a restart with the
same node id and state dir), daemon_stop (SIGSTOP past the lease TTL, then SIGCONT), etcd_restart
(kill -9, restart on the same data dir), drain (then undrain), hung_rank (only when
``elasticctl submit`` has ``--hang-timeout``; otherwise disabled, and the output says so), and the
partitions etcd_cut, peer_cut, one_way_loss, etcd_slow (``soak_faults.py``). Partitions need root
and network namespaces: when any is asked for, the daemons run in namespaces of their own on a
bridge (``tests/netns.py``); where namespaces cannot be used they are disabled, and the output says so.

Every requested kind is injected once, first, even if that takes longer than ``--duration``; then
more faults from the plan while the duration lasts. At the end the soak asks the job to finish and checks:
job SUCCEEDED; the committed ledger has every step once, in order; no rollback beyond the
commit interval (1 step with snapshots); never two rounds with live workers at once (from the
workers' own life lines); every node cut from etcd fenced within the lease TTL + 1 s; no worker
of the job left; no etcd key beyond the job's history and the live nodes' own; every daemon start
on the requested etcd client; every requested fault kind injected; after stopping everything, none
of the soak's processes left. Exit status 0 only if all hold. The plan is reproducible from ``--seed``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's elasticd, not the venv's

from harness.procs import sweep
from soak_check import (
    Check,
    check_crash_loss,
    check_etcd_client,
    check_fencing,
    check_job_orphans,
    check_keys,
    check_ledger,
    check_own_orphans,
    check_rounds_disjoint,
)
from soak_cluster import REPO, Cluster, JobSettings, read_lives, wait_until
from soak_faults import FaultResult, run_fault
from soak_plan import PARTITION_KINDS, Fault, FaultKind, make_plan, parse_kinds

from elasticd.etcd.kv import CLIENTS
from tests.netns import unavailable_reason as netns_unavailable
from tests.support import PYTHON

NODES = 3
TAIL_STEPS = 30  # steps the job runs after the last fault before it finishes
SNAPSHOT_BYTES = 32 << 20  # per job and node: the job's state and ledger, two per rank, and replicas


def hang_timeout_supported() -> bool:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([PYTHON, "-m", "elasticctl", "submit", "--help"], capture_output=True, text=True,
                         env=env, timeout=60)  # fmt: skip
    return "--hang-timeout" in res.stdout


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600, help="seconds of faults (default 600)")
    p.add_argument("--seed", type=int, default=None, help="plan seed (default: random, printed)")
    p.add_argument("--faults", default="all", help="all, or a comma-separated list of kinds")
    p.add_argument("--gap", type=float, default=15, help="planned seconds between faults (default 15)")
    p.add_argument("--ttl", type=float, default=3, help="daemons' --lease-ttl (default 3)")
    p.add_argument("--recover-timeout", type=float, default=120, help="per fault (default 120 s)")
    p.add_argument("--hang-timeout", type=float, default=10, help="submit --hang-timeout, when supported")
    p.add_argument("--etcd-client", choices=(*CLIENTS, "mixed"), default="gateway",
                   help="the daemons' --etcd-client (default gateway; grpc: elasticd[grpc]; mixed: "
                   "the daemons alternate, gateway first)")  # fmt: skip
    p.add_argument("--snapshots", action=argparse.BooleanOptionalAction, default=True,
                   help="the job snapshots to memory after every step (default; --no-snapshots: "
                   "a disk checkpoint every 25 steps)")  # fmt: skip
    p.add_argument("--json", type=Path, help="write everything here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (kept anyway on failure)")
    return p.parse_args(argv)


def table(results: list[FaultResult], kinds: tuple[FaultKind, ...]) -> list[dict[str, Any]]:
    rows = []
    for kind in kinds:
        mine = [r for r in results if r.fault.kind is kind and not r.note.startswith("injector error")]
        times = [r.recover_s for r in mine if r.recover_s is not None]
        resumed = [r.resumed_s for r in mine if r.resumed_s is not None]
        rows.append({
            "kind": kind.value,
            "injected": len(mine),
            "survived": sum(r.survived for r in mine),
            "recover_median_s": round(statistics.median(times), 2) if times else None,
            "recover_max_s": max(times) if times else None,
            "resumed_median_s": round(statistics.median(resumed), 2) if resumed else None,
            "fenced_max_s": max((r.fenced_s for r in mine if r.fenced_s is not None), default=None),
        })  # fmt: skip
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    head = (
        f"{'fault':<14}{'injected':>9}{'survived':>9}{'recover med':>13}{'max':>8}{'resumed med':>13}"
        f"{'fenced max':>12}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['kind']:<14}{r['injected']:>9}{r['survived']:>9}{f(r['recover_median_s']):>13}"
            f"{f(r['recover_max_s']):>8}{f(r['resumed_median_s']):>13}{f(r['fenced_max_s']):>12}"
        )
    return "\n".join(lines)


def daemon_complaints(c: Cluster) -> dict[str, int]:
    """warning/error events the daemons logged, by event name (for the report)."""
    counts: dict[str, int] = {}
    for d in c.daemons:
        for line in d.log_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("level") in ("warning", "error", "critical"):
                key = f"{rec.get('level')} {rec.get('event')}"
                counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class Scope:
    """The fault kinds this soak injects, what was left out and why, and how the daemons run."""

    kinds: tuple[FaultKind, ...]
    notes: list[str]
    netns: bool  # the daemons run in network namespaces of their own (for the partitions)
    hang_ok: bool  # submit has --hang-timeout


@dataclass
class Findings:
    """What one soak found, filled in as it goes: an exception part way keeps what came before."""

    results: list[FaultResult] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    state: str = "?"
    skipped: int = 0  # planned faults not started: past the duration, every kind injected once
    keys_at_end: list[str] = field(default_factory=list)
    complaints: dict[str, int] = field(default_factory=dict)
    goodput: dict[str, Any] | None = None  # the ended job's (status's ``goodput``)


def scope_of(ns: argparse.Namespace) -> Scope:
    if ns.etcd_client != "gateway" and importlib.util.find_spec("etcd3") is None:
        raise SystemExit(
            f"soak: --etcd-client {ns.etcd_client} needs the grpc extra (pip install 'elasticd[grpc]')"
        )
    kinds = parse_kinds(ns.faults)
    hang_ok = hang_timeout_supported()
    notes = []
    if FaultKind.HUNG_RANK in kinds and not hang_ok:
        kinds = tuple(k for k in kinds if k is not FaultKind.HUNG_RANK)
        notes.append("hung_rank: disabled (elasticctl submit has no --hang-timeout yet)")
    netns = any(k in PARTITION_KINDS for k in kinds)
    if netns and (why := netns_unavailable()) is not None:
        netns = False
        kinds = tuple(k for k in kinds if k not in PARTITION_KINDS)
        notes.append(f"partitions: disabled ({why})")
    if not kinds:
        raise SystemExit("soak: no fault kind left to inject")
    return Scope(kinds, notes, netns, hang_ok)


def inject(
    c: Cluster, plan: tuple[Fault, ...], ns: argparse.Namespace, n_kinds: int, found: Findings
) -> None:
    """The plan's faults, one at a time, until one is not survived; past the duration, only the
    first ``n_kinds`` (each kind once)."""
    clock0 = time.time()
    for fault in plan:
        if fault.index >= n_kinds and time.time() - clock0 > ns.duration:  # each kind once, always
            found.skipped += 1
            continue
        time.sleep(max(0.0, clock0 + fault.at_s - time.time()))
        r = run_fault(c, fault, clock0, ns.recover_timeout)
        found.results.append(r)
        verdict = "ok  " if r.survived else "FAIL"
        print(f"  #{fault.index:<3} t={r.started_s:>6.1f}s {fault.kind:<13} {verdict} "
              f"recover={r.recover_s}s resumed={r.resumed_s}s rounds={r.rounds} | {r.detail}; {r.note}",
              flush=True)  # fmt: skip
        if not r.survived:
            break


def goodput_lines(goodput: dict[str, Any] | None) -> list[str]:
    """Where the job's wall time went, by cause as elasticd booked it (``status``'s ``goodput``):
    what the faults cost, beside whether it survived them."""
    if not goodput:
        return ["goodput: none reported"]
    wall = float(goodput["wall_s"])
    ratio = goodput.get("ratio")
    lines = [f"goodput: {'-' if ratio is None else f'{ratio:.3f}'} of {wall:.1f} s"]
    for cause, seconds in goodput["by_cause_s"].items():
        share = f"{100 * seconds / wall:5.1f}%" if wall > 0 else "    -"
        lines.append(f"  {cause:<11} {seconds:8.1f} s {share}")
    return lines


def finish_and_check(
    c: Cluster, job: str, settings: JobSettings, scope: Scope, ns: argparse.Namespace, found: Findings
) -> None:
    """Ask the job to finish a few steps on, wait for its end, and run the end checks."""
    results = found.results
    last = c.progress.last()
    target = (last.step if last else 0) + TAIL_STEPS
    c.set_finish(target)
    ended = wait_until(
        lambda: (v := c.status()) is not None and v["state"] in ("SUCCEEDED", "FAILED", "KILLED") and v,
        ns.recover_timeout + 60, 0.5,
    )  # fmt: skip
    found.state = state = ended["state"] if ended else f"not ended ({(c.status() or {}).get('state')})"
    found.goodput = ended.get("goodput") if ended else None
    checks = found.checks
    checks.append(
        Check("job SUCCEEDED", state == "SUCCEEDED", f"{state}, restarts={ended and ended['restarts']}")
    )
    checks.append(check_ledger(c.out / "ckpt.pt", target))
    checks.append(check_crash_loss(c.progress.poll(), settings.interval))
    checks.append(check_rounds_disjoint(read_lives(c.out)))
    if any(r.fence_bound_s is not None for r in results):
        checks.append(check_fencing(results))
    checks.append(check_job_orphans(job))
    checks.append(check_keys(c))
    checks.append(check_etcd_client(c))
    found.keys_at_end = [k.removeprefix(c.prefix + "/") for k in c.etcd_keys()]
    injected = {r.fault.kind for r in results if not r.note.startswith("injector error")}
    missing = [k.value for k in scope.kinds if k not in injected]
    checks.append(
        Check(
            "every requested fault kind injected",
            not missing,
            f"missing: {missing}" if missing else f"{len(results)} faults, {found.skipped} not started",
        )
    )
    checks.append(Check("every fault survived", all(r.survived for r in results),
                        f"{sum(r.survived for r in results)}/{len(results)}"))  # fmt: skip


def run(ns: argparse.Namespace) -> int:
    seed = ns.seed if ns.seed is not None else int.from_bytes(os.urandom(4), "big")
    scope = scope_of(ns)
    kinds = scope.kinds
    settings = JobSettings(hang_timeout_s=ns.hang_timeout if scope.hang_ok else None, snapshots=ns.snapshots)
    plan = make_plan(seed, ns.duration, kinds, nodes=NODES, gap_s=ns.gap)
    root = Path(tempfile.mkdtemp(prefix="elasticd-soak-"))
    print(
        f"soak: seed={seed} duration={ns.duration:.0f}s kinds={','.join(kinds)} "
        f"planned={len(plan)} etcd_client={ns.etcd_client} snapshots={'on' if ns.snapshots else 'off'} "
        f"dir={root}"
    )
    for n in scope.notes:
        print(f"soak: {n}")
    sys.stdout.flush()
    c = Cluster(root, NODES, ns.ttl, daemon_stop_grace_s=5, netns=scope.netns, etcd_client=ns.etcd_client,
                snapshot_bytes=SNAPSHOT_BYTES if ns.snapshots else 0)  # fmt: skip
    found = Findings()
    t_start = time.time()
    try:
        c.start()
        job = c.submit(settings)
        print(f"soak: job {job} submitted on {c.node_ids[0]}", flush=True)
        full = wait_until(lambda: (s := c.progress.last()) is not None and s.world == NODES and s, 180, 0.2)
        if not full:
            raise RuntimeError(f"the job never ran at full strength: {c.status()}")
        inject(c, plan, ns, len(kinds), found)
        finish_and_check(c, job, settings, scope, ns, found)
    except Exception as e:
        found.checks.append(Check("soak ran", False, f"{type(e).__name__}: {e}"))
    finally:
        found.complaints = daemon_complaints(c)
        c.shutdown()
        found.checks.append(check_own_orphans(c))
        sweep(c.markers())
    ok = report(ns, seed, scope, plan, c, found, t_start)
    if ok and not ns.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"soak: kept {root}")
    return 0 if ok else 1


def report(
    ns: argparse.Namespace,
    seed: int,
    scope: Scope,
    plan: tuple[Fault, ...],
    c: Cluster,
    found: Findings,
    t_start: float,
) -> bool:
    """Print the table, the notes and the checks (and write ``--json``); whether every check held."""
    rows = table(found.results, scope.kinds)
    ok = all(ch.ok for ch in found.checks)
    print()
    print(render(rows))
    for n in scope.notes:
        print(f"({n})")
    print()
    print("\n".join(goodput_lines(found.goodput)))
    print()
    for ch in found.checks:
        print(f"  [{'ok' if ch.ok else 'FAIL'}] {ch.name}: {ch.detail}")
    if found.complaints:
        print("daemon warnings/errors: " + ", ".join(f"{k} x{v}" for k, v in found.complaints.items()))
    print(f"soak {'PASSED' if ok else 'FAILED'} in {time.time() - t_start:.0f}s (seed {seed})", flush=True)
    if ns.json:
        ns.json.write_text(json.dumps({
            "ok": ok, "seed": seed, "duration_s": ns.duration, "kinds": list(scope.kinds),
            "notes": scope.notes, "plan": [asdict(f) for f in plan],
            "faults": [asdict(r) for r in found.results], "table": rows,
            "checks": [asdict(ch) for ch in found.checks], "daemon_complaints": found.complaints,
            "dir": str(c.root), "job": c.job_id, "state": found.state, "keys_at_end": found.keys_at_end,
            "goodput": found.goodput,
            "netns": scope.netns, "ttl_s": ns.ttl, "etcd_client": ns.etcd_client, "snapshots": ns.snapshots,
        }, indent=2, default=str))  # fmt: skip
    return ok


def main() -> int:
    ns = parse_args()

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"soak: signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    return run(ns)


if __name__ == "__main__":
    sys.exit(main())

"""Rendezvous at scale: N participants against one etcd, spread over several processes.

elasticd side: each participant is a *node*: its own etcd client (its own connections, as one
daemon has), its own lease, and the watch a daemon has: the manager's ranges (``Keys.watched``:
the whole prefix but the jobs' notes, joins and reports), routed by the real codec
and filtered as the agent's ``wake`` filters (``AgentRecord.woken_by``). It runs the join path of
``elasticd.agent.step`` with the real ``JobStore`` (etcd I/O) and the real pure deciders
(``leader``, ``decide_close``, ``order_members``, ``build_result``): it puts its join key under
its lease and (as the agent's ``Publish``; ``--no-publish`` leaves it out) its status, glances at
the round while someone else leads, and the leader, which alone watches the round's joins
(``JobStore.watch_joins``, opened when it finds it leads, then a read of what came before),
closes the round when MAX have joined.
The participants run as threads in ``--procs`` separate processes (default: one per 128
participants), so that no single Python interpreter carries them all: the harness is not what
is measured. The unary etcd requests of every
participant are counted in its own client (the watch is one stream per node, counted apart).

Reported per N: the time from the *last join* (the last participant's join put returned) to the
leader's close and to the moment *every* participant holds its assignment (the round's head and
its own record, ``elasticd.rendezvous.roster``); the time from the start signal; unary requests
per participant (median and max); whether that stays O(1) (the max does not grow with N); the
watch events the participants received (all of them, and joins among them); the bytes each
participant read (``read_bytes_per_participant``: every unary response body and every watch
line, counted in its client; median and max, the leader apart) and wrote; the bytes one more
daemon's copy of every job (``ClusterCopy``, ``ScanProbe``) reads and hears for the round, and what a
read of ``rounds/`` (every member's assignment, which that copy leaves out) would add; etcd's CPU over the
run (psutil on its process); and etcd's own rates on this machine (``etcd_rates``: small reads,
transactions of assignments, bytes per second), which ``bench/rdzv_model.py`` takes to predict
rounds beyond what one machine can play.

torch side (``--torch``, off by default at N > 256 where it does not finish): the
``DynamicRendezvousHandler`` over ``C10dRendezvousBackend`` on one ``TCPStore``, one handler per
participant, threads of one process; ``get_state``/``set_state`` calls count as its requests.

    .venv/bin/python bench/bench_rdzv_scale.py [--sizes 64,256,1024] [--procs P] [--no-publish]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.paths import REPO
from harness.procs import live, stop
from harness.runinfo import on_sigterm
from rdzvscale.breakdown import breakdown, report_breakdowns
from rdzvscale.etcdrates import etcd_rates
from rdzvscale.participants import serve
from rdzvscale.report import Outcome, report
from rdzvscale.rounds import Side, measure_round
from rdzvscale.torchside import run_torch

from elasticd.etcd.embedded import EmbeddedEtcd


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sizes", default="64,256,1024")
    p.add_argument("--procs", type=int, default=0, help="participant processes (default: one per 128)")
    p.add_argument(
        "--watch", choices=["node", "process"], default="node",
        help="node: every node its own watch stream, as daemons have (default); process: one per process",
    )  # fmt: skip
    p.add_argument(
        "--no-publish", dest="publish", action="store_false",
        help="leave out the status a joining agent publishes (reports/<job>/<node>, watched by none)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=180.0, help="per side and size, seconds")
    p.add_argument("--torch", action="store_true", help="also run torch's c10d rendezvous (N <= 256)")
    p.add_argument(
        "--versus", metavar="REV",
        help="also play each round with REV's participants (a git worktree of it), interleaved",
    )  # fmt: skip
    p.add_argument("--repeat", type=int, default=1, help="rounds of each size (and side)")
    p.add_argument("--json", type=Path)
    p.add_argument("--no-rates", dest="rates", action="store_false", help="leave out etcd's per-op rates")
    p.add_argument(
        "--breakdown", type=int, default=0, metavar="N",
        help="etcd's CPU per request of a participant of a round of N, each kind alone, on both clients",
    )  # fmt: skip
    return p.parse_args(argv)


def run_sizes(
    etcd: EmbeddedEtcd, args: argparse.Namespace, rates: dict[str, float], outcomes: list[Outcome]
) -> None:
    """etcd's rates (unless ``--no-rates``), then a round of each size (and torch's, ``--torch``)."""
    if args.rates:
        rates.update(etcd_rates(etcd.endpoint, etcd.pid))
        print("etcd rates:", json.dumps(rates), flush=True)
    for kind in ("gateway", "grpc") if args.breakdown else ():
        parts = breakdown(etcd.endpoint, etcd.pid, kind, args.breakdown)
        args.breakdowns.append(parts)
        print(parts, flush=True)
    sides = [Side(), *([Side(f"elasticd@{args.versus}", args.before_tree)] if args.versus else [])]
    for n in (int(s) for s in args.sizes.split(",")):
        procs = args.procs or max(1, -(-n // 128))
        for k in range(args.repeat):
            for side in sides if k % 2 == 0 else sides[::-1]:  # interleaved: neither always first
                outcomes.append(
                    measure_round(
                        etcd.endpoint,
                        etcd.pid,
                        n,
                        min(procs, n),
                        args.timeout,
                        args.watch,
                        args.publish,
                        side,
                    )
                )
                print(outcomes[-1], flush=True)
        if args.torch and n <= 256:
            outcomes.append(run_torch(n, args.timeout))
            print(outcomes[-1], flush=True)


def worktree(rev: str, where: Path) -> Path:
    """A checkout of ``rev`` (its participants play the ``--versus`` side), detached, in ``where``."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev], check=True)
    return where


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.breakdowns = []
    signal.signal(signal.SIGTERM, on_sigterm)  # stops the participants and etcd as ^C does
    outcomes: list[Outcome] = []
    rates: dict[str, float] = {}
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="elasticd-bench-rdzv-") as tmp:
        etcd = EmbeddedEtcd(Path(tmp) / "etcd")
        etcd.start()
        args.before_tree = None
        try:
            args.before_tree = worktree(args.versus, Path(tmp) / "versus") if args.versus else None
            run_sizes(etcd, args, rates, outcomes)
        except KeyboardInterrupt:  # what finished is still reported
            interrupted = True
            print("\ninterrupted; cleaning up", flush=True)
        finally:
            for proc in list(live):
                stop(proc, 5)
            etcd.stop()
            if args.before_tree is not None:  # (the checkout goes with the temporary directory)
                remove = ["git", "-C", str(REPO), "worktree", "remove", "--force", str(args.before_tree)]
                subprocess.run(remove, check=False)
    report(outcomes)
    report_breakdowns(args.breakdowns)
    if args.json:
        out = {"outcomes": [o.__dict__ for o in outcomes], "etcd_rates": rates, "cpus": os.cpu_count()}
        out["breakdown"] = [b.__dict__ for b in args.breakdowns]
        args.json.write_text(json.dumps(out, indent=2))
    return 130 if interrupted else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_node":
        sys.exit(serve(sys.argv[2:]))
    sys.exit(main())

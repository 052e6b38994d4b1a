"""Multi-node benchmark: elasticd vs torchrun, 2 "nodes" on one host, side by side, interleaved.

    /work/main/.venv/bin/python bench/bench_multi.py [--repeats N] [--only loss|drain] [--json PATH]

Two "nodes" x 1 worker, an elastic job with nnodes 1:2, gloo on loopback. elasticd: two daemons
(own --node-id, --socket, --state-dir, --log-dir) sharing one etcd started by the bench, with
``--lease-ttl 2``; torchrun: two agents with the c10d rendezvous (the first hosts the store).

  loss   after ~2 s at world 2, one node dies by SIGKILL (elasticd: the daemon, its reaper and
         every process marked ELASTICD_OWNER=<node>; torchrun: the agent's process group and its
         workers' process groups). Clock: from the kill until the surviving rank's first
         all_reduce at world 1 (``bench/multi_worker.py`` stamps). Run twice per repeat: the node
         hosting rank 0 (torchrun: the c10d store host) dies, then the other one.
  drain  ``examples/elastic_train.py`` (LEDGER: rank 0 appends "step world" per step); after ~50
         steps at world 2 the node of rank 1 leaves (elasticd: ``elasticctl drain NODE``;
         torchrun: SIGTERM to the agent that does not host the store). Clock: from the request
         until the next ledger line at world 1; and steps lost = ledger lines - distinct steps.

Trials alternate elasticd, torchrun, elasticd, torchrun, ... Every trial gets fresh daemons (or
agents), a fresh temp dir, a fresh etcd prefix and fresh ports. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.paths import default_bin
from harness.procs import live, stop, sweep
from harness.runinfo import Run, code_source, installed_torch, loadavg_text, on_sigterm
from multi.elasticd_trials import ElasticdTrials
from multi.report import (
    cpu_summary,
    fmt_trial,
    print_cpu,
    print_samples,
    print_table,
    report_daemon_problems,
    summarize,
    write_json,
)
from multi.torchrun_trials import TorchrunTrials
from multi.trial import DAEMON_SHUTDOWN_S, Trial

from elasticd import log as elasticd_log


class Bench(ElasticdTrials, TorchrunTrials):
    """Both launchers' trials, on the bench's etcd and temp dir."""

    def run(self, scenario: str, variant: str, launcher: str, index: int) -> Trial:
        if scenario == "loss":
            run = self.run_elasticd_loss if launcher == "elasticd" else self.run_torchrun_loss
            return run(variant, index)
        return self.run_elasticd_drain(index) if launcher == "elasticd" else self.run_torchrun_drain(index)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="trials per scenario and launcher (default 5)")
    p.add_argument("--only", choices=("loss", "drain"), help="run one scenario only")
    p.add_argument("--timeout", type=float, default=60.0, help="per trial, from launch (default 60 s)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stamps, ledgers)")
    p.add_argument(
        "--bin",
        default=str(default_bin()),
        type=lambda text: str(Path(text).absolute()),  # the trials run in their own directories
        help="dir with elasticd, elasticctl, torchrun",
    )
    return p.parse_args(argv)


def run_trials(bench: Bench, ns: argparse.Namespace, trials: list[Trial], run: Run) -> None:
    """Every planned trial, with each launcher (stopped by ^C or SIGTERM), then the clean-up."""
    try:
        bench.start_etcd()
        print(f"etcd at {bench.etcd_endpoint}; temp dir {bench.tmp}", flush=True)
        # warm the page cache (torch), so the first trial is not the one paying for the disk
        subprocess.run(
            [bench.python, "-c", "import torch, torch.distributed"], env=bench.base_env, check=False
        )
        plan = []
        for i in range(1, ns.repeats + 1):
            if ns.only in (None, "loss"):
                plan += [("loss", "rank0", i), ("loss", "other", i)]
            if ns.only in (None, "drain"):
                plan += [("drain", "drain", i)]
        for scenario, variant, index in plan:
            for launcher in ("elasticd", "torchrun"):
                tr = bench.run(scenario, variant, launcher, index)
                trials.append(tr)
                print("  " + fmt_trial(tr), flush=True)
    except KeyboardInterrupt:
        run.interrupted = True
        print("\ninterrupted; cleaning up", flush=True)
    finally:
        for proc in list(live):
            stop(proc, 5)
        for daemon in bench.daemons:
            if daemon.alive():
                daemon.sigterm()
                daemon.finish_stop()
        bench.stop_etcd()
        for line in sweep(bench.markers, wait_s=3.0):
            print(f"!! killed leftover process: {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    elasticd_log.configure("console", "warning")  # the bench's own EmbeddedEtcd: quiet
    bench = Bench(ns)
    trials: list[Trial] = []
    started, load_before = time.time(), os.getloadavg()
    source = code_source(bench.python, bench.base_env, bench.tmp)
    run = Run(started, load_before, installed_torch(), source)
    print(f"elasticd code: {run.describe_source()}", flush=True)
    run_trials(bench, ns, trials, run)

    source_end = code_source(bench.python, bench.base_env, bench.tmp)
    code_changed = source_end.get("code_sha256") != source.get("code_sha256")
    rows = summarize(trials)
    run.load_after = os.getloadavg()
    print(
        f"\nelasticd vs torchrun, 2 nodes x 1 worker (gloo, loopback) on {os.cpu_count()} CPUs, torch "
        f"{run.torch_version}, {time.time() - started:.0f}s total; load average (1/5/15 min) at start "
        f"{loadavg_text(load_before)}, at end {loadavg_text(run.load_after)}\n"
    )
    if code_changed:
        print(
            f"!! the elasticd code changed during the run: sha256 {source.get('code_sha256')} at start, "
            f"{source_end.get('code_sha256')} at the end (daemons started later ran the newer code)\n"
        )
    cpu = cpu_summary(trials)
    if rows:
        print_table(rows)
        print_samples(rows)
        print_cpu(cpu)
    warnings = report_daemon_problems(bench)
    if ns.json:
        write_json(ns.json, ns, bench, run, source_end, rows, cpu, trials, warnings)
    if bench.shutdown_hung:
        print(f"\n!! daemons that did not exit within {DAEMON_SHUTDOWN_S}s of SIGTERM: {bench.shutdown_hung}")
    keep = ns.keep or bool(bench.shutdown_hung) or any(t.launcher == "elasticd" and not t.ok for t in trials)
    if keep:
        print(f"\nkept {bench.tmp}")
    else:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    return 130 if run.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())

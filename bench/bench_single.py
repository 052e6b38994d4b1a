"""Single-node benchmark: elasticd vs torchrun, side by side, interleaved.

    /work/main/.venv/bin/python bench/bench_single.py [--repeats N] [--restart-repeats M]
                                                    [--only start|restart] [--json PATH]

Scenarios (2 workers, gloo, loopback, OMP_NUM_THREADS=1 for both launchers):

  start    wall time from just before the launch command is started (``elasticctl submit`` to an
           already running, warm daemon / ``torchrun --standalone``) until the LAST rank finished
           its first all_reduce (max over ranks of ``first_collective.a0.r*``).
  restart  rank 1 crashes (``os._exit(1)``) 0.5 s after the first collective of attempt 0; time
           from its ``crash.a0`` stamp until the last rank of the next attempt finished its first
           collective. ``restart(a1)`` uses attempt 1 only (trials where attempt 1 came up on
           every rank); ``restart(recovery)`` uses the first attempt >= 1 that came up on every
           rank, so it also covers trials that needed extra restarts.

Trials alternate elasticd, torchrun, elasticd, torchrun, ... so drift (thermal, page cache,
other load) hits both launchers alike. See bench/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from harness.paths import default_bin
from harness.procs import live, own_processes, stop, sweep
from harness.runinfo import Run, installed_torch, loadavg_text, on_sigterm
from single.daemon import DaemonDied
from single.launchers import Bench
from single.report import print_samples, print_table, report_daemon_problems, summarize, write_json
from single.trial import DAEMON_SHUTDOWN_S, NPROC, Trial

__all__ = ["main", "own_processes", "sweep"]  # the soak harness imports the sweep from here


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="start trials per launcher (default 5)")
    p.add_argument("--restart-repeats", type=int, help="restart trials per launcher (default: --repeats)")
    p.add_argument("--only", choices=("start", "restart"), help="run one scenario only")
    p.add_argument("--warmup", type=int, default=1, help="untimed start trials per launcher (default 1)")
    p.add_argument("--start-timeout", type=float, default=60.0, help="per start trial (default 60 s)")
    p.add_argument(
        "--restart-timeout",
        type=float,
        default=60.0,
        help="per restart trial: the launcher must finish by then or is killed (default 60 s)",
    )
    p.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="extra elasticd flag, repeatable (e.g. --daemon-arg=--warm-pool-size=0: every start cold)",
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stamps, daemon state)")
    p.add_argument(
        "--bin",
        default=str(default_bin()),
        type=lambda text: str(Path(text).absolute()),  # the trials run in their own directories
        help="dir with elasticd, elasticctl, torchrun",
    )
    ns = p.parse_args(argv)
    if ns.restart_repeats is None:
        ns.restart_repeats = ns.repeats
    return ns


def run_trials(bench: Bench, ns: argparse.Namespace, trials: list[Trial], run: Run) -> None:
    """Every planned pair of trials (stopped by ^C, SIGTERM or a dead daemon), then the clean-up."""
    try:
        bench.start_daemon()
        plan = []
        if ns.only in (None, "start"):
            plan += [("start", 0, ns.start_timeout)] * ns.warmup
            plan += [("start", i, ns.start_timeout) for i in range(1, ns.repeats + 1)]
        if ns.only in (None, "restart"):
            plan += [("restart", i, ns.restart_timeout) for i in range(1, ns.restart_repeats + 1)]
        for scenario, index, timeout_s in plan:
            bench.run_pair(scenario, index, timeout_s, trials)
    except KeyboardInterrupt:
        run.interrupted = True
        print("\ninterrupted; cleaning up", flush=True)
    except DaemonDied as exc:
        run.aborted = str(exc)
        print(f"\n!! {exc}; stopping the run", flush=True)
    finally:
        for proc in list(live):
            stop(proc, 5)
        bench.stop_daemon()
        killed = sweep(bench.markers, wait_s=3.0)
        for line in killed:
            print(f"!! killed leftover process: {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    bench = Bench(ns)
    trials: list[Trial] = []
    started, load_before = time.time(), os.getloadavg()
    run = Run(started, load_before, installed_torch(), bench.source())
    print(f"elasticd code: {run.describe_source()}", flush=True)
    run_trials(bench, ns, trials, run)

    rows = summarize(trials)
    run.load_after = os.getloadavg()
    print(
        f"\nelasticd vs torchrun, {NPROC} workers/gloo on {os.cpu_count()} CPUs, torch {run.torch_version}, "
        f"{time.time() - run.started:.0f}s total; load average (1/5/15 min) at start "
        f"{loadavg_text(run.load_before)}, at end {loadavg_text(run.load_after)}\n"
    )
    if rows:
        print_table(rows)
        print_samples(rows)
    problems = report_daemon_problems(bench)
    if ns.json:
        write_json(ns.json, ns, bench, run, rows, trials, problems)
    if bench.shutdown_hung:
        print(f"\n!! elasticd did not exit within {DAEMON_SHUTDOWN_S}s of SIGTERM (see the stacks above)")
    elif bench.daemon is not None and bench.daemon.returncode not in (0, -signal.SIGTERM):
        print(f"\n!! elasticd exited with {bench.daemon.returncode} (see above)")
    keep = ns.keep or bench.shutdown_hung or any(t.launcher == "elasticd" and not t.ok for t in trials)
    if keep:
        print(f"\nkept {bench.tmp} (daemon log: {bench.daemon_err})")
    else:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    return 130 if run.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())

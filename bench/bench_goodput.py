"""Goodput under worker crashes: elasticd with a memory snapshot every step against torchrun with a
disk checkpoint every K steps, the same training script, side by side in one run.

    python bench/bench_goodput.py [--duration 600] [--kill-every 60] [--trials 1] [--node-kill]
                                  [--json PATH]

Both run ``goodput_job.py`` (2 gloo ranks on the CPU, DDP over a small MLP, SGD with momentum; a
step of ~50-100 ms here) on this node:

- **elasticd**: one daemon (with its etcd) started by the bench with ``--snapshot-bytes``; the
  job submitted with ``--nproc-per-node 2 --max-restarts 10000``; ``save_checkpoint`` after every
  step (a snapshot into the job's keeper, the file written behind every 10 snapshots).
- **torchrun**: ``torchrun --standalone --nproc-per-node 2 --max-restarts 10000
  --monitor-interval 0.1``; ``save_checkpoint`` (the file, fsync'd) every K steps. K is the
  smallest interval whose checkpointing costs at most 5% of step time (``save_s / K <= 0.05 *
  step_s``), from a calibration run first (torchrun, no fault: the median step and the median
  save of the same state); it is printed.

Each trial (elasticd then torchrun, interleaved over ``--trials``) starts the job, takes ``t0`` at
its first completed step, SIGKILLs one worker every ``--kill-every`` seconds (rank 1, rank 0,
rank 1, ...; a kill due while the job restarts waits for the next worker), and at ``t0 +
--duration`` asks the job to finish. From rank 0's progress log (one line per completed step):

- **steps redone per fault**: at each restart (the attempt in the log changes), the steps run
  again (the last step logged, minus the step resumed at, plus one); summed, over the faults;
- **goodput**: useful steps (the highest step reached by ``t0 + duration``, each step once) over
  the step-time capacity (``duration / step_s``, step_s from the calibration): what is lost to
  checkpointing, restarts and redone steps;
- the median **downtime** per fault (the last step logged before the resumption to the first
  after it), and the median stall of a checkpoint step.

With ``--node-kill``, a third run in each trial, **elasticd-2nodes**: the same job on two daemons
of this machine (``--nnodes 2 --nproc-per-node 1``, lease TTL 3 s), the same worker kills, and one
node SIGKILL halfway between the middle two: node 1's daemon and every process of it (its worker,
its snapshot keeper, its zygote) at once, as a power loss; its daemon starts again 1 s later,
empty (same node id and state dir), and the job resumes at 2 ranks from the snapshot node 0's
keeper holds (node 1's rank fetches it over the replication link). torchrun has no counterpart
here (``--standalone`` is one node).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from goodput.faults import end_launcher, kill_worker, read_progress, wait_first_step  # noqa: E402
from goodput.figures import (  # noqa: E402
    Calib,
    Fault,
    Line,
    Result,
    figures,
    interval,
    outside_goodput,
    render,
    schedule,
)
from goodput.launchers import Elasticd, calibrate, job_args, torchrun  # noqa: E402
from harness.procs import sweep  # noqa: E402

# the arithmetic, for its unit tests
__all__ = ["Calib", "Fault", "Line", "figures", "interval", "main", "outside_goodput", "schedule"]


def trial(ns: argparse.Namespace, name: str, run: Run, calib: Calib) -> Result:
    """Faults on a schedule from the first step, the finish at ``t0 + duration``, then the figures."""
    out = run.out
    try:
        t0 = wait_first_step(out, run.proc, 300)
        killed: set[int] = set()
        injected = 0
        for fault in run.faults:
            time.sleep(max(0.0, t0 + fault.at_s - time.time()))
            if fault.node:
                assert run.kill_node is not None
                run.kill_node(fault.target)
            injected += fault.node or kill_worker(out, fault.target, killed)
        time.sleep(max(0.0, t0 + ns.duration - time.time()))
        (out / "finish").touch()
    finally:
        end_launcher(run.proc, out)
    result = figures(name, read_progress(out), t0, ns.duration, injected, calib)
    if run.goodput is not None:
        compare(name, run, time.time())
    return result


def compare(name: str, run: Run, ended: float) -> None:
    """elasticd's own goodput beside the one measured outside it (rank 0's log, the submission to
    the launcher's exit) for the same run."""
    assert run.goodput is not None
    own = run.goodput(run.submitted)
    outside = outside_goodput(read_progress(run.out), ended - run.submitted)
    if own is None or own.get("ratio") is None:
        print(f"  {name}: elasticd reported no goodput", flush=True)
        return
    by_cause = ", ".join(f"{c} {s:.1f}" for c, s in own["by_cause_s"].items())
    print(f"  {name}: goodput elasticd {own['ratio']:.4f} of {own['wall_s']:.1f} s, outside {outside:.4f} "
          f"of {ended - run.submitted:.1f} s (difference {own['ratio'] - outside:+.4f}); "
          f"seconds by cause: {by_cause}", flush=True)  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One launched job and the faults it gets."""

    proc: subprocess.Popen[bytes]
    out: Path
    faults: list[Fault]
    kill_node: Callable[[int], None] | None = None
    submitted: float = 0.0  # just before the submission (elasticd's runs)
    goodput: Callable[[float], dict[str, Any] | None] | None = None  # elasticd's figure, asked after


def launch(ns: argparse.Namespace, name: str, out: Path, calib: Calib, clusters: dict[str, Elasticd]) -> Run:
    faults = schedule(ns.duration, ns.kill_every, node_kill=name == "elasticd-2nodes")
    if name == "torchrun":
        return Run(torchrun(job_args(ns, out, calib.every), out), out, faults)
    c = clusters[name]
    submitted = time.time()
    return Run(c.launch(job_args(ns, out, 1), out), out, faults, c.kill_node, submitted, c.goodput)


def run_trials(ns: argparse.Namespace, root: Path, calib: Calib) -> list[Result]:
    names = ["elasticd", "torchrun", *(["elasticd-2nodes"] if ns.node_kill else [])]
    clusters = {n: Elasticd(root / n, 2 if n == "elasticd-2nodes" else 1) for n in names if n != "torchrun"}
    results = []
    try:
        for c in clusters.values():
            c.start()
        for i in range(ns.trials):
            for name in names:
                out = root / f"{name}.{i}"
                out.mkdir()
                results.append(trial(ns, name, launch(ns, name, out, calib, clusters), calib))
                print(f"trial {i} {name}: {json.dumps(asdict(results[-1]))}", flush=True)
    finally:
        for c in clusters.values():
            c.stop()
        sweep([str(root), *(n for c in clusters.values() for n in c.node_ids)], wait_s=5)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=600, help="seconds of each run, from its first step")
    p.add_argument("--kill-every", type=float, default=60, help="seconds between worker SIGKILLs")
    p.add_argument("--trials", type=int, default=1, help="runs of each launcher, interleaved")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument(
        "--node-kill",
        action="store_true",
        help="also elasticd on 2 daemons (one rank each) with one node SIGKILL among the faults",
    )
    p.add_argument("--json", type=Path)
    ns = p.parse_args()
    # the job runs the submitter's `python`: this one (torch, this checkout), as in the tests
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    root = Path(tempfile.mkdtemp(prefix="elasticd-goodput-"))
    print(f"dir {root} (kept if a run fails)", flush=True)
    calib = calibrate(ns, root)
    print(f"calibration: {asdict(calib)}", flush=True)
    results = run_trials(ns, root, calib)
    shutil.rmtree(root, ignore_errors=True)
    print(render(results, calib))
    if ns.json:
        ns.json.write_text(json.dumps({"calibration": asdict(calib), "results": [asdict(r) for r in results],
                                       "duration_s": ns.duration, "kill_every_s": ns.kill_every,
                                       "load_avg": os.getloadavg()[0]}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()

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
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from bench_single import sweep  # noqa: E402

from elasticd.workers.proctree import tree as proctree  # noqa: E402
from tests.support import PYTHON, DaemonProc, EtcdServer, unique  # noqa: E402

JOB = REPO / "bench" / "goodput_job.py"
OVERHEAD = 0.05  # torchrun's checkpointing may cost this share of step time
RESTARTS = "10000"  # elasticd's most
NODE_DOWN_S = 1.0  # a node killed is back (its daemon started again) after this


@dataclass(frozen=True)
class Calib:
    step_s: float
    save_s: float
    state_bytes: int
    every: int  # torchrun's checkpoint interval K


@dataclass(frozen=True)
class Line:
    """One line of rank 0's progress log."""

    step: int
    at: float
    attempt: int
    train_s: float
    save_s: float


@dataclass(frozen=True)
class Fault:
    """One fault of a trial's schedule."""

    at_s: float  # after the trial's first step
    node: bool  # a node SIGKILL (its daemon and every process of it), else a worker's
    target: int  # the worker's rank, or the node's index


@dataclass(frozen=True)
class Result:
    launcher: str
    faults: int
    useful_steps: int
    capacity_steps: float
    goodput: float
    resumptions: int
    redone: int
    redone_per_fault: float
    redone_max: int
    downtime_median_s: float | None
    save_stall_median_s: float | None
    train_median_s: float
    goodput_own: float  # useful steps over the run's own capacity (duration / its median step): load aside
    redone_each: list[int]  # per resumption, in order
    downtimes_s: list[float]


def job_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")


def job_args(ns: argparse.Namespace, out: Path, every: int) -> list[str]:
    return [str(JOB), "--out", str(out), "--every", str(every), "--hidden", str(ns.hidden),
            "--batch", str(ns.batch)]  # fmt: skip


def torchrun(argv: list[str], out: Path) -> subprocess.Popen[bytes]:
    log = open(out / "launcher.log", "ab")  # noqa: SIM115 (the child holds it)
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", RESTARTS, "--monitor-interval", "0.1", *argv]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=job_env(), cwd=out, start_new_session=True)
    log.close()
    return proc


def calibrate(ns: argparse.Namespace, root: Path) -> Calib:
    out = root / "calibrate"
    out.mkdir()
    proc = torchrun([*job_args(ns, out, 1), "--calibrate", "40"], out)
    if proc.wait(300) != 0:
        raise SystemExit(f"calibration failed: {(out / 'launcher.log').read_text()[-3000:]}")
    c = json.loads((out / "calib.json").read_text())
    return Calib(c["step_s"], c["save_s"], int(c["state_bytes"]), interval(c["save_s"], c["step_s"]))


def interval(save_s: float, step_s: float) -> int:
    """The smallest K whose checkpoint every K steps costs at most ``OVERHEAD`` of step time."""
    return max(1, math.ceil(save_s / (OVERHEAD * step_s) - 1e-9))


class Elasticd:
    """The daemons (1, or 2 for the node kill: one rank each) and their etcd, for every elasticd trial."""

    def __init__(self, root: Path, nodes: int) -> None:
        self.root = root
        self.node_ids = [unique("goodput") for _ in range(nodes)]
        self.etcd = EtcdServer(root / "etcd")
        self.daemons: list[DaemonProc] = []

    def start(self) -> None:
        self.etcd.start()
        flags = ["--etcd-endpoints", self.etcd.endpoint, "--etcd-prefix", f"/b/{unique('p')}",
                 "--slots", "2", "--snapshot-bytes", str(512 << 20), "--address", "127.0.0.1",
                 "--lease-ttl", "3"]  # fmt: skip
        for i, node in enumerate(self.node_ids):
            self.daemons.append(DaemonProc(node, self.root / f"node{i}", flags, dict(os.environ)))
            self.daemons[-1].start()

    def stop(self) -> None:
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.stop()
        self.etcd.stop()

    def launch(self, argv: list[str], out: Path) -> subprocess.Popen[bytes]:
        log = open(out / "launcher.log", "ab")  # noqa: SIM115 (the child holds it)
        n = len(self.daemons)
        shape = ["--nproc-per-node", "2"] if n == 1 else ["--nnodes", str(n), "--nproc-per-node", "1"]
        cmd = [PYTHON, "-m", "elasticctl", "submit", *shape, "--max-restarts", RESTARTS,
               "--max-same-failures", "0",
               "--cwd", str(out), "--follow", *argv[:1], "--", *argv[1:]]  # fmt: skip
        env = job_env() | {"ELASTICD_SOCKET": str(self.daemons[0].socket)}
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, cwd=out, start_new_session=True)
        log.close()
        return proc

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i`` whole (its daemon, workers, keeper, zygote: as a power loss), then
        start its daemon again (same node id and state dir: the node back, empty)."""
        d = self.daemons[i]
        assert d.proc is not None
        procs = [psutil.Process(d.proc.pid)]
        with contextlib.suppress(psutil.Error):
            procs += procs[0].children(recursive=True)
        procs += proctree.marked(d.node_id)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        time.sleep(NODE_DOWN_S)
        d.start()


def read_progress(out: Path) -> list[Line]:
    lines = []
    with contextlib.suppress(FileNotFoundError):
        for text in (out / "progress").read_text().splitlines():
            parts = text.split()
            if len(parts) == 5:
                lines.append(Line(int(parts[0]), float(parts[1]), int(parts[2]), float(parts[3]),
                                  float(parts[4])))  # fmt: skip
    return lines


def wait_first_step(out: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = read_progress(out)
        if lines:
            return lines[0].at
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"no first step: {(out / 'launcher.log').read_text()[-3000:]}")


def live_worker(out: Path, rank: int, killed: set[int]) -> int | None:
    """The pid rank ``rank``'s current worker wrote, if that process lives and was not killed already."""
    try:
        pid, ticks = (int(v) for v in (out / f"pid.{rank}").read_text().split())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    alive = int(stat[stat.rindex(")") + 2 :].split()[19]) == ticks  # the same process, not a reused pid
    return pid if alive and pid not in killed else None


def kill_worker(out: Path, rank: int, killed: set[int], timeout_s: float = 60) -> bool:
    """SIGKILL rank ``rank``'s worker (waiting for one that lives); False if none came up."""
    deadline = time.monotonic() + timeout_s
    while (pid := live_worker(out, rank, killed)) is None:
        if time.monotonic() > deadline:
            print(f"  no live worker of rank {rank} for {timeout_s:.0f} s: fault skipped", flush=True)
            return False
        time.sleep(0.05)
    killed.add(pid)
    os.kill(pid, signal.SIGKILL)
    return True


def end_launcher(proc: subprocess.Popen[bytes], out: Path, timeout_s: float = 120) -> None:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    sweep([str(out)], wait_s=10)


def schedule(duration_s: float, kill_every_s: float, node_kill: bool) -> list[Fault]:
    """A worker SIGKILL every ``kill_every_s`` (rank 1, 0, 1, ...) before the end; with
    ``node_kill``, one node SIGKILL (node 1) halfway between the middle two."""
    faults = []
    k = 1
    while k * kill_every_s < duration_s:
        faults.append(Fault(k * kill_every_s, False, k % 2))
        k += 1
    if node_kill:
        at = (len(faults) // 2 + 0.5) * kill_every_s
        faults.append(Fault(at if at < duration_s else duration_s / 2, True, 1))
    return sorted(faults, key=lambda f: f.at_s)


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
    return figures(name, read_progress(out), t0, ns.duration, injected, calib)


def figures(name: str, lines: list[Line], t0: float, duration: float, faults: int, calib: Calib) -> Result:
    t_end = t0 + duration
    window = [ln for ln in lines if ln.at <= t_end]
    useful = max(ln.step for ln in window) - window[0].step
    redone, downtimes = [], []
    for prev, cur in itertools.pairwise(lines):
        if cur.attempt != prev.attempt:  # a restart: the steps since the restored one run again
            redone.append(max(0, prev.step - cur.step + 1))
            downtimes.append(cur.at - prev.at)
    saves = [ln.save_s for ln in lines if ln.save_s > 0.0005]
    capacity = duration / calib.step_s
    train = statistics.median(ln.train_s for ln in lines)
    return Result(
        redone_each=redone, downtimes_s=[round(d, 3) for d in downtimes],
        launcher=name, faults=faults, useful_steps=useful, capacity_steps=round(capacity, 1),
        goodput=round(useful / capacity, 4), resumptions=len(redone), redone=sum(redone),
        redone_per_fault=round(sum(redone) / max(1, faults), 2), redone_max=max(redone, default=0),
        downtime_median_s=round(statistics.median(downtimes), 3) if downtimes else None,
        save_stall_median_s=round(statistics.median(saves), 4) if saves else None,
        train_median_s=round(train, 4), goodput_own=round(useful * train / duration, 4),
    )  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One launched job and the faults it gets."""

    proc: subprocess.Popen[bytes]
    out: Path
    faults: list[Fault]
    kill_node: Callable[[int], None] | None = None


def launch(ns: argparse.Namespace, name: str, out: Path, calib: Calib, clusters: dict[str, Elasticd]) -> Run:
    faults = schedule(ns.duration, ns.kill_every, node_kill=name == "elasticd-2nodes")
    if name == "torchrun":
        return Run(torchrun(job_args(ns, out, calib.every), out), out, faults)
    c = clusters[name]
    return Run(c.launch(job_args(ns, out, 1), out), out, faults, c.kill_node)


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


def render(results: list[Result], calib: Calib) -> str:
    rows = [("", "faults", "useful/capacity", "goodput", "redone/fault", "max", "downtime", "step",
             "ckpt stall")]  # fmt: skip
    for r in results:
        rows.append((r.launcher, str(r.faults), f"{r.useful_steps}/{r.capacity_steps:.0f}",
                     f"{r.goodput:.3f}", f"{r.redone_per_fault:.2f}", str(r.redone_max),
                     f"{r.downtime_median_s} s", f"{r.train_median_s} s",
                     f"{r.save_stall_median_s} s"))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) + 2 for i in range(len(rows[0]))]
    text = "\n".join("".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    head = (f"step {calib.step_s * 1000:.1f} ms, state {calib.state_bytes / 2**20:.1f} MiB per rank, "
            f"a disk save {calib.save_s * 1000:.1f} ms: torchrun checkpoints every K={calib.every} "
            "steps")  # fmt: skip
    return head + "\n" + text


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

"""What a straggler costs, and what ``--stragglers drain`` wins back: a 3-node elastic job
(``--nnodes 2:3``, one rank per node, synchronous DDP on gloo: ``tests/scripts/ddp_steady.py``,
a plain torchrun script) on 3 daemons sharing the bench's etcd; once it runs at world 3, one
non-leader node's rank is stopped half of every 200 ms from outside for ``--slow`` seconds. Steps
done over that window, ``--stragglers report`` against ``drain`` (the daemons'
``straggler_grace``: ``--grace``), interleaved; and the steps a healthy window of the same length
does, for the floor. Steps are counted across rounds (a new round starts the script again).

    python bench/bench_straggler_goodput.py --slow 120 --repeats 1 --grace 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.paths import default_bin
from harness.procs import sweep
from multi.daemon import Daemon, running

from elasticd.etcd.embedded import EmbeddedEtcd

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "scripts" / "ddp_steady.py"


class Counter(threading.Thread):
    """Rank 0's steps, summed across rounds (its count restarts with each new round)."""

    def __init__(self, out: Path) -> None:
        super().__init__(daemon=True)
        self.out, self.total, self.last, self.done = out, 0, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            with contextlib.suppress(FileNotFoundError, ValueError):
                now = int((self.out / "steps.0").read_text() or 0)
                self.total += now - self.last if now >= self.last else now
                self.last = now


def duty_cycle(pid: int, done: threading.Event) -> None:
    with contextlib.suppress(ProcessLookupError):
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(0.1)
            os.kill(pid, signal.SIGCONT)
            done.wait(0.1)


def members(d: Daemon, job: str) -> list[dict[str, object]]:
    return list(d.status(job).get("members") or [])


def trial(ds: list[Daemon], out: Path, policy: str | None, slow_s: float) -> int:
    """Steps done over ``slow_s`` with one node slowed (``policy`` None: none slowed)."""
    argv = ["submit", "--nnodes", "2:3", "--last-call", "2", "--env", f"OUT={out}", "--env", "STEPS_FILE=1"]
    argv += ["--python", sys.executable, "--stragglers", policy or "report", str(SCRIPT)]
    job = ds[0].ctl(*argv, timeout_s=60).stdout.splitlines()[0].strip()
    deadline = time.monotonic() + 120
    while len(members(ds[0], job)) < 3 or not (out / "pid.2").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the job did not reach world 3")
        time.sleep(0.2)
    time.sleep(3)  # past the first steps
    counter, done = Counter(out), threading.Event()
    counter.start()
    slowed = threading.Thread(target=duty_cycle, args=(int((out / "pid.2").read_text()), done), daemon=True)
    if policy is not None:
        slowed.start()
    time.sleep(slow_s)
    done.set()
    counter.done.set()
    counter.join()
    (out / "stop").touch()
    ds[0].ctl("kill", job, timeout_s=60)
    return counter.total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slow", type=float, default=300.0, help="seconds the node is slowed")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--grace", type=float, default=60.0, help="the daemons' straggler_grace")
    ap.add_argument("--bin", default=str(default_bin()))
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="elasticd-bench-sg-"))
    etcd = EmbeddedEtcd(tmp / "etcd")
    etcd.start()
    env = {"PATH": f"{ns.bin}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    env["ELASTICD_STRAGGLER_GRACE"] = str(ns.grace)  # a daemon setting, from the daemons' environment
    nodes = [
        Daemon(Path(ns.bin), env, etcd.endpoint, tmp / f"d{i}", f"sg-{i}", "/bench/sg") for i in range(3)
    ]
    results: dict[str, list[int]] = {"healthy": [], "report": [], "drain": []}
    try:
        with running(nodes) as ds:
            for i in range(ns.repeats):
                for label, policy in (("healthy", None), ("report", "report"), ("drain", "drain")):
                    out = tmp / f"{label}-{i}"
                    out.mkdir()
                    results[label].append(trial(ds, out, policy, ns.slow))
                    print(f"{label:>8} trial {i}: {results[label][-1]} steps in {ns.slow:.0f} s", flush=True)
    finally:
        etcd.stop()
        sweep([str(tmp)])
    print(json.dumps({k: v for k, v in results.items()}))


if __name__ == "__main__":
    main()

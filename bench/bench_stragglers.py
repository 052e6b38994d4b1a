"""Stragglers: what the daemon's looks at each rank's main thread cost the job, and how soon they
name a rank slowed from outside (and never a healthy one).

A plain 2-rank DDP job on gloo (``tests/scripts/ddp_steady.py``, no call into elasticd) runs under
torchrun; the bench runs the daemon's own sampler (``progress.threadstate.ActivitySampler``, 20 Hz)
and judge (``progress.slowness``: scores every 5 s, as group rank 0's node does) against its ranks:

- ``overhead``: steps per second with the sampler looking and without, in interleaved periods of
  ``--period`` seconds; medians and their ratio. Nothing runs in the workers: this is what reading
  ``/proc`` from outside costs them.
- ``healthy``: ``--healthy`` seconds of the job as it is: ranks named (false positives; want 0).
- ``loaded``: as long again with three CPU hogs on the host: ranks named with the node's waits
  for a CPU pooled (want none), and, from the same looks, without pooling.
- ``detect``: rank 1 slowed from outside by a SIGSTOP duty cycle, stopped half of every 200 ms
  (``stop-half``), then a sixth of it (``stop-sixth``, about 20% slower); and held to a fifth of a
  core by a cgroup CPU quota (``quota``): seconds until it is named, and whether rank 0 ever was.
  In the daemon, add up to 10 s for the reports' publication (the judge compares windows that end
  on the same 5 s boundary on every node).

The two ranks run on this one host, and the judge sees them as the daemon sees a 2-rank job's
ranks on one node: their waits for a CPU pooled (``slowness.pool``); for ``quota`` it sees each
rank as a node of its own (a 2-node job, one rank each, one node's workers under the quota: a
quota on one of a node's ranks alone is shared with its node's other ranks). A slow link is
``bench_straggler_link.py`` (network namespaces).

    python bench/bench_stragglers.py --period 10 --rounds 4 --healthy 120
    python bench/bench_stragglers.py --kinds quota
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticd.progress.slowness import Verdicts, judge, scores  # noqa: E402
from elasticd.progress.threadstate import ActivitySampler  # noqa: E402
from tests.slowdowns import cpu_hogs, cpu_quota  # noqa: E402

SCRIPT = REPO / "tests" / "scripts" / "ddp_steady.py"
EVALUATE_S = 5.0


def start_job(out: Path) -> subprocess.Popen[bytes]:
    torchrun = Path(sys.executable).parent / "torchrun"
    env = dict(os.environ, OUT=str(out), STEPS_FILE="1")
    return subprocess.Popen(
        [str(torchrun), "--nproc-per-node", "2", str(SCRIPT)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def wait_pids(out: Path, timeout_s: float = 120, ranks: int = 2) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return [int((out / f"pid.{r}").read_text()) for r in range(ranks)]
        except (FileNotFoundError, ValueError):
            time.sleep(0.2)
    raise TimeoutError("the job's ranks did not start")


def steps(out: Path) -> int:
    try:
        return int((out / "steps.0").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def rate(out: Path, seconds: float) -> float:
    s0, t0 = steps(out), time.monotonic()
    time.sleep(seconds)
    return (steps(out) - s0) / (time.monotonic() - t0)


def overhead(out: Path, pids: list[int], period: float, rounds: int) -> tuple[float, float]:
    on, off = [], []
    for _ in range(rounds):
        off.append(rate(out, period))
        sampler = ActivitySampler(list(enumerate(pids)))
        sampler.start()
        on.append(rate(out, period))
        sampler.close()
    return statistics.median(on), statistics.median(off)


class DutyCycle(threading.Thread):
    def __init__(self, pid: int, stopped_s: float, period_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.stopped_s, self.period_s = pid, stopped_s, period_s
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self.done.wait(self.stopped_s)
            os.kill(self.pid, signal.SIGCONT)
            self.done.wait(self.period_s - self.stopped_s)


def watch(
    pids: list[int], seconds: float, until_named: int | None, one_node: bool = True
) -> tuple[float | None, set[int]]:
    """Sample and judge for ``seconds`` (or until ``until_named`` is named): when it was, and every
    rank named. ``one_node``: the ranks pool their waits for a CPU, as one node's do."""
    sampler = ActivitySampler(list(enumerate(pids)))
    sampler.start()
    v, named, start = Verdicts(), set(), time.monotonic()
    try:
        while (now := time.monotonic()) - start < seconds:
            time.sleep(EVALUATE_S)
            if one_node:
                evidence = sampler.evidence_all()[1]
            else:
                evidence = {r: e for r in (0, 1) if (e := sampler.evidence(r)) is not None}
            v, changes = judge(v, scores(evidence), now)
            named |= {c.rank for c in changes if c.straggler}
            if until_named is not None and until_named in named:
                return time.monotonic() - start, named
    finally:
        sampler.close()
    return None, named


def detect(pids: list[int], stopped_s: float, limit_s: float) -> tuple[float | None, set[int]]:
    cycle = DutyCycle(pids[1], stopped_s)
    cycle.start()
    try:
        return watch(pids, limit_s, until_named=1)
    finally:
        cycle.done.set()
        cycle.join()
        os.kill(pids[1], signal.SIGCONT)


def loaded(pids: list[int], seconds: float, hogs: int) -> list[tuple[set[int], float]]:
    """``seconds`` of the healthy job with ``hogs`` CPU hogs on the host: the ranks named, and
    the lowest score, with their waits for a CPU pooled (as the daemon judges one node's ranks)
    and, from the same looks, without."""
    sampler = ActivitySampler(list(enumerate(pids)))
    sampler.start()
    verdicts, start = [Verdicts(), Verdicts()], time.monotonic()
    out: list[tuple[set[int], float]] = [(set(), 1.0), (set(), 1.0)]
    try:
        with cpu_hogs(hogs):
            while (now := time.monotonic()) - start < seconds:
                time.sleep(EVALUATE_S)
                each = {r: e for r in (0, 1) if (e := sampler.evidence(r)) is not None}
                for i, evidence in enumerate((sampler.evidence_all()[1], each)):
                    current = scores(evidence)
                    verdicts[i], said = judge(verdicts[i], current, now)
                    low = min(current.values(), default=1.0)
                    out[i] = (out[i][0] | {c.rank for c in said if c.straggler}, min(out[i][1], low))
    finally:
        sampler.close()
    return out


def detect_quota(pids: list[int], share: float, limit_s: float) -> tuple[float | None, set[int]]:
    with cpu_quota([pids[1]], share):
        return watch(pids, limit_s, until_named=1, one_node=False)


KINDS = ("overhead", "healthy", "loaded", "stop-half", "stop-sixth", "quota")


def measure(kind: str, out: Path, pids: list[int], ns: argparse.Namespace) -> None:
    match kind:
        case "overhead":
            with_it, without = overhead(out, pids, ns.period, ns.rounds)
            print(
                f"overhead: {with_it:.1f} steps/s sampled, {without:.1f} not: ratio {with_it / without:.3f}"
            )
        case "healthy":
            _, named = watch(pids, ns.healthy, None)
            print(f"healthy: {ns.healthy:.0f} s watched, ranks named: {sorted(named) or 'none'}")
        case "loaded":
            (pooled, low), (alone, low_alone) = loaded(pids, ns.healthy, 3)
            print(f"loaded (3 CPU hogs), {ns.healthy:.0f} s: named {sorted(pooled)} (lowest score {low}),")
            print(f"  unpooled: named {sorted(alone)} (lowest score {low_alone})")
            time.sleep(30)  # the window forgets the load before the next
        case "stop-half" | "stop-sixth" | "quota":
            if kind == "quota":
                took, named = detect_quota(pids, 0.2, 300)
            else:
                took, named = detect(pids, 0.1 if kind == "stop-half" else 0.2 / 6, 300)
            said = "not named" if took is None else f"named after {took:.0f} s"
            print(f"detect, {kind}: rank 1 {said}; ranks named: {sorted(named)}", flush=True)
            time.sleep(30)  # the window forgets the slowdown before the next


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--period", type=float, default=10.0, help="seconds per overhead period")
    ap.add_argument("--rounds", type=int, default=4, help="overhead periods of each kind")
    ap.add_argument("--healthy", type=float, default=120.0, help="seconds of the healthy job watched")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"what to measure, of {', '.join(KINDS)}")
    ns = ap.parse_args()
    kinds = ns.kinds.split(",")
    if not set(kinds) <= set(KINDS):
        ap.error(f"--kinds: one or more of {', '.join(KINDS)}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        job = start_job(out)
        try:
            pids = wait_pids(out)
            time.sleep(3)
            for kind in kinds:
                measure(kind, out, pids, ns)
        finally:
            (out / "stop").touch()
            try:
                job.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()


if __name__ == "__main__":
    main()

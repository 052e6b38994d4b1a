"""bench_goodput's arithmetic: torchrun's checkpoint interval, the fault schedule, the figures
from rank 0's progress log, and their table."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

OVERHEAD = 0.05  # torchrun's checkpointing may cost this share of step time


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


def interval(save_s: float, step_s: float) -> int:
    """The smallest K whose checkpoint every K steps costs at most ``OVERHEAD`` of step time."""
    return max(1, math.ceil(save_s / (OVERHEAD * step_s) - 1e-9))


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


def outside_goodput(lines: list[Line], wall_s: float) -> float:
    """Goodput as elasticd defines it, measured from rank 0's log alone: the time between two
    reports of the same attempt, the second a step never reached before, less the save that
    followed the first (a step is reported before its save: ``at - save_s``), over the wall time
    from the submission to the launcher's exit."""
    productive, kept = 0.0, -1
    for prev, cur in itertools.pairwise(lines):
        if cur.attempt == prev.attempt and cur.step > kept:
            productive += (cur.at - cur.save_s) - (prev.at - prev.save_s) - prev.save_s
        kept = max(kept, prev.step, cur.step)
    return productive / wall_s if wall_s > 0 else 0.0


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

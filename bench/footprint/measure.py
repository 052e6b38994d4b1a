"""CPU time, wake-ups and memory of the daemon and its reaper, sampled with psutil and /proc."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MB = 1024 * 1024


@dataclass
class CpuSample:
    phase: str
    seconds: float
    daemon_pct: float
    reaper_pct: float
    daemon_threads: int
    wakeups: dict[str, float] = field(default_factory=dict)  # thread name -> voluntary switches/s


@dataclass
class MemSample:
    phase: str
    daemon: dict[str, float]
    reaper: dict[str, float]

    @property
    def total_rss_mb(self) -> float:
        return self.daemon["rss_mb"] + self.reaper["rss_mb"]


def _cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _switches(pid: int) -> dict[str, tuple[str, int]]:
    """tid -> (kernel thread name, voluntary context switches so far)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # the thread ended
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        out[task.name] = (fields["Name"].strip(), int(fields["voluntary_ctxt_switches"]))
    return out


def _python_thread_names(pid: int) -> dict[str, str]:
    """tid -> Python thread name, from ``py-spy dump`` (empty if py-spy cannot attach)."""
    py_spy = Path(sys.executable).parent / "py-spy"
    try:
        out = subprocess.run([str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {}
    for line in out.splitlines():
        words = line.split('"')
        if line.startswith("Thread ") and len(words) >= 2:
            names[line.split()[1]] = words[1]
    return names


def measure_cpu(phase: str, daemon: Any, reaper: Any, seconds: float) -> CpuSample:
    d0, r0, t0, s0 = _cpu_s(daemon), _cpu_s(reaper), time.monotonic(), _switches(daemon.pid)
    time.sleep(seconds)
    d1, r1, t1, s1 = _cpu_s(daemon), _cpu_s(reaper), time.monotonic(), _switches(daemon.pid)
    wall = t1 - t0
    names = _python_thread_names(daemon.pid)
    wakeups = {
        f"{names.get(tid, comm)}[{tid}]": (n - s0.get(tid, (comm, 0))[1]) / wall
        for tid, (comm, n) in s1.items()
    }
    return CpuSample(
        phase, wall, 100 * (d1 - d0) / wall, 100 * (r1 - r0) / wall, daemon.num_threads(), wakeups
    )


def _mem(proc: Any) -> dict[str, float]:
    m = proc.memory_full_info()
    return {"rss_mb": m.rss / MB, "uss_mb": m.uss / MB, "pss_mb": m.pss / MB}


def measure_mem(phase: str, daemon: Any, reaper: Any) -> MemSample:
    return MemSample(phase, _mem(daemon), _mem(reaper))

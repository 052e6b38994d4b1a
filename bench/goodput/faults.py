"""A running job of bench_goodput: rank 0's progress log, its workers' kills, and its end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from harness.procs import sweep

from goodput.figures import Line


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
